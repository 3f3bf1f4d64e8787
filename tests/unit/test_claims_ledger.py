"""The claims ledger (scripts/claims.py + claims.yaml): rules, paths, verdicts on crafted results."""
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from pflkit.report import settings_digest
from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
claims = load("scripts/claims.py", "claims_ledger")
notebook_html = load("scripts/notebook_html.py", "notebook_html_pages")

#: a 1 x 1 PNG, so the page's figure cells have something to load
PNG = bytes.fromhex("89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
                    "0000000d4944415478da63f8ffff3f0005fe02fea7d6a4b10000000049454e44ae426082")


@pytest.mark.parametrize("rule, columns, verdict", [
    ("> 0", [[0.1, 2.0]], True), ("> 0", [[0.1, 0.0]], False),
    ("<= 1.5", [[1.5]], True), ("< 1e-9", [[2e-9]], False),
    ("abs < 0.05", [[-0.04, 0.01]], True), ("abs < 0.05", [[-0.06]], False),
    ("between 1.8 2.2", [[1.9]], True), ("between 1.8 2.2", [[2.3]], False),
    ("true", [[True, 1.0]], True), ("true", [[True, False]], False), ("true", [["yes"]], False),
    ("increasing", [[1, 2, 3]], True), ("increasing", [[1, 1, 3]], False),
    ("decreasing", [[3, 2, 1]], True), ("increasing", [[1, 5], [2, 6]], True), ("increasing", [[1, 5], [2, 4]], False),
    ("nondecreasing", [[1.0, 2.0], [1.0, 2.5]], True), ("nondecreasing", [[1.0], [0.5]], False),
    ("within 0.01", [[0.1, 0.5], [0.105, 0.509]], True), ("within 0.01", [[0.1], [0.2]], False),
    ("equal", [[True], [True]], True), ("equal", [[False], [False]], True), ("equal", [[True], [False]], False),
    ("equal", [[1, 2], [1, 3]], False),
])
def test_each_rule_decides_both_ways(rule, columns, verdict):
    assert claims.decide(rule, columns) is verdict


def test_the_data_column_names_the_setting_a_curve_stage_ran():
    metrics = {"dataset": "fashion-mnist", "paper_dataset": "cifar10", "is_substitute": True,
               "setting": "N=50, 4 classes per client, 2 label-shifted groups, cnn, 60 rounds"}
    assert claims.dataset_of(metrics) == ("fashion-mnist (substitute for cifar10): N=50, 4 classes per client, "
                                          "2 label-shifted groups, cnn, 60 rounds", True)
    assert claims.dataset_of({"dataset": "mnist"}) == ("mnist", False)


def test_a_bad_rule_names_the_allowed_ones():
    with pytest.raises(ValueError, match="unknown rule 'about 2'; allowed: true, < x"):
        claims.check_rule("about 2")


def test_paths_take_keys_globs_and_positions_in_natural_order():
    tree = {"summary": {"zeta=10": {"v": 3}, "zeta=2": {"v": 2}, "zeta=1": {"v": 1}},
            "central": {"|x_T - x*|": 5, "|x_T - x*(a)|": 6}}
    assert claims.lookup(tree, ["summary", "*", "v"]) == [1, 2, 3]  # 2 before 10: numbers compare as numbers
    assert claims.lookup(tree, ["summary", "#-1", "v"]) == [3]
    assert claims.lookup(tree, ["central", "|x_T - x*|"]) == [5]  # an exact key wins over its glob reading
    with pytest.raises(claims.Missing, match="no key 'w'"):
        claims.lookup(tree, ["summary", "*", "w"])


