"""Results read with their provenance (issue 56): every results file a stage writes records the stage and the
digest of the settings that produced it (pflkit.report.write_stage), and the readers -- the plot stages' loader
(report.read_result), the notebooks' text (report.read_results / print_measured) and the claims ledger and page
(scripts/claims.py) -- refuse a file whose stage or settings are not the folder's, naming both.

Each fault is applied to a freshly written results/perm_fig1 in a throw-away project (tmp_path with dvc.yaml and
params.yaml, the cwd); each reader must refuse it with the fragments the row lists."""
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pflkit import report
from repo_files import load

claims = load("scripts/claims.py", "claims_provenance")

PARAMS = {"defaults": {"seed": 0, "threads": 1}, "perm_fig1": {"rounds": 3, "lr": 0.1},
          "perm_fig4": {"rounds": 4, "lr": 0.1}, "profiles": {"smoke": {"perm_fig1": {"rounds": 1}}}}
CLAIM = {"id": "c", "paper": "p", "figure": "f", "stage": "perm_fig1", "claim": "x", "metric": "acc",
         "value": ["acc"], "rule": "> 0"}


@pytest.fixture
def project(tmp_path, monkeypatch):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PFLKIT_PARAMS", raising=False)
    return tmp_path


def _write(folder: str, acc: float) -> Path:
    """A curve stage's results as its notebook writes them (history, run.json, a named table)."""
    history = pd.DataFrame({"round": [0, 1], "accuracy": [0.5, acc]})
    report.write_stage(folder, {"dataset": "synthetic", "acc": acc}, history=history,
                       run_info={"data_label": "synthetic", "scale": "tiny"}, curves_accuracy=history)
    return Path(folder)


def _digest(stage: str, profile: str = "default", params: dict = PARAMS) -> str:
    return report.settings_digest(params, stage, profile)[:12]


def _copy_files(names):
    def fault(project: Path):
        other = _write("results/perm_fig4", 0.9)
        for name in names:
            shutil.copy(other / name, project / "results/perm_fig1" / name)
    return fault


def _change_settings(project: Path):
    (project / "params.yaml").write_text(yaml.safe_dump({**PARAMS, "perm_fig1": {"rounds": 30, "lr": 0.1}}))


def _smoke_results_copied_in(project: Path):
    _write("build/smoke/perm_fig1", 0.7)
    for path in (project / "build/smoke/perm_fig1").iterdir():
        shutil.copy(path, project / "results/perm_fig1" / path.name)


def _strip_provenance(project: Path):
    for name in ("metrics.json", "run.json"):
        path = project / "results/perm_fig1" / name
        data = json.loads(path.read_text())
        del data["provenance"]
        path.write_text(json.dumps(data))


#: fault -> (what it does to results/perm_fig1, fragments every reader's message holds (after the file name), and
#: whether the metrics.json readers see it: a CSV is read by the plot stages' loader only)
FAULTS = {
    "another stage's metrics.json copied in": (
        _copy_files(["metrics.json"]), lambda: [
            "metrics.json: another stage's results: written by stage perm_fig4 with settings " + _digest("perm_fig4"),
            f"this folder is stage perm_fig1's, whose settings in params.yaml are now {_digest('perm_fig1')}"], True),
    "another stage's whole folder copied in": (
        _copy_files(["metrics.json", "run.json", "history.csv", "curves_accuracy.csv"]), lambda: [
            "metrics.json: another stage's results: written by stage perm_fig4", "stage perm_fig1's"], True),
    "the settings changed since the run": (
        _change_settings, lambda: [
            f"metrics.json: results of other settings: written by stage perm_fig1 with settings {_digest('perm_fig1')}",
            "whose settings in params.yaml are now "
            + _digest("perm_fig1", params={**PARAMS, "perm_fig1": {"rounds": 30, "lr": 0.1}})], True),
    "another profile's results copied in": (
        _smoke_results_copied_in, lambda: [
            f"metrics.json: results of other settings: written by stage perm_fig1 with settings "
            f"{_digest('perm_fig1', 'smoke')}", f"now {_digest('perm_fig1')}"], True),
    "written before results recorded their provenance": (
        _strip_provenance, lambda: ["metrics.json: records no stage or settings (written before results recorded "
                                    "their provenance): re-run the stage"], True),
    "another stage's history.csv copied in": (
        _copy_files(["history.csv"]), lambda: [
            "history.csv: not the file stage perm_fig1's run wrote (its SHA-256 differs from the one run.json "
            "records)"], False),
    "a CSV no run wrote": (
        lambda project: (project / "results/perm_fig1/extra.csv").write_text("a,b\n1,2\n"),
        lambda: ["extra.csv: not written by stage perm_fig1's run (run.json does not list it)"], False),
}


def _plot_loader():
    report.read_result("results/perm_fig1")


def _notebook_text():
    report.read_results("perm_fig1")


def _ledger():
    claims.evaluate([CLAIM], {"default": Path("results").resolve()}, Path.cwd(), params=PARAMS_NOW())


