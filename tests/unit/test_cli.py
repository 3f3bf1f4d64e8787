"""The command line (issue 30): every subcommand's help shows an example; `pflkit stage <name>` takes its
notebook from the stage table; an unknown stage name is refused at once, with the closest names."""
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pflkit import __main__ as cli
from pflkit import stages

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", sorted(cli.EXAMPLES))
def test_every_subcommand_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "example:" in out and cli.EXAMPLES[command].split("\n")[0] in out


def test_top_level_help_lists_the_examples(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(example.split("\n")[0] in out for example in cli.EXAMPLES.values())


@pytest.mark.parametrize("argv,close", [(["stage", "perm_fgi1"], "perm_fig1"),
                                        (["stage", "charles_fig12_plt"], "charles_fig12_plot"),
                                        (["tune", "perm_fgi2"], "perm_fig2"),
                                        (["reproduce", "--profile", "smoke", "--stages", "perm_fig1,chayti_fg2"],
                                         "chayti_fig2")])
def test_an_unknown_stage_is_refused_with_close_matches(argv, close, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "unknown stage" in err and f"did you mean {close}" in err, err


def test_an_unknown_stage_is_refused_at_once():
    """In a fresh process (nothing imported yet): torch, papermill and the config are never loaded."""
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pflkit", "stage", "nosuchstage"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown stage 'nosuchstage'; stages:" in done.stderr
    assert time.monotonic() - start < 10  # was 14.5 s on a loaded machine (the whole config loaded first)
    probe = subprocess.run([sys.executable, "-c", "import sys, pflkit.__main__ as m; m.main(['stage', 'x']); "
                            "print(sorted(k for k in sys.modules if k in ('torch', 'papermill', 'pflkit.config')))"],
                           capture_output=True, text=True)
    assert probe.stdout.strip() == "[]", probe.stdout + probe.stderr


def test_stage_without_a_notebook_runs_the_stage_tables(monkeypatch, capsys):
    seen = []
    import pflkit.notebooks as nb
    monkeypatch.setattr(nb, "run_stage", lambda *a: seen.append(a) or nb.Path("reports/x.ipynb"))
    assert cli.main(["stage", "perm_fig1_plot"]) == 0
    assert seen[0][:2] == ("perm_fig1_plot", stages.get("perm_fig1_plot").notebook.replace(".py", ".ipynb"))


def test_the_cli_process_skips_the_slow_iri_format_and_still_validates_notebooks():
    """`python -m pflkit` hides rfc3987_syntax (1 s of parser building at import, for jsonschema's "iri" format):
    nbformat still imports and validates a notebook, without loading it."""
    code = ("import sys; from pflkit.__main__ import hide_slow_optional_modules; hide_slow_optional_modules(); "
            "import nbformat; nb = nbformat.read('notebooks/charles/fig1_frontiers_gamma_and_K.ipynb', as_version=4); "
            "nbformat.validate(nb); print(sys.modules.get('rfc3987_syntax'), 'jsonschema._format' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.split() == ["None", "True"]
