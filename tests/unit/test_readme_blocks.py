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