def PARAMS_NOW():  # noqa: N802 -- the params.yaml the fault left
    return yaml.safe_load(Path("params.yaml").read_text())


#: reader -> (its call, the error it raises, the command its message names)
READERS = {"plot stage loader": (_plot_loader, report.ProvenanceError, "run `dvc repro perm_fig1`"),
           "notebook text": (_notebook_text, report.ProvenanceError, "run `dvc repro perm_fig1`"),
           "claims ledger": (_ledger, claims.UnreadableResults, "run `dvc repro perm_fig1`")}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("fault", FAULTS)
def test_a_results_file_of_another_stage_or_other_settings_is_refused_naming_both(project, fault, reader):
    damage, fragments, seen_by_all = FAULTS[fault]
    read, error, command = READERS[reader]
    _write("results/perm_fig1", 0.6)
    read()  # intact: reads
    damage(project)
    if not seen_by_all and reader != "plot stage loader":
        read()  # the metrics.json readers never open the CSVs
        return
    with pytest.raises(error) as info:
        read()
    message = str(info.value)
    for fragment in [f"results/perm_fig1/{fragments()[0]}", *fragments()[1:], command]:
        assert fragment in message, (fragment, message)
    assert isinstance(info.value, ValueError)


def test_the_claims_page_stops_naming_the_file_and_print_measured_says_why_it_shows_nothing(project, capsys):
    (project / "claims.yaml").write_text(yaml.safe_dump([CLAIM]))
    _write("results/perm_fig1", 0.6)
    assert claims.main(["--claims", "claims.yaml", "--profiles", "default"], root=project)[0]["verdict"] == "holds"
    _copy_files(["metrics.json"])(project)
    with pytest.raises(SystemExit, match=r"claims: results/perm_fig1/metrics.json: another stage's results: "
                                         r"written by stage perm_fig4"):
        claims.main(["--claims", "claims.yaml", "--profiles", "default"], root=project)

    class Cfg:
        stage, results_dir = "perm_fig1", "build/smoke/perm_fig1"
    capsys.readouterr()
    report.print_measured(Cfg, lambda m: f"acc {m['acc']}")
    out = capsys.readouterr().out
    assert out.startswith("not shown: results/perm_fig1/metrics.json: another stage's results") and "acc" not in out


def test_the_writer_records_the_stage_the_settings_and_every_table(project):
    folder = _write("results/perm_fig1", 0.6)
    stamp = {"stage": "perm_fig1", "settings": report.settings_digest(PARAMS, "perm_fig1", "default")}
    metrics = json.loads((folder / "metrics.json").read_text())
    run = json.loads((folder / "run.json").read_text())
    assert metrics == {"dataset": "synthetic", "acc": 0.6, "provenance": stamp}
    assert run["provenance"] == {**stamp, "files": {
        name: report._file_sha256(folder / name) for name in ("curves_accuracy.csv", "history.csv")}}
    # what the plot stage gets is what the compute stage wrote, without the provenance
    result = report.read_result("results/perm_fig1")
    assert result.metrics == {"dataset": "synthetic", "acc": 0.6} and "provenance" not in result.run_info
    assert result.history["accuracy"].tolist() == [0.5, 0.6]
    smoke = json.loads((_write("build/smoke/perm_fig1", 0.6) / "metrics.json").read_text())["provenance"]
    assert smoke == {"stage": "perm_fig1", "settings": report.settings_digest(PARAMS, "perm_fig1", "smoke")}
    assert smoke["settings"] != stamp["settings"]
    with pytest.raises(ValueError, match="metrics: the key 'provenance' is the writer's"):
        report.write_stage("results/perm_fig1", {"provenance": 1})


#: an edit of params.yaml -> whether perm_fig1's default-profile settings digest changes
EDITS = {
    "keys in another order": (lambda p: {**p, "perm_fig1": {"lr": 0.1, "rounds": 3}}, False),
    "another stage's section": (lambda p: {**p, "perm_fig4": {"rounds": 40}}, False),
    "another profile's overlay": (lambda p: {**p, "profiles": {"smoke": {"perm_fig1": {"rounds": 2}}}}, False),
    "one of the stage's values": (lambda p: {**p, "perm_fig1": {"rounds": 3, "lr": 0.2}}, True),
    "a value it gets from defaults": (lambda p: {**p, "defaults": {"seed": 1, "threads": 1}}, True),
    "a key added to the section": (lambda p: {**p, "perm_fig1": {"rounds": 3, "lr": 0.1, "seeds": [0]}}, True),
}


@pytest.mark.parametrize("edit", EDITS)
def test_the_settings_digest_follows_the_stages_values_only(edit):
    change, differs = EDITS[edit]
    before = report.settings_digest(PARAMS, "perm_fig1", "default")
    assert len(before) == 64
    assert (report.settings_digest(change(PARAMS), "perm_fig1", "default") != before) is differs


def test_a_stage_or_profile_params_yaml_does_not_define_has_no_digest():
    assert report.settings_digest(PARAMS, "perm_fig2", "default") is None  # no section
    assert report.settings_digest(PARAMS, "perm_fig1", "nope") is None  # no such profile
