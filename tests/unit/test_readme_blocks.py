"""README's and docs/'s tables that come from results files match those files (numbers are never typed), and
every relative link of those pages leads to a file (and heading) that exists."""
import re
from pathlib import Path

from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
readme_blocks = load("scripts/readme_blocks.py")


def test_readme_blocks_match_their_results_files():
    pages = readme_blocks.documents()
    assert {p.name for p in pages} >= {"README.md", "pipeline.md", "benchmarks.md"}
    assert readme_blocks.BLOCK.search((ROOT / "README.md").read_text()), "README has no generated blocks"
    for page in pages:
        text = page.read_text()
        assert readme_blocks.filled(text) == text, f"{page.name}: run python scripts/readme_blocks.py"


def _anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _broken_links(page: Path) -> list[str]:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # https://...
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", file.read_text(), re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    return broken


def test_every_relative_link_of_readme_and_docs_resolves():
    pages = readme_blocks.documents()
    assert sum(len(re.findall(r"\]\(docs/", p.read_text())) for p in pages) >= 6  # README links every page
    assert {p.name: _broken_links(p) for p in pages} == {p.name: [] for p in pages}


def test_a_broken_link_or_anchor_is_caught(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Two words\n")
    (tmp_path / "b.md").write_text("[ok](a.md#two-words) [no file](c.md) [no heading](a.md#three) [web](https://x.org)")
    assert _broken_links(tmp_path / "b.md") == ["c.md", "a.md#three"]


def test_a_stale_block_is_detected(tmp_path):
    (tmp_path / "r.md").write_text("| a | 1 |\n")
    text = "x\n<!-- BEGIN r.md -->\n| a | 2 |\n<!-- END r.md -->\n"
    assert readme_blocks.filled(text, tmp_path) == "x\n<!-- BEGIN r.md -->\n| a | 1 |\n<!-- END r.md -->\n"


def test_a_block_of_a_dvc_output_is_checked_against_dvc_lock_when_the_file_is_absent(tmp_path):
    """A fresh clone has no results/ (DVC outputs) but has dvc.lock: the block must hash to its record."""
    import hashlib

    import pytest
    import yaml
    body = "| claim | holds |\n"
    lock = {"stages": {"claims": {"outs": [{"path": "results/claims.md", "hash": "md5",
                                            "md5": hashlib.md5(body.encode()).hexdigest()}]}}}
    (tmp_path / "dvc.lock").write_text(yaml.safe_dump(lock))
    text = f"x\n<!-- BEGIN results/claims.md -->\n{body}<!-- END results/claims.md -->\n"
    assert readme_blocks.filled(text, tmp_path) == text
    with pytest.raises(ValueError, match="differs from the file dvc.lock records"):
        readme_blocks.filled(text.replace("holds", "does not hold"), tmp_path)
    with pytest.raises(FileNotFoundError, match="other.md, which does not exist"):
        readme_blocks.filled("<!-- BEGIN other.md -->\n<!-- END other.md -->\n", tmp_path)


def test_a_block_of_a_profile_pipelines_output_is_checked_against_its_own_lock(tmp_path):
    """build/paper/claims.md (the paper pipeline's ledger) is recorded in pipelines/paper/dvc.lock."""
    import hashlib

    import pytest
    import yaml
    body = "| claim | inconclusive |\n"
    (tmp_path / "pipelines/paper").mkdir(parents=True)
    lock = {"stages": {"claims": {"outs": [{"path": "build/paper/claims.md", "hash": "md5",
                                            "md5": hashlib.md5(body.encode()).hexdigest()}]}}}
    (tmp_path / "pipelines/paper/dvc.lock").write_text(yaml.safe_dump(lock))
    text = f"<!-- BEGIN build/paper/claims.md -->\n{body}<!-- END build/paper/claims.md -->\n"
    assert readme_blocks.filled(text, tmp_path) == text
    with pytest.raises(ValueError, match="differs from the file dvc.lock records"):
        readme_blocks.filled(text.replace("inconclusive", "holds"), tmp_path)
