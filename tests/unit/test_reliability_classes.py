"""Issue 29, the classes a probe found of values that validation accepted and the run then failed on, and of
messages that echoed too much. One table per class; each row is the committed params.yaml with one change,
validated as ``pflkit validate`` does. Each row fails when its rule is taken out (the value is accepted, or
the message is long or repeated). The property test (test_params_property.py) looks for new cases; the
other classes of the issue are tested in test_read_checks.py (data read without being checked),
tests/integration/test_write_confinement.py (written outside its place) and test_divergence.py
(divergence missed: a reference a broken run cannot move)."""
import copy
import re

import pytest

from pflkit.__main__ import main
from pflkit.config import (ECHO_LIMIT, KEY_LIMIT, SEED_MAX, ConfigError, cpu_cores, load_params, validate_all,
                           validate_stage)

from test_validate_bad_configs import ROOT  # noqa: F401 -- one project root for both tables

PARAMS = load_params(ROOT / "params.yaml")


def changed(dotted: str, value):
    params = copy.deepcopy(PARAMS)
    *path, last = dotted.split(".")
    node = params
    for part in path:
        node = node[int(part) if isinstance(node, list) else part]
    node[last] = value
    return params


def problem(params, stage, profile="default") -> str:
    with pytest.raises(ConfigError) as info:
        validate_stage(params, stage, profile)
    return str(info.value)


# --------------------------------------------------------------------------- accepted, then a raw error
CROSS_KEY = [  # (stage, dotted key, value, message): a value that contradicts another key of the same stage
    ("charles_fig1", "charles_fig1.L_values", [0.5, 50.0], r"charles_fig1\.mu: 1\.0 must be < every L of L_values"),
    ("charles_fig3", "charles_fig3.L", 0.5, r"charles_fig3\.mu: 1\.0 must be < every L of L \(0\.5\)"),
    ("charles_fig4", "charles_fig4.mu", 20.0, r"charles_fig4\.mu: 20\.0 must be < every L of L"),
    ("charles_fig9", "charles_fig9.L", 1e21, r"charles_fig9\.gamma: .* must be < 1/\(L\+alpha\)"),
    ("charles_theory", "charles_theory.table2_L", 0.5,
     r"charles_theory\.table2_L: 0\.5 must lie in \[mu, 1e\+08 x mu\]"),
    ("charles_theory", "charles_theory.table2_L", 2.0**70, r"charles_theory\.table2_L: .* must lie in \[mu"),
    ("charles_fig5", "charles_fig5.server_opts", [], r"charles_fig5\.server_opts: List should have at least 1 item"),
    ("perm_fig4", "perm_fig4.methods", ["local", "fedavg"], r"perm_fig4\.methods: must include 'perm'"),
    # hypothesis found it (test_params_property): a warm-up as long as the run leaves no alpha for Fig. 5
    ("perm_fig4", "perm_fig4.perm.warmup_rounds", 2**31,
     r"perm_fig4\.perm\.warmup_rounds: 2147483648 leaves PERM no round past its warm-up \(rounds = \d+\), .*"
     r"allowed: 0\.\.\d+"),
    ("chayti_fig2", "chayti_fig2.panels.0.b", 1e-300, r"chayti_fig2\.panels\.0\.b: 1e-300 is below 1e-12"),
    ("chayti_fig1", "chayti_fig1.sigma", 1e300,
     r"chayti_fig1\.sigma: must be at most 1e\+100 in magnitude .* got 1e\+300$"),
    ("perm_fig4", "perm_fig4.partition", {"scheme": "dirichlet", "beta": 1e-300},
     r"perm_fig4\.partition\.beta: 1e-300 is below 0\.01"),
    ("perm_fig6", "perm_fig6.dataset.root", "x" * 300, r"perm_fig6\.dataset\.root: has a part longer than 255 bytes"),
    ("perm_fig6", "perm_fig6.dataset.root", "/etc", r"perm_fig6\.dataset\.root: must be a relative path inside"),
    ("perm_fig6", "perm_fig6.dataset.root", "../../x", r"perm_fig6\.dataset\.root: must be a relative path inside"),
    ("charles_fig12", "charles_fig12.tasks.femnist.root", "/tmp",
     r"charles_fig12\.tasks\.femnist\.root: must be a relative path inside"),
]