def _notebook(path: Path, text: str) -> None:
    """A small executed notebook: one markdown cell (``text``), one code cell with its printed output."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(text), nbformat.v4.new_code_cell(
        "print(1 + 1)", execution_count=1, outputs=[nbformat.v4.new_output("stream", name="stdout", text="2\n")])])
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)


#: the crafted project's params.yaml: a section per stage that ran, so each has a settings digest
PARAMS = {"defaults": {"seed": 0}, "perm_fig1": {"rounds": 3}, "perm_fig4": {"rounds": 4}, "perm_fig5": {"rounds": 5},
          "profiles": {"smoke": {"perm_fig1": {"rounds": 1}}, "paper": {}}}


def _stamped(metrics: dict, folder: str, params: dict = PARAMS) -> str:
    """metrics.json's text as the writer leaves it in ``folder`` (results/<stage> or build/<profile>/<stage>): with
    the stage and the digest of the settings ``params`` give it (pflkit.report.write_stage's provenance)."""
    parts = folder.split("/")
    stage, profile = parts[-1], "default" if parts[0] == "results" else parts[1]
    return json.dumps({**metrics, "provenance": {"stage": stage, "settings": settings_digest(params, stage, profile)}})


def _project(tmp_path: Path) -> Path:
    """A partial run. Default profile: perm_fig1 ran with its figure (holds); perm_fig4 ran, crafted to fail,
    its plot stage did not run (no figure, no figure notebook); perm_fig5 ran and drew its figure but lacks
    the claim's key; perm_fig6 has not run (no results, figure or notebook). Profile smoke ran perm_fig1
    and its figure; profile paper has a build/paper/ folder but no results (no column)."""
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    final = {"PERM": {"accuracy_mean": 0.8, "accuracy_std": 0.01}}
    runs = {"results/perm_fig1": {"claim_perm_best": {"margin": 0.02}, "final": final, "dataset": "perm-synthetic"},
            "results/perm_fig4": {"claim_perm_best": {"margin": -0.1}, "final": final, "dataset": "fashion-mnist",
                                  "is_substitute": True, "paper_dataset": "emnist-byclass"},
            "results/perm_fig5": {"something else": 1.0},
            "build/smoke/perm_fig1": {"claim_perm_best": {"margin": -0.3}, "final": {"PERM": {"accuracy_mean": 0.5}}}}
    for folder, metrics in runs.items():
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "metrics.json").write_text(_stamped(metrics, folder))
    (tmp_path / "build/paper/checkpoints").mkdir(parents=True)  # a profile that started but wrote no results
    for figure in ("figures/perm/fig1_synthetic", "figures/perm/fig5_alpha_heatmap",
                   "build/smoke/figures/perm/fig1_synthetic"):
        (tmp_path / figure).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f"{figure}.png").write_bytes(PNG)
        (tmp_path / f"{figure}.svg").write_text('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>')
    for report in ("reports/perm/fig1_synthetic", "reports/perm/fig1_synthetic_plot", "reports/perm/fig4_emnist",
                   "reports/perm/fig5_alpha_heatmap", "reports/perm/fig5_alpha_heatmap_plot",
                   "build/smoke/reports/perm/fig1_synthetic"):
        _notebook(tmp_path / f"{report}.ipynb", f"executed {report}")
    entries = [{"id": f"t-{stage}", "paper": "PERM", "figure": f"Fig. {n}", "stage": stage, "claim": "PERM is best",
                "metric": "PERM minus the best other", "value": ["claim_perm_best", "margin"], "rule": "> 0",
                "show": ["final", "PERM", "accuracy_mean"], "sd": ["final", "PERM", "accuracy_std"], "why": "w"}
               for n, stage in ((1, "perm_fig1"), (4, "perm_fig4"), (5, "perm_fig5"), (6, "perm_fig6"))]
    entries.insert(1, {**entries[0], "id": "t-perm_fig1-default-only", "profiles": ["default"]})
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(entries))
    return tmp_path


