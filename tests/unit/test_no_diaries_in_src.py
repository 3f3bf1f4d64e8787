"""No measurement diary in src/pflkit (issue 53): no dates and no "2-core" machine notes in the package; measured
numbers and the machines they came from go to docs/benchmarks.md and commit messages, docstrings say what the code
promises. The same pattern as the issue's ``grep -rnE "20[0-9]{2}-[0-9]{2}-[0-9]{2}|2-core" src/pflkit``."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIARY = re.compile(r"20[0-9]{2}-[0-9]{2}-[0-9]{2}|2-core")


def _hits() -> dict[str, list[str]]:
    hits: dict[str, list[str]] = {}
    for path in sorted((ROOT / "src" / "pflkit").rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        try:
            lines = path.read_text().splitlines()
        except UnicodeDecodeError:
            continue
        found = [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if DIARY.search(line)]
        if found:
            hits[str(path.relative_to(ROOT))] = found
    return hits


def test_the_pattern_finds_what_it_is_for():
    for line, diary in [("# 0.80 s a step (2026-11-29)", True), ("on a 2-core Xeon", True),
                        ("16 cores", False), ("seeds 2026 and 11", False)]:
        assert bool(DIARY.search(line)) is diary, line


def test_src_holds_no_dates_or_machine_notes():
    """The issue's grep finds nothing in src/pflkit (the notes it found are in docs/benchmarks.md)."""
    hits = _hits()
    assert not hits, "\n".join(f"{f}:{h}" for f, lines in hits.items() for h in lines)
