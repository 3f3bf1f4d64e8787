"""scripts/compare_builds.py: the check that a refactor left every result as it was."""
import json

from repo_files import load

compare_builds = load("scripts/compare_builds.py")


def _tree(root, files):
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_timings_and_ignored_paths_do_not_count_but_any_other_change_does(tmp_path, capsys):
    base = {"s/curves.csv": "round,acc\n1,0.5\n", "s/run.json": json.dumps({"acc": 0.5, "runtime_s": 1.0}),
            "reports/s.ipynb": "{}"}
    old = _tree(tmp_path / "old", base)
    new = _tree(tmp_path / "new", {**base, "s/run.json": json.dumps({"acc": 0.5, "runtime_s": 2.5}),
                                   "reports/s.ipynb": '{"ran": 3}'})
    assert compare_builds.main([str(old), str(new)]) == 0
    (new / "s" / "curves.csv").write_text("round,acc\n1,0.51\n")
    (new / "s" / "extra.csv").write_text("x\n")
    assert compare_builds.main([str(old), str(new)]) == 1
    printed = capsys.readouterr().out
    assert "different: s/curves.csv" in printed and "only in new: s/extra.csv" in printed
    out = compare_builds.compare(old, new, [])
    assert out["different"] == ["reports/s.ipynb", "s/curves.csv"] and out["same"] == ["s/run.json"]


def test_a_result_in_json_is_compared_even_beside_timings(tmp_path):
    old = _tree(tmp_path / "old", {"m.json": json.dumps({"acc": 0.5, "wall_s": 1})})
    new = _tree(tmp_path / "new", {"m.json": json.dumps({"acc": 0.6, "wall_s": 1})})
    assert compare_builds.compare(old, new, [])["different"] == ["m.json"]
