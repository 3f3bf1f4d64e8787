"""Every option error of ``python -m pflkit ...`` (issue 56): a bad value of any subcommand's option ends as
argparse's own errors do -- exit status 2, ``pflkit <command>: error: argument <option>: ...`` naming the option and
what it allows -- before any work starts, never in a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest

from pflkit import __main__ as cli

ROOT = Path(__file__).resolve().parents[2]

#: (subcommand and its arguments, the option the message must name, a fragment saying what it allows)
BAD = [
    (["tune", "perm_fig1", "--grid", "a,b"], "--grid", "comma-separated finite numbers > 0"),
    (["tune", "perm_fig1", "--grid", "0.1,-1"], "--grid", "numbers > 0"),
    (["tune", "perm_fig1", "--grid", "0.1,,0.2"], "--grid", "no empty entry"),
    (["tune", "perm_fig1", "--grid", "nan"], "--grid", "finite numbers > 0"),
    (["tune", "perm_fig1", "--grid", "0.1,0.1"], "--grid", "distinct numbers > 0"),
    (["tune", "perm_fig1", "--seeds", "x"], "--seeds", "integers >= 0"),
    (["tune", "perm_fig1", "--seeds", "-1"], "--seeds", "integers >= 0"),
    (["tune", "perm_fig1", "--seeds", "0,0"], "--seeds", "distinct integers >= 0"),
    (["tune", "perm_fig1", "--methods", "nope"], "--methods", "must be a non-empty list from ['ditto', 'fedavg'"),
    (["tune", "perm_fig1", "--methods", "perm,"], "--methods", "no empty entry"),
    (["tune", "perm_fig1", "--rounds", "0"], "--rounds", "an integer >= 1"),
    (["tune", "perm_fig1", "--rounds", "x"], "--rounds", "an integer >= 1"),
    (["tune", "perm_fig1", "--jobs", "0"], "--jobs", "an integer >= 1"),
    (["tune", "perm_fig1", "--profile", "nope"], "--profile", "defines default, smoke, paper"),
    (["tune", "perm_fig1", "--params", "nope.yaml"], "--params", "an existing params.yaml"),
    (["tune", "perm_fig1", "--out", "src"], "--out", "a CSV file's path"),
    (["tune", "chayti_fig2"], "stage", "stages it can tune: perm_fig1, perm_fig2, perm_fig4"),
    (["tune", "perm_fgi1"], "stage", "did you mean perm_fig1"),
    (["stage", "perm_fig1", "--profile", "nope"], "--profile", "defines default, smoke, paper"),
    (["stage", "perm_fig1", "--params", "nope.yaml"], "--params", "an existing params.yaml"),
    (["stage", "perm_fgi1"], "stage", "did you mean perm_fig1"),
    (["data", "nope"], "key", "choose from 'fashion_mnist', 'mnist'"),
    (["data", "mnist", "--params", "nope.yaml"], "--params", "an existing params.yaml"),
    (["reproduce", "--profile", "nope"], "--profile", "defines default, smoke, paper"),
    (["reproduce", "--profile", "default"], "--profile", "allowed: smoke, paper (or --canary)"),
    (["reproduce", "--profile", "smoke", "--stages", "perm_fig1,nope"], "--stages", "unknown stage 'nope'"),
    (["reproduce", "--profile", "smoke", "--short"], "--short", "only with --canary"),
    (["reproduce", "--profile", "smoke", "--canary-rounds", "2"], "--canary-rounds", "only with --canary"),
    (["reproduce", "--profile", "smoke", "--canary", "--canary-rounds", "0"], "--canary-rounds", "an integer >= 1"),
    (["reproduce", "--profile", "smoke", "--canary", "--max-clients", "-3"], "--max-clients", "an integer >= 1"),
    (["reproduce", "--profile", "smoke", "--params", "nope.yaml"], "--params", "an existing params.yaml"),
    (["validate", "nope.yaml"], "params", "an existing params.yaml"),
    (["validate", "params.yaml", "--dvc", "nope.yaml"], "--dvc", "an existing dvc.yaml"),
    (["notebooks", "refresh", "nope.py"], "paths", "the py:percent twins (.py) under notebooks/"),
    (["notebooks", "lint"], "action", "choose from 'refresh', 'check'"),
]


@pytest.fixture
def no_work(monkeypatch):
    """Every command's work fails the test if it starts: a bad option must be refused before."""
    def started(*args, **kwargs):
        raise AssertionError("the command started its work")
    for target in ("pflkit.experiments.perm.lr_sweep", "pflkit.notebooks.run_stage", "pflkit.notebooks.refresh",
                   "pflkit.reproduce.reproduce", "pflkit.canary.run_canary", "pflkit.data_stages.prepare"):
        monkeypatch.setattr(target, started)
    monkeypatch.chdir(ROOT)


@pytest.mark.parametrize("argv, option, allowed", BAD, ids=[" ".join(a) for a, _, _ in BAD])
def test_a_bad_option_value_exits_2_naming_the_option_and_what_it_allows(argv, option, allowed, no_work, capsys):
    try:
        status = cli.main(argv)
    except SystemExit as exit_:
        status = exit_.code
    err = capsys.readouterr().err
    assert status == 2, err
    assert f"pflkit {argv[0]}: error: argument {option}: " in err, err
    assert allowed in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["tune", "perm_fig1", "--grid", "a,b"], ["tune", "perm_fig1", "--seeds", "x"],
                                  ["notebooks", "refresh", "nope.py"]])
def test_the_command_line_process_says_it_in_one_line(argv):
    """The issue's cases in a real process: argparse's usage and one error line, no traceback."""
    run = subprocess.run([sys.executable, "-m", "pflkit", *argv], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"pflkit {argv[0]}: error: argument ")


def test_good_values_pass_the_option_checks(no_work):
    """The same options with values they allow reach the command's work (here: the stub that says it started)."""
    for argv in (["tune", "perm_fig1", "--grid", "0.1,1", "--seeds", "0,1", "--methods", "perm",
                  "--jobs", "1", "--profile", "smoke"],
                 ["reproduce", "--profile", "smoke", "--stages", "perm_fig1"], ["data", "mnist"],
                 ["notebooks", "refresh", "notebooks/perm/fig1_synthetic.py"]):
        with pytest.raises(AssertionError, match="started its work"):
            cli.main(argv)
