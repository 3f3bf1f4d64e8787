"""Rules across keys are one table (``config.CROSS_KEY_RULES``) applied to every stage config that has the fields
they read, and a setting that makes a method do nothing is refused at ``python -m pflkit validate`` time, naming
the stage, the key and the range allowed (issue 56); validation is linear in a list's length."""
import copy
import time
from pathlib import Path

import pytest

from pflkit import config, stages
from pflkit.config import ConfigError, load_params, stage_values, validate_all, validate_stage

ROOT = Path(__file__).resolve().parents[2]
PARAMS = load_params(ROOT / "params.yaml")


def with_values(stage: str, changes: dict, profile: str | None = None) -> dict:
    """params.yaml with ``changes`` (dotted key -> value) made in ``stage``'s section (or its ``profile`` overlay)."""
    params = copy.deepcopy(PARAMS)
    section = params[stage] if profile is None else params["profiles"][profile].setdefault(stage, {})
    for key, value in changes.items():
        *path, last = key.split(".")
        node = section
        for part in path:
            if profile is not None and part not in node:  # an overlay replaces a whole mapping: copy it first
                node[part] = copy.deepcopy(stage_values(PARAMS, stage, profile)[part])
            node = node[part]
        node[last] = value
    return params


def problems(stage: str, changes: dict, profile: str | None = None) -> list[str]:
    """What ``python -m pflkit validate`` says of params.yaml with ``changes`` (``validate_all``): the stage's lines."""
    params = with_values(stage, changes, profile)
    return [p for p in validate_all(params) if stage in p.split(":", 1)[0]]


REFUSED = [
    # (stage, changes, the line's start, words the line holds)
    ("perm_fig1", {"perm.warmup_rounds": 100}, "perm_fig1.perm.warmup_rounds: 100 >= rounds = 100",
     "would never leave its FedAvg warm-up", "allowed: 0..99"),
    ("perm_fig1", {"perm.warmup_rounds": 250}, "perm_fig1.perm.warmup_rounds: 250 >= rounds = 100",
     "allowed: 0..99"),
    ("perm_fig1", {"perm.update_every": 101}, "perm_fig1.perm.update_every: 101 exceeds the 100 rounds after the "
     "warm-up", "never take its global step nor update alpha", "allowed: 1..100, 'epoch'"),
    ("perm_fig1", {"perm.update_every": None}, "perm_fig1.perm.update_every: null with perm.alpha_init 'uniform'",
     "never estimate nor update alpha", "allowed: alpha_init 'estimate'"),
    ("perm_fig1", {"perm_torchfed.warmup_rounds": 100}, "perm_fig1.perm_torchfed.warmup_rounds: 100 >= rounds",
     "allowed: 1..99"),
    ("perm_fig1", {"eval_every": 101}, "perm_fig1.eval_every: 101 > rounds = 100", "allowed: 1..100"),
    ("perm_fig1", {"perfedavg.alpha": 0.0}, "perm_fig1.perfedavg.alpha: 0", "perfedavg_fo do nothing",
     "allowed: > 0"),
    ("perm_fig2", {"rounds": 59, "perm_alpha.update_every": "epoch"},
     "perm_fig2.perm_alpha.update_every: 'epoch' (num_clients = 50 rounds) exceeds the 49 rounds",
     "allowed: 1..49, or null"),
    ("perm_fig2", {"label_groups": 11}, "perm_fig2.label_groups: 11 exceeds the 10 classes of", "allowed: 1..10"),
    ("perm_fig2", {"perm.warmup_rounds": 60}, "perm_fig2.perm.warmup_rounds: 60 >= rounds = 60", "allowed: 0..59"),
    ("perm_fig4", {"perm.warmup_rounds": 100}, "perm_fig4.perm.warmup_rounds: 100"),  # its own rule says it first
    ("perm_fig4", {"label_groups": 11}, "perm_fig4.label_groups: 11 exceeds the 10 classes of fashion-mnist"),
    ("perm_hetero", {"perm.warmup_rounds": 60}, "perm_hetero.perm.warmup_rounds: 60 >= rounds = 60",
     "method perm would never leave"),
    ("perm_hetero", {"perm.update_every": 41}, "perm_hetero.perm.update_every: 41 exceeds the 40 rounds"),
    ("perm_hetero", {"eval_every": 61}, "perm_hetero.eval_every: 61 > rounds = 60"),
    ("flower_equivalence", {"perm.update_every": 11}, "flower_equivalence.perm.update_every: 11 exceeds the 10"),
    ("charles_fig12", {"eval_every": 13}, "charles_fig12.eval_every: 13 > tasks.cifar100.rounds = 12",
     "allowed: 1..12"),
    ("chayti_fig3", {"record_every": 5001}, "chayti_fig3.record_every: 5001 > steps = 5000", "allowed: 1..5000"),
]


@pytest.mark.parametrize("stage,changes,start,words", [(*r[:3], r[3:]) for r in REFUSED],
                         ids=[f"{r[0]}-{'-'.join(r[1])}" for r in REFUSED])
def test_a_setting_that_makes_a_method_do_nothing_is_refused_at_validate(stage, changes, start, words):
    lines = [line for line in problems(stage, changes) if line.startswith(start)]
    assert lines, problems(stage, changes)
    assert all(w in lines[0] for w in words), lines[0]