def test_crafted_results_give_every_verdict(tmp_path):
    root = _project(tmp_path)
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "default,smoke"], root=root)
    got = {(r["id"], r["profile"]): r for r in rows}
    assert {r["profile"] for r in rows} == {"default", "smoke"}
    assert got["t-perm_fig1", "default"]["verdict"] == "holds"
    assert got["t-perm_fig1", "default"]["estimate"] == "0.8 ± 0.01"
    assert got["t-perm_fig4", "default"]["verdict"] == "does not hold"  # the crafted failure fails
    assert got["t-perm_fig4", "default"]["dataset"] == "fashion-mnist (substitute for emnist-byclass)"
    assert got["t-perm_fig4", "default"]["substitute"] is True
    assert got["t-perm_fig5", "default"]["verdict"] == "no value"
    assert got["t-perm_fig6", "default"]["verdict"] == "not run" and not got["t-perm_fig6", "default"]["ran"]
    assert got["t-perm_fig1", "smoke"]["verdict"] == "does not hold"
    assert got["t-perm_fig1", "smoke"]["estimate"] == "0.5"  # one seed: no sd
    restricted = got["t-perm_fig1-default-only", "smoke"]
    assert (restricted["verdict"], restricted["ran"]) == ("not run", True)
    assert restricted["note"] == "claims.yaml checks it under default only"
    # the markdown ledger says why a claim whose stage ran has no verdict, instead of a bare "not run"
    smoke_md = claims.to_markdown(rows, "smoke")
    assert "**not checked** under this profile: claims.yaml checks it under default only |" in smoke_md
    assert smoke_md.count("**not checked**") == 1
    table = list(csv.DictReader((root / "build/claims/claims.csv").open()))
    assert [(r["id"], r["profile"], r["verdict"]) for r in table][:2] == [
        ("t-perm_fig1", "default", "holds"), ("t-perm_fig1", "smoke", "does not hold")]
    by_hand = (root / "build/claims/claims.md").read_text()
    assert "**PERM** (default profile)" in by_hand and "**PERM** (smoke profile)" in by_hand
    page = (root / "build/claims/index.html").read_text()
    assert page.count('src="../../figures/perm/fig1_synthetic.png"') == 1
    assert 'href="html/default/perm/fig4_emnist.html"' in page and ".ipynb" not in page
    # the DVC stage: its own outputs, the default profile alone, links from reports/
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    assert {r["profile"] for r in rows} == {"default"}
    assert "| Fig. 4 | PERM is best | PERM minus the best other: -0.1 (0.8 ± 0.01) | **does not hold** |" in (
        root / "results/claims.md").read_text()
    page = (root / "reports/index.html").read_text()
    assert page.count('src="../figures/perm/fig1_synthetic.png"') == 1
    assert 'href="html/perm/fig4_emnist.html"' in page and ".ipynb" not in page
    assert json.loads((root / "results/claims/perm_fig4.json").read_text()) == {"claims": 1, "holding": 0,
                                                                                "value": -0.1}
    assert json.loads((root / "results/claims/perm_fig6.json").read_text()) == {"claims": 1,
                                                                                "holding": "not run"}
    assert json.loads((root / "results/claims/charles_fig1.json").read_text()) == {"claims": 0, "holding": 0}
    with pytest.raises(SystemExit, match="t-perm_fig5: no key 'claim_perm_best'"):
        claims.main(["--claims", str(root / "claims.yaml"), "--check"], root=root)


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_by_hand_the_page_shows_the_pipelines_profiles_and_touches_no_dvc_output(tmp_path):
    """``python scripts/claims.py`` after a partial run: the default column, and paper once build/paper/ has
    results; never the smoke results a notebook or nbval left (only when --profiles names smoke); and every
    file it writes is under build/claims/, so no DVC output (results/claims*, reports/) changes."""
    root = _project(tmp_path)
    claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    before = _tree(root)
    rows = claims.main(["--claims", str(root / "claims.yaml")], root=root)
    assert {r["profile"] for r in rows} == {"default"}  # smoke ran perm_fig1, paper nothing: neither shows
    after = _tree(root)
    changed = sorted(k for k in after if before.get(k) != after[k]) + sorted(set(before) - set(after))
    assert changed and all(k.startswith("build/claims/") for k in changed), changed
    (root / "build/paper/perm_fig1").mkdir(parents=True)
    (root / "build/paper/perm_fig1/metrics.json").write_text(_stamped({"claim_perm_best": {"margin": 0.5}},
                                                                      "build/paper/perm_fig1"))
    rows = claims.main(["--claims", str(root / "claims.yaml")], root=root)
    assert {r["profile"] for r in rows} == {"default", "paper"}
    page = (root / "build/claims/index.html").read_text()
    assert "<th>paper profile</th>" in page and "smoke profile" not in page
    with pytest.raises(SystemExit, match="--dvc shows the default profile only"):
        claims.main(["--claims", str(root / "claims.yaml"), "--dvc", "--profiles", "default,smoke"], root=root)


