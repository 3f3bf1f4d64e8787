"""Two runs' output trees, file by file: did a change leave every result as it was?

    python scripts/compare_builds.py OLD NEW [--ignore GLOB ...]

For a change meant to keep results (a refactor), run the same stages before and after it into two folders, e.g. with
``git worktree add /tmp/base <commit>`` and ``python -m pflkit reproduce --profile smoke`` in each (the old one with
``PYTHONPATH=/tmp/base/src``), then compare their ``build/<profile>`` folders. Files must be byte-identical, except JSON
files, which are compared without their timing keys (``TIMING_KEYS``, and any key ending in ``_seconds`` or ``_s``; for
a dotted key, its last part).
``--ignore`` skips paths matching a glob (relative to the folders; default ``reports/*``: executed notebooks record
their run times). Exit status 1 when a file differs or exists on one side only, naming each.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

TIMING_KEYS = {"runtime_s", "environment", "wall_s", "seconds", "started", "finished", "total_seconds", "timings"}


def without_timings(obj):
    """``obj`` (parsed JSON) without the keys that record when and how long something ran."""
    if isinstance(obj, dict):
        return {k: without_timings(v) for k, v in obj.items() if not _timing(k)}
    if isinstance(obj, list):
        return [without_timings(v) for v in obj]
    return obj


def _timing(key: str) -> bool:
    last = key.rsplit(".", 1)[-1]  # flattened keys too ("tasks.femnist.seconds")
    return last in TIMING_KEYS or last.endswith(("_seconds", "_s"))


def same(old: Path, new: Path) -> bool:
    a, b = old.read_bytes(), new.read_bytes()
    if a == b:
        return True
    if old.suffix == ".json":
        try:
            return without_timings(json.loads(a)) == without_timings(json.loads(b))
        except ValueError:
            return False
    return False


def compare(old: Path, new: Path, ignore: list[str]) -> dict[str, list[str]]:
    """{"same", "different", "only_old", "only_new", "ignored"}: relative paths, sorted."""
    def files(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    a, b = files(old), files(new)
    skipped = {f for f in a | b if any(fnmatch.fnmatch(f, g) for g in ignore)}
    a, b = a - skipped, b - skipped
    both = sorted(a & b)
    return {"same": [f for f in both if same(old / f, new / f)],
            "different": [f for f in both if not same(old / f, new / f)],
            "only_old": sorted(a - b), "only_new": sorted(b - a), "ignored": sorted(skipped)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("old", type=Path)
    p.add_argument("new", type=Path)
    p.add_argument("--ignore", nargs="*", default=["reports/*"], help="globs of paths to skip (default: reports/*)")
    a = p.parse_args(argv)
    for folder in (a.old, a.new):
        if not folder.is_dir():
            p.error(f"{folder} is not a folder")
    out = compare(a.old, a.new, a.ignore)
    print(f"{len(out['same'])} files the same, {len(out['different'])} different, {len(out['only_old'])} only in "
          f"{a.old}, {len(out['only_new'])} only in {a.new}; {len(out['ignored'])} ignored ({' '.join(a.ignore)})")
    for key, label in (("different", "different"), ("only_old", "only in old"), ("only_new", "only in new")):
        for f in out[key]:
            print(f"  {label}: {f}")
    return 1 if out["different"] or out["only_old"] or out["only_new"] else 0


if __name__ == "__main__":
    sys.exit(main())
