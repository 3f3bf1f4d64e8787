"""Keep params.yaml in the form DVC writes back, so `dvc exp run <stage> -S key=value` changes one line.

    python scripts/params_form.py           rewrite params.yaml into that form (values and comments kept)
    python scripts/params_form.py --check   exit 1 when DVC's writer would change params.yaml

`dvc exp run -S` rewrites params.yaml with DVC's own function, ``dvc.utils.hydra.apply_overrides``: a ruamel
round trip (``dvc.utils.serialize.modify_yaml``) in which every list is replaced by a plain list. So, in
the form it keeps: lists in block style (one item a line), mappings whose one-line form passes 80 columns in
block style (DVC wraps longer lines), null written as nothing (``key:``), and no comment inside a list or
right after a list's last item (DVC drops those; a comment on the list's own key line is kept). A file
already in that form comes back byte for byte, and one override changes one line
(tests/unit/test_params_form.py).
"""
from __future__ import annotations

import argparse
import difflib
import io
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "params.yaml"
#: DVC's YAML writer's line width (ruamel's default); a longer one-line mapping is wrapped, so written in block
WIDTH = 80
#: the column the file's end-of-line comments start at
COMMENT_COLUMN = 28


def dvc_write(text: str, overrides: list[str] | None = None) -> str:
    """``text`` as params.yaml after ``dvc exp run -S <override>...`` (DVC's own writer, on a copy)."""
    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(text)
        apply_overrides(path, list(overrides or []))
        return path.read_text()


def _plain(node):
    if isinstance(node, dict):
        return {k: _plain(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_plain(v) for v in node]
    return node


def _flow_width(node) -> int:
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.default_flow_style = True
    yaml.width = 10**6
    out = io.StringIO()
    yaml.dump(_plain(node), out)
    return len(out.getvalue().strip())


def _block_style(node, indent: int = 0) -> None:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedSeq):
        node.fa.set_block_style()
        for item in node:
            if isinstance(item, CommentedMap):
                item.fa.set_block_style()
            _block_style(item, indent + 2)
    elif isinstance(node, CommentedMap):
        for key, value in node.items():
            if isinstance(value, CommentedMap) and value.fa.flow_style() \
                    and indent + len(str(key)) + 2 + _flow_width(value) > WIDTH:
                value.fa.set_block_style()
            _block_style(value, indent + 2)


def normalize(text: str) -> str:
    """``text`` in the form DVC writes back: lists and over-long one-line mappings in block style, then
    DVC's writer; a comment left far right by a value turned block moves back to the usual column."""
    from dvc.utils.serialize._yaml import _dump, parse_yaml_for_update

    data = parse_yaml_for_update(text, "params.yaml")
    _block_style(data)
    out = io.StringIO()
    _dump(data, out)
    lines = []
    for line in out.getvalue().splitlines():
        m = re.match(r"^(\s*[^#\s][^#]*?:)( {2,})(#.*)$", line)
        if m and len(m.group(1)) + len(m.group(2)) > COMMENT_COLUMN + 2:
            line = m.group(1).ljust(max(COMMENT_COLUMN - 2, len(m.group(1)) + 1)) + "  " + m.group(3)
        lines.append(line)
    return "\n".join(lines) + "\n"


def differences(text: str) -> list[str]:
    """What DVC's writer would change in ``text`` (a unified diff's lines; empty: nothing)."""
    return list(difflib.unified_diff(text.splitlines(), dvc_write(text).splitlines(), "params.yaml (now)",
                                     "params.yaml (as dvc exp run -S writes it)", lineterm="", n=1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check that params.yaml is in DVC's form")
    parser.add_argument("--path", type=Path, default=PARAMS, help="the parameters file (default: params.yaml)")
    args = parser.parse_args(argv)
    text = args.path.read_text()
    if not args.check:
        text = normalize(text)
        args.path.write_text(text)
    diff = differences(text)
    if diff:
        print(f"{args.path.name}: `dvc exp run -S` would rewrite these lines (a comment inside a list or right "
              "after its last item is dropped: move it above the list's key, or put a key that is not a list "
              "last):\n" + "\n".join(diff[:60]), file=sys.stderr)
        return 1
    print(f"{args.path.name} is in the form `dvc exp run -S` writes back: one override changes one line")
    return 0


if __name__ == "__main__":
    sys.exit(main())