def test_a_profile_gets_a_column_only_with_results(tmp_path):
    """No results anywhere: the default column alone (every stage "not run"); results of one stage under
    build/paper/: a paper column; --profiles names the columns as asked."""
    root = tmp_path
    (root / "build/paper/checkpoints").mkdir(parents=True)
    params, compute = {"profiles": {"smoke": {}, "paper": {}}}, ["perm_fig1", "perm_fig4"]
    assert claims.result_folders(params, root, compute) == {"default": root / "results"}
    (root / "build/paper/perm_fig4").mkdir(parents=True)
    (root / "build/paper/perm_fig4/metrics.json").write_text("{}")
    assert claims.result_folders(params, root, compute) == {"paper": root / "build/paper"}
    assert claims.result_folders(params, root, ["perm_fig1"]) == {"default": root / "results"}
    (root / "build/smoke/perm_fig1").mkdir(parents=True)  # a notebook's smoke run: not a pipeline's column
    (root / "build/smoke/perm_fig1/metrics.json").write_text("{}")
    assert claims.result_folders(params, root, ["perm_fig1"]) == {"default": root / "results"}


def test_not_run_commands_name_the_stage_and_its_figure():
    assert claims.run_command("perm_fig1_plot", "default") == "dvc repro perm_fig1_plot"
    # the paper profile has a DVC pipeline of its own (pipelines/paper/dvc.yaml); smoke runs outside DVC
    assert claims.run_command("perm_fig1_plot", "paper") == "dvc repro pipelines/paper/dvc.yaml:perm_fig1_plot"
    assert claims.run_command("perm_fig1_plot", "smoke") == (
        "python -m pflkit reproduce --profile smoke --stages perm_fig1,perm_fig1_plot")
    assert claims.run_command("charles_theory", "smoke") == (
        "python -m pflkit reproduce --profile smoke --stages charles_theory")


def test_notebook_pages_are_rebuilt_whole(tmp_path):
    """reports/html holds exactly the pages of the executed notebooks that exist: a page whose notebook
    is gone (a stage re-run that failed, a removed report) does not linger."""
    root = _project(tmp_path)
    claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "smoke"], root=root)
    pages = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.html") if p.name != "index.html")
    assert pages == ["build/claims/html/smoke/perm/fig1_synthetic.html", "reports/html/perm/fig1_synthetic.html",
                     "reports/html/perm/fig1_synthetic_plot.html", "reports/html/perm/fig4_emnist.html",
                     "reports/html/perm/fig5_alpha_heatmap.html", "reports/html/perm/fig5_alpha_heatmap_plot.html"]
    (root / "reports/perm/fig4_emnist.ipynb").unlink()
    claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    assert not (root / "reports/html/perm/fig4_emnist.html").exists()
    assert (root / "reports/html/perm/fig1_synthetic.html").is_file()
    assert not (root / "reports/html.part").exists()
    # one stylesheet per folder, linked by each page (JupyterLab's 250 KB of CSS is not copied into each)
    page = (root / "reports/html/perm/fig1_synthetic.html").read_text()
    assert '<link href="../notebook.css" rel="stylesheet"/>' in page and len(page) < 40_000
    assert ".jp-Notebook" in (root / "reports/html/notebook.css").read_text()