MACHINE = [  # limits of the machine, checked before any work
    ("perm_fig1", "perm_fig1.threads", 100_000,
     rf"perm_fig1\.threads: 100000 exceeds the {cpu_cores()} CPU cores this process may use; "
     rf"allowed: 1\.\.{cpu_cores()}"),
    ("perm_fig1", "perm_fig1.num_clients", 10**8,
     r"perm_fig1\.num_clients: the stage would need at least [\d,.]+ GiB of memory .* more than the [\d,.]+ GiB free"),
    ("perm_fig1", "perm_fig1.batch_size", 2**63, r"perm_fig1\.batch_size: the stage would need at least"),
    ("perm_fig1", "perm_fig1.local_steps", 2**31, r"perm_fig1\.local_steps: the stage would need at least"),
    ("perm_fig6", "perm_fig6.hidden", [2**31, 200], r"perm_fig6\.hidden: the stage would need at least"),
    ("chayti_fig3", "chayti_fig3.n_collaborators", 2**31, r"chayti_fig3\.n_collaborators: the stage would need"),
    ("chayti_fig2", "chayti_fig2.tuning_runs", 2**31, r"chayti_fig2\.tuning_runs: the stage would need"),
    ("charles_theory", "charles_theory.num_clients", 2**31, r"charles_theory\.num_clients: the stage would need"),
    ("charles_theory", "charles_theory.batch_size", 10**12, r"charles_theory\.batch_size: the stage would need"),
    ("perm_fig3", "perm_fig3.num_clients", 10**9, r"perm_fig3\.num_clients: the stage would need"),
    ("charles_fig3", "charles_fig3.num_k", 2**70, r"charles_fig3\.num_k: the stage would need"),
    ("perm_fig1", "perm_fig1.seeds", [2**70],
     rf"perm_fig1\.seeds\.0: Input should be less than or equal to {SEED_MAX}"),
    ("perm_hetero", "perm_hetero.budget_seed", 2**64,
     rf"perm_hetero\.budget_seed: .* less than or equal to {SEED_MAX}"),
]


@pytest.mark.parametrize("stage,key,value,message", CROSS_KEY + MACHINE,
                         ids=[f"{k}={str(v)[:20]}" for _, k, v, _ in CROSS_KEY + MACHINE])
def test_a_value_that_cannot_run_is_refused_naming_key_value_and_limit(stage, key, value, message):
    text = problem(changed(key, value), stage)
    assert re.search(message, text), text
    assert len(text.splitlines()) == 1, text  # said once


def test_the_committed_params_are_within_every_limit():
    assert validate_all(PARAMS) == []


# --------------------------------------------------------------------------- messages
def _validate(tmp_path, params, capsys) -> str:
    import yaml
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    assert main(["validate", str(path)]) == 1
    return capsys.readouterr().err


MESSAGES = [  # (dotted key, value, what the message must say, the longest it may be)
    ("perm_fig1.methods", ["x" * 10_000], r"perm_fig1\.methods: .*unknown: \['xxx.*\(10004 characters\)", 1_000),
    ("perm_fig1.y" + "y" * 9_999, 1, r"perm_fig1\.yyy.*\(10000 characters\): unknown key", 1_000),
    ("data.fashion_mnist", {"name": "x" * 5_000}, r"data\.fashion_mnist\.name: Extra inputs are not permitted "
                                                 r"\(got 'xxx.*\(5002 characters\)\)$", 400),
    ("defaults.threads", "many", r"^defaults\.threads: must be an integer >= 1 or 'auto', got 'many'$", 200),
    ("perm_fig1.roudns", 5, r"^perm_fig1\.roudns: unknown key \(did you mean 'rounds'\?\)", 1_000),
    ("perm_fig1.rounds", 0, r"^perm_fig1\.rounds: Input should be greater than or equal to 1 \(got 0\)$", 200),
]


@pytest.mark.parametrize("key,value,message,limit", MESSAGES, ids=[m[0][:30] for m in MESSAGES])
def test_a_problem_is_said_once_at_a_readable_length(tmp_path, capsys, key, value, message, limit):
    err = _validate(tmp_path, changed(key, value), capsys)
    lines = err.splitlines()[1:]  # after "invalid configuration in ...:"
    assert len(lines) == 1, err[:3000]  # once: not per stage inheriting a default, nor per profile
    assert re.search(message, lines[0]), lines[0][:3000]
    assert len(lines[0]) <= limit, len(lines[0])


def test_cut_lengths_are_the_documented_ones():
    assert (ECHO_LIMIT, KEY_LIMIT) == (80, 80)
