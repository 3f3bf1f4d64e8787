"""Executed notebooks as HTML pages that open offline (nbconvert's HTMLExporter, JupyterLab's look).

nbconvert's ``lab`` template loads require.js, MathJax, Mermaid and the widget manager from CDNs and
inlines JupyterLab's 250 KB stylesheet into every page. The template below is ``lab`` with those four
script blocks left empty and the stylesheet linked instead: ``render_tree`` writes it once per folder
(``notebook.css``), each page links it by a relative path. A page has no ``<script src>`` and nothing to
fetch; the notebook's figures are already base64 in its outputs. Markdown math shows as its TeX source;
widget outputs as their text form.

    python scripts/notebook_html.py reports/perm/fig1_synthetic.ipynb out.html   (the stylesheet inlined)
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: the stylesheet every page of a folder links (``render_tree``)
STYLESHEET = "notebook.css"
#: ``lab`` without the blocks that fetch scripts from the network; its stylesheet linked (``resources.stylesheet``)
#: or, without one, inlined; the small rules of lab's own <style> block that matter on screen
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block notebook_css -%}
{%- if resources.stylesheet -%}
<link rel="stylesheet" href="{{ resources.stylesheet }}">
{%- else -%}
{{ resources.include_css("static/index.css") }}{{ resources.include_css("static/theme-light.css") }}
{%- endif %}
<style>a.anchor-link{display:none}.jp-Collapser{display:none}.jp-InputArea{overflow:hidden}
.jp-InputArea-editor{overflow:hidden}.jp-OutputArea-output pre{line-height:inherit;font-family:inherit}
.cm-editor.cm-s-jupyter .highlight pre{padding:var(--jp-code-padding) 4px;margin:0;font-family:inherit;
font-size:inherit;line-height:inherit;color:inherit}
.jp-RenderedText pre{color:var(--jp-content-font-color1);font-size:var(--jp-code-font-size)}</style>
{%- endblock notebook_css -%}
"""


def exporter():
    """An HTMLExporter with the offline template (built once per page build: it compiles the template)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
                        template_file="offline.html.j2")


def stylesheet(html_exporter) -> str:
    """JupyterLab's light stylesheet, as the ``lab`` template inlines it (static/index.css + theme-light.css)."""
    for folder in map(Path, html_exporter.template_paths):
        if folder.name == "lab" and (folder / "static" / "index.css").is_file():
            return "".join((folder / "static" / f).read_text() for f in ("index.css", "theme-light.css"))
    raise FileNotFoundError(f"nbconvert's lab/static/index.css is not in {html_exporter.template_paths}")


def to_html(ipynb: Path, html_exporter=None, stylesheet_href: str | None = None) -> str:
    """The page of the executed notebook ``ipynb``: its stylesheet linked at ``stylesheet_href`` (relative to
    the page), or inlined when None."""
    import nbformat

    notebook = nbformat.read(ipynb, as_version=4)
    notebook.metadata.pop("widgets", None)  # widget state would only load the widget manager from a CDN
    resources = {"metadata": {"name": ipynb.stem}, "stylesheet": stylesheet_href}
    body, _ = (html_exporter or exporter()).from_notebook_node(notebook, resources=resources)
    return body


def render_tree(pairs: list[tuple[Path, Path]], folder: Path) -> None:
    """Write each (ipynb, html) pair, every html inside ``folder``, with ``folder/notebook.css`` that they link.
    ``folder`` is rebuilt whole: built beside it (``<folder>.part``) and swapped in, so it holds exactly the
    pages of the notebooks given, never a stale one."""
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    html_exporter = exporter()
    (part / STYLESHEET).write_text(stylesheet(html_exporter))
    for ipynb, html in pairs:
        target = part / html.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        href = Path(os.path.relpath(part / STYLESHEET, target.parent)).as_posix()
        target.write_text(to_html(ipynb, html_exporter, href))
    shutil.rmtree(folder, ignore_errors=True)
    part.rename(folder)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: python scripts/notebook_html.py NOTEBOOK.ipynb PAGE.html")
    Path(sys.argv[2]).write_text(to_html(Path(sys.argv[1])))
