"""README tables that come from results files match those files (numbers are never typed)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("readme_blocks", ROOT / "scripts/readme_blocks.py")
readme_blocks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme_blocks)


def test_readme_blocks_match_their_results_files():
    text = (ROOT / "README.md").read_text()
    assert readme_blocks.BLOCK.search(text), "README has no generated blocks"
    assert readme_blocks.filled(text) == text, "run: python scripts/readme_blocks.py"


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
