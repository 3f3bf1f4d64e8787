"""Executed notebooks as HTML pages that open offline (nbconvert's HTMLExporter, JupyterLab's look).

nbconvert's ``lab`` template loads require.js, MathJax, Mermaid and the widget manager from CDNs; the
template below is ``lab`` with those four blocks left empty, so a page has no ``<script src>`` and
nothing to fetch: its CSS is inlined and the notebook's figures are already base64 in its outputs.
Markdown math shows as its TeX source; widget outputs as their text form.

    python scripts/notebook_html.py reports/perm/fig1_synthetic.ipynb out.html
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

#: ``lab`` without the blocks that fetch scripts from the network
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


def exporter():
    """An HTMLExporter with the offline template (built once per page build: it compiles the template)."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(extra_loaders=[DictLoader({"offline.html.j2": OFFLINE_TEMPLATE})],
                        template_file="offline.html.j2")


def to_html(ipynb: Path, html_exporter=None) -> str:
    """The page of the executed notebook ``ipynb``."""
    import nbformat

    notebook = nbformat.read(ipynb, as_version=4)
    notebook.metadata.pop("widgets", None)  # widget state would only load the widget manager from a CDN
    body, _ = (html_exporter or exporter()).from_notebook_node(notebook, resources={"metadata": {"name": ipynb.stem}})
    return body


def render_tree(pairs: list[tuple[Path, Path]], folder: Path) -> None:
    """Write each (ipynb, html) pair, every html inside ``folder``, which is rebuilt whole: built beside it
    (``<folder>.part``) and swapped in, so it holds exactly the pages of the notebooks given, never a stale one."""
    part = folder.with_name(folder.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    html_exporter = exporter()
    for ipynb, html in pairs:
        target = part / html.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(to_html(ipynb, html_exporter))
    shutil.rmtree(folder, ignore_errors=True)
    part.rename(folder)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    Path(sys.argv[2]).write_text(to_html(Path(sys.argv[1])))
