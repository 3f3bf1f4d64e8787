"""README numbers come from results files, never typed: each block

    <!-- BEGIN path/to/file.md -->
    ...
    <!-- END path/to/file.md -->

holds the file's content verbatim. ``python scripts/readme_blocks.py`` refills every block from its
file; ``--check`` only reports blocks that differ (tests/unit/test_readme_blocks.py runs it).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- BEGIN (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- END (?P=path) -->)", re.S)


def filled(text: str, root: Path = ROOT) -> str:
    def fill(m: re.Match) -> str:
        source = root / m["path"]
        if not source.exists():
            raise FileNotFoundError(f"README block names {m['path']}, which does not exist")
        body = source.read_text()
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)
    return BLOCK.sub(fill, text)


def main(argv: list[str]) -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = filled(text)
    if "--check" in argv:
        stale = [m["path"] for m in BLOCK.finditer(text) if m.group(0) not in new]
        if stale:
            print(f"README blocks out of date with {stale}: run python scripts/readme_blocks.py", file=sys.stderr)
            return 1
        return 0
    if new != text:
        readme.write_text(new)
        print("README.md: blocks refilled")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