ACCEPTED = [  # the boundaries of the rules above: the last value each allows
    ("perm_fig1", {"perm.warmup_rounds": 99, "perm.update_every": 1}),
    ("perm_fig1", {"perm.warmup_rounds": 10, "perm.update_every": 90}),
    ("perm_fig1", {"perm.update_every": None, "perm.alpha_init": "estimate"}),  # two-stage
    ("perm_fig1", {"eval_every": 100}),
    ("perm_fig2", {"rounds": 60, "perm_alpha.update_every": "epoch"}),  # 50 clients, 50 rounds after warm-up
    ("perm_fig2", {"label_groups": 10}),
    ("charles_fig12", {"eval_every": 12}),
    ("chayti_fig3", {"record_every": 5000}),
]


@pytest.mark.parametrize("stage,changes", ACCEPTED)
def test_the_boundary_values_are_accepted(stage, changes):
    assert problems(stage, changes) == []


def test_a_profile_overlays_value_is_named_by_its_section():
    lines = problems("perm_fig1", {"perm.warmup_rounds": 50, "rounds": 50}, profile="smoke")
    assert any(line.startswith("profiles.smoke.perm_fig1.perm.warmup_rounds: 50 >= rounds = 50") for line in lines), \
        lines


def _sections_with(field: str) -> list[tuple[str, str]]:
    """(stage, section) of every compute stage whose config runs a PERM section with ``field``, from the table."""
    out = []
    for s in stages.compute_stages():
        cfg = validate_stage(PARAMS, s.name, machine=False)
        if hasattr(cfg, "rounds"):
            out += [(s.name, name) for name, sec in config.perm_sections(cfg) if field in type(sec).model_fields]
    return out


@pytest.mark.parametrize("stage,section", _sections_with("warmup_rounds"))
def test_every_stage_that_runs_a_perm_section_gets_the_warmup_rule(stage, section):
    rounds = stage_values(PARAMS, stage)["rounds"]
    assert any(line.startswith(f"{stage}.{section}.warmup_rounds: {rounds}")  # perm_fig4's own rule words it
               for line in problems(stage, {f"{section}.warmup_rounds": rounds}))


@pytest.mark.parametrize("stage", [s.name for s in stages.compute_stages()
                                   if {"eval_every", "rounds"} <= set(s.config_class().model_fields)])
def test_every_stage_with_eval_every_and_rounds_gets_the_evaluation_rule(stage):
    rounds = stage_values(PARAMS, stage)["rounds"]
    # flower_equivalence's deployment must end on an evaluated round: let it run them all
    other = {"deployment_rounds": rounds} if "deployment_rounds" in stage_values(PARAMS, stage) else {}
    assert any(line.startswith(f"{stage}.eval_every: {rounds + 1} > rounds = {rounds}")
               for line in problems(stage, {"eval_every": rounds + 1, **other}))


def test_the_committed_params_break_no_rule_in_any_profile():
    for profile in config.profile_names(PARAMS):
        for s in stages.compute_stages():
            cfg = validate_stage(PARAMS, s.name, profile, machine=False)
            assert config.cross_key_problems(cfg) == [], (profile, s.name)


def test_a_refused_stage_removes_nothing(tmp_path, monkeypatch):
    """The stage runner validates before anything: perm_fig2 with label_groups above its classes leaves an old
    output in place (it failed at run time, after the outputs were removed)."""
    from pflkit import notebooks
    from pflkit.paths import project_root
    params = with_values("perm_fig2", {"label_groups": 11})
    path = tmp_path / "params.yaml"
    import yaml
    path.write_text(yaml.safe_dump(params))
    removed = []
    monkeypatch.setattr(notebooks, "_remove", lambda p: removed.append(p))
    with pytest.raises(ConfigError, match=r"perm_fig2\.label_groups: 11 exceeds the 10 classes"):
        notebooks.run_stage("perm_fig2", "notebooks/perm/fig2_cifar10.ipynb", params_file=str(path))
    assert removed == [] and project_root() == ROOT


# ------------------------------------------------------------------ validation is linear in a list's length
class Counted:
    """A list entry that counts its comparisons (each its own hash, so a set compares it only on collisions)."""
    calls = 0

    def __init__(self, i):
        self.i = i

    def __eq__(self, other):
        Counted.calls += 1
        return isinstance(other, Counted) and self.i == other.i

    def __hash__(self):
        Counted.calls += 1
        return hash(self.i)


@pytest.mark.parametrize("n", [100, 400, 1600])
def test_the_repeat_check_compares_each_entry_a_bounded_number_of_times(n):
    Counted.calls = 0
    values = [Counted(i) for i in range(n)]
    assert config.unique(values) is values
    assert Counted.calls <= 4 * n, Counted.calls  # a pairwise check (values.count) makes n * (n - 1) comparisons


def test_validation_time_grows_linearly_with_a_lists_length():
    """perm_fig1 with 2,000 and 16,000 seeds (8x): linear is about 8x the time, quadratic 64x; the best of three."""
    def best(n):
        params = with_values("perm_fig1", {"seeds": list(range(n))})
        times = []
        for _ in range(3):
            start = time.perf_counter()
            validate_stage(params, "perm_fig1", machine=False)
            times.append(time.perf_counter() - start)
        return min(times)
    best(100)  # warm
    assert best(16000) < 24 * best(2000) + 0.05