def test_notebook_pages_open_offline(tmp_path):
    """nbconvert's lab look without a single script fetched from the network; the cells are there."""
    _notebook(tmp_path / "n.ipynb", "the *executed* notebook, $\\alpha$")
    nb = nbformat.read(tmp_path / "n.ipynb", as_version=4)
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}  # would load a CDN
    nbformat.write(nb, tmp_path / "n.ipynb")
    page = notebook_html.to_html(tmp_path / "n.ipynb")
    assert "<em>executed</em>" in page and "<pre>2\n</pre>" in page and "jp-Notebook" in page
    assert not re.search(r"<script[^>]*\bsrc=|<link[^>]*href=\"https?:|import\(\"https?:", page), (
        re.findall(r"<script[^>]*>|<link[^>]*>", page))
    assert "require.js" not in page and "mathjax" not in page.lower() and "html-manager" not in page
    assert "<link" not in page and ".jp-Notebook" in page  # on its own: the stylesheet inlined


def test_the_claims_stage_renders_what_it_depends_on():
    """dvc.yaml's claims stage depends on every stage's executed notebook (the page renders those, so a
    re-run stage re-renders) and outputs reports/html: the same paths claims.py renders."""
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["claims"]
    table = claims.load_stages().STAGES
    rendered = {f"reports/{s.paper}/{s.stem}.ipynb" for s in table}  # what notebook_pages reads (default)
    assert rendered <= set(spec["deps"]) and len(rendered) == len(table)
    assert {"reports/html", "reports/index.html"} <= set(spec["outs"])
    assert "scripts/notebook_html.py" in spec["deps"]


def test_dvc_metrics_show_reads_a_stage_not_run_as_not_run(tmp_path):
    """DVC's own table: a stage with no results prints "not run" in the holding column, one that ran its count."""
    root = _project(tmp_path)
    claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"metrics": [f"results/claims/{s}.json" for s in
                                                               ("perm_fig1", "perm_fig4", "perm_fig6")]}))
    dvc = [sys.executable, "-m", "dvc"]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=root, check=True)
    shown = subprocess.run([*dvc, "metrics", "show"], cwd=root, check=True, capture_output=True, text=True).stdout
    lines = {line.split()[0]: line.split()[1:] for line in shown.splitlines()}
    assert lines["Path"] == ["claims", "holding", "value"]
    assert lines["results/claims/perm_fig6.json"] == ["1", "not", "run", "-"]
    assert lines["results/claims/perm_fig4.json"] == ["1", "0", "-0.1"]
    assert max(map(len, shown.splitlines())) < 80


def test_the_dvc_stage_shows_the_default_profile_only(tmp_path):
    root = _project(tmp_path)
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "default"], root=root)
    assert {r["profile"] for r in rows} == {"default"}
    with pytest.raises(SystemExit, match="--profiles: unknown \\['nope'\\]; params.yaml defines \\['default', "
                                         "'paper', 'smoke'\\]"):
        claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "nope"], root=root)


def test_every_claim_of_claims_yaml_resolves_on_the_smoke_results():
    """claims.yaml against tests/regression/expected (every stage's committed smoke results): every
    path exists and every rule applies, so a renamed metric fails here, not in the ledger."""
    entries = yaml.safe_load((ROOT / "claims.yaml").read_text())
    ids = [c["id"] for c in entries]
    assert len(ids) == len(set(ids)) >= 40
    stages = {s.name for s in claims.load_stages().STAGES if not s.is_plot}
    assert {c["stage"] for c in entries} == stages, "every compute stage has a claim, and only compute stages"
    rows = claims.evaluate(entries, {"smoke": ROOT / "tests/regression/expected"})
    only_default = {c["id"] for c in entries if "smoke" not in c.get("profiles", ["smoke"])}
    assert {r["id"] for r in rows if r["verdict"] == "not run"} == only_default
    problems = [f"{r['id']}: {r['verdict']} {r['value']}" for r in rows if r["verdict"] == "no value"]
    assert not problems, problems


MARGIN = {"value": ["m", "margin"], "rule": "> 0", "spread": ["m", "margin_sd"], "seeds": ["m", "seeds"]}


