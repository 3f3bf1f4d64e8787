"""README's and docs/'s numbers come from results files, never typed: each block

    <!-- BEGIN path/to/file.md -->
    ...
    <!-- END path/to/file.md -->

holds the file's content verbatim. ``python scripts/readme_blocks.py`` refills every block of README.md
and docs/*.md from its file; ``--check`` only reports blocks that differ (tests/unit/test_readme_blocks.py
runs it).

A block may name a DVC output (``results/claims.md``, written by ``dvc repro``): where the file is not
there (a fresh clone before ``dvc repro`` or ``dvc pull``), the block is checked against the md5 that
dvc.lock records for it (or a profile pipeline's, ``pipelines/<profile>/dvc.lock``: ``build/paper/claims.md``), so
the README still shows exactly what the recorded pipeline produced.
"""
from __future__ import annotations

import hashlib
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- BEGIN (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- END (?P=path) -->)", re.S)


def locked_md5(path: str, root: Path = ROOT) -> str | None:
    """The md5 dvc.lock (or a profile pipeline's dvc.lock) records for output ``path`` (None: not recorded)."""
    stages = [stage for lock in (root / "dvc.lock", *sorted((root / "pipelines").glob("*/dvc.lock")))
              if lock.exists() for stage in ((yaml.safe_load(lock.read_text()) or {}).get("stages") or {}).values()]
    for stage in stages:
        for key in ("outs", "metrics", "plots"):
            for out in stage.get(key) or []:
                if out.get("path") == path:
                    return out.get("md5")
    return None


def filled(text: str, root: Path = ROOT) -> str:
    def fill(m: re.Match) -> str:
        source = root / m["path"]
        if not source.exists():
            recorded = locked_md5(m["path"], root)
            if recorded is None:
                raise FileNotFoundError(f"README block names {m['path']}, which does not exist")
            if hashlib.md5(m["body"].encode()).hexdigest() != recorded:
                raise ValueError(f"README block {m['path']} differs from the file dvc.lock records (md5 "
                                 f"{recorded}): `dvc repro` (or `dvc pull`), then `python scripts/readme_blocks.py`")
            return m.group(0)
        body = source.read_text()
        return m.group(1) + body + ("" if body.endswith("\n") else "\n") + m.group(4)
    return BLOCK.sub(fill, text)


def documents(root: Path = ROOT) -> list[Path]:
    """The pages whose blocks are generated: README.md and every docs/*.md."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def main(argv: list[str]) -> int:
    stale = []
    for page in documents():
        text = page.read_text()
        new = filled(text)
        if new == text:
            continue
        if "--check" in argv:
            stale += [f"{page.relative_to(ROOT)}: {m['path']}" for m in BLOCK.finditer(text) if m.group(0) not in new]
        else:
            page.write_text(new)
            print(f"{page.relative_to(ROOT)}: blocks refilled")
    if stale:
        print(f"blocks out of date with their files {stale}: run python scripts/readme_blocks.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