@pytest.mark.parametrize("metrics, verdict, why", [
    ({"margin": 0.03, "margin_sd": 0.01, "seeds": 3}, None, None),              # 3 sd above 0: the rule stands
    ({"margin": 0.0172, "margin_sd": 0.0149, "seeds": 3}, None, None),          # perm_fig1's measured pair: above 1 sd
    ({"margin": 0.01, "margin_sd": 0.0149, "seeds": 3}, "inconclusive", "within one seed-to-seed sd (0.0149) of 0"),
    ({"margin": -0.002, "margin_sd": 0.0058, "seeds": 3}, "inconclusive", "other seeds could put it on either side"),
    ({"margin": -0.04, "margin_sd": 0.012, "seeds": 3}, None, None),            # clearly below: does not hold
    ({"margin": 0.2, "seeds": 1}, "inconclusive", "one seed: the seed-to-seed spread of the margin is not measured"),
    ({"margin": 0.2}, None, None),  # results written before the spread was measured: the rule's verdict alone
])
def test_a_margin_within_its_seed_spread_is_inconclusive(metrics, verdict, why):
    got = claims.inconclusive({"m": metrics}, MARGIN, [[metrics["margin"]]])
    assert (got is None) == (verdict is None)
    if why:
        assert why in got


def test_a_run_shorter_than_the_claim_needs_is_inconclusive():
    claim = {"value": ["c", "femnist", "holds"], "rule": "true",
             "min_rounds": {"value": ["tasks", "*", "rounds"], "at_least": 1500, "source": "Reddi et al. (2020)"}}
    short = {"tasks": {"femnist": {"rounds": 1500}, "cifar100": {"rounds": 30}}}
    assert claims.inconclusive(short, claim, [[True]]) == (
        "30 rounds run; the claim is about where the runs end up, which needs 1500 rounds (Reddi et al. (2020))")
    assert claims.inconclusive({"tasks": {"femnist": {"rounds": 1500}}}, claim, [[False]]) is None


def test_an_inconclusive_row_keeps_what_the_rule_alone_says_in_every_output(tmp_path):
    root = _project(tmp_path)
    entries = yaml.safe_load((root / "claims.yaml").read_text())
    for e in entries:
        e.update(spread=["claim_perm_best", "margin_sd"], seeds=["claim_perm_best", "seeds"])
    (root / "claims.yaml").write_text(yaml.safe_dump(entries))
    metrics = json.loads((root / "results/perm_fig1/metrics.json").read_text())
    metrics["claim_perm_best"].update(margin_sd=0.05, seeds=3)  # margin 0.02 < 1 sd
    (root / "results/perm_fig1/metrics.json").write_text(json.dumps(metrics))
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    row = next(r for r in rows if r["id"] == "t-perm_fig1" and r["profile"] == "default")
    assert row["verdict"] == "inconclusive"
    assert row["note"].endswith("(the rule alone: holds)")
    table = {(r["id"], r["profile"]): r for r in csv.DictReader((root / "results/claims.csv").open())}
    assert table["t-perm_fig1", "default"]["verdict"] == "inconclusive"
    assert "within one seed-to-seed sd (0.05) of 0" in table["t-perm_fig1", "default"]["note"]
    markdown = (root / "results/claims.md").read_text()
    assert "| **inconclusive**: the value 0.02 is within one seed-to-seed sd" in markdown
    assert 'class="inconclusive"' in (root / "reports/index.html").read_text()
    # perm_fig1's two claims (t-perm_fig1 and t-perm_fig1-default-only) read the same crafted margin
    assert json.loads((root / "results/claims/perm_fig1.json").read_text())["inconclusive"] == 2


@pytest.mark.parametrize("rule, values, drift, why", [
    ("> 0", [0.02], {"drift": 0.01, "verdicts": {"a": "holds", "b": "holds"}}, None),          # clear of the bound
    ("> 0", [0.008], {"drift": 0.01, "verdicts": {"a": "holds", "b": "holds"}}, "within the cross-machine drift"),
    ("< 0.5", [0.52, 0.3], {"drift": 0.06, "verdicts": {"a": "does not hold", "b": "does not hold"}},
     "within the cross-machine drift"),                                                       # one of several
    ("< 0.5", [0.6, 0.45], {"drift": 0.06, "verdicts": {"a": "does not hold", "b": "does not hold"}}, None),
    ("between 0 1", [0.5], {"drift": 0.2, "verdicts": {"a": "holds", "b": "holds"}}, None),
    ("true", [True], {"drift": None, "verdicts": {"a": "holds", "b": "does not hold"}},        # a flip, measured
     "the verdict differs between machines (a: holds; b: does not hold)"),
    ("increasing", [1.0, 2.0], {"drift": 0.5, "verdicts": {"a": "holds", "b": "holds"}}, None),  # no bound to cross
    ("> 0", [0.008], {"drift": 0.0, "verdicts": {"a": "holds", "b": "holds"}}, None),         # closed forms: no drift
    ("> 0", [0.008], None, None),                                                              # not measured
])
def test_a_verdict_another_machine_could_flip_is_inconclusive(rule, values, drift, why):
    got = claims.drifted({"rule": rule}, [values], drift)
    assert (got is None) == (why is None), got
    if why:
        assert why in got


def test_the_drift_file_makes_the_default_profile_inconclusive_and_leaves_other_profiles_alone(tmp_path):
    root = _project(tmp_path)
    (root / "benchmarks/results").mkdir(parents=True)
    (root / claims.DRIFT).write_text(json.dumps({"claims": {"t-perm_fig1": {
        "stage": "perm_fig1", "drift": 0.05, "verdicts": {"A": "holds", "B": "holds"}}}}))
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--profiles", "default,smoke"], root=root)
    got = {(r["id"], r["profile"]): r for r in rows}
    assert got["t-perm_fig1", "default"]["verdict"] == "inconclusive"  # margin 0.02 within the drift 0.05
    assert "cross-machine drift (0.05" in got["t-perm_fig1", "default"]["note"]
    assert got["t-perm_fig1", "smoke"]["verdict"] == "does not hold"  # measured at the default profile only


def test_a_grid_stage_with_part_of_its_cells_reads_partial_never_a_verdict(tmp_path):
    """perm_fig6 has no results, but its cell store holds 3 of the 8 cells its run planned (pflkit.cells): the
    ledger says "partial: 3 of 8 cells" in every output. A plan of other settings, or none, reads "not run"."""
    from pflkit import cells
    root = _project(tmp_path)
    store = cells.CellStore(root / "build/default/cells")  # the default profile's store (the paper's: cells/)
    grid = [cells.Cell(f"c{i}", "t", {"i": i}, cells.cell_key({"i": i}, "d", "c")) for i in range(8)]
    store.write_plan("perm_fig6", grid, settings_digest(PARAMS, "perm_fig6", "default"))
    for cell in grid[:3]:
        store.put("perm_fig6", cell, {"loss": 1.0}, None)
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    row = next(r for r in rows if r["id"] == "t-perm_fig6")
    assert (row["verdict"], row["value"], row["ran"]) == ("partial", "3 of 8 cells", False)
    assert "`dvc repro perm_fig6`" in row["note"]
    assert "| PERM minus the best other: 3 of 8 cells | **partial**: the rest run with `dvc repro perm_fig6`" in (
        root / "results/claims.md").read_text()
    assert json.loads((root / "results/claims/perm_fig6.json").read_text()) == {
        "claims": 1, "holding": "partial: 3 of 8 cells"}
    page = (root / "reports/index.html").read_text()
    assert '<td class="partial" rowspan="1"><b>partial</b><br>3 of 8 cells<br>run <code>dvc repro perm_fig6' in page
    store.write_plan("perm_fig6", grid, "the digest of other settings")
    rows = claims.main(["--claims", str(root / "claims.yaml"), "--dvc"], root=root)
    assert next(r for r in rows if r["id"] == "t-perm_fig6")["verdict"] == "not run"
