"""One source for every value (issue 27): params.yaml sets every stage value, and the config classes carry no
competing default. For every stage, no field of its config class (nested sections included) has a code default,
except the documented ``EXCEPTIONS`` of scripts/config_defaults.py; and every required field is set by the stage's
values (``defaults`` merged under its section) under every profile."""
from typing import Annotated, Literal

import pytest
from pydantic import Field

from pflkit.config import RUNNER_KEYS, Section, StageConfig, profile_names, stage_config, stage_values
from stage_params import PARAMS
from repo_files import load

defaults = load("scripts/config_defaults.py", register=True)  # its dataclass needs it in sys.modules

STAGES = defaults.audited_stages(PARAMS)


def test_every_stage_is_audited():
    assert "perm_fig1" in STAGES and "charles_fig12" in STAGES and "chayti_fig4" in STAGES
    assert len(STAGES) == 28  # 27 compute stages and one plot stage (they share the figures section)


def test_no_stage_value_has_a_code_default():
    problems = defaults.violations(defaults.audit(PARAMS))
    assert problems == [], "\n".join(problems)


def test_no_default_is_left_under_any_profile():
    """Not even in a profile's overlays: each task of Charles's stages gives every key of its class."""
    left = {(r.owner, r.path) for profile in profile_names(PARAMS) for r in defaults.audit(PARAMS, profile)}
    assert defaults.EXCEPTIONS == {} and left == set()


@pytest.mark.parametrize("profile", profile_names(PARAMS))
def test_every_required_key_is_set_by_params(profile):
    for stage in STAGES:
        values = stage_values(PARAMS, stage, profile)
        assert defaults.unset_required(stage_config(stage), values) == [], (stage, profile)


# -------------------------------------------------------------------------------- the rule catches a violation
class _Inner(Section):
    a: float = 0.5
    b: int


class _Image(Section):
    kind: Literal["image"]
    width: float = 1.0


class _Text(Section):
    kind: Literal["text"]
    hidden: int


class _Fake(StageConfig):
    rounds: int = Field(10, ge=1)
    lr: float
    steps: int = 3
    inner: _Inner
    tasks: dict[str, Annotated[_Image | _Text, Field(discriminator="kind")]]


def _fake_values(**changes):
    return {"device": "cpu", "threads": "auto", "executor": "local", "rounds": 20, "lr": 0.1,
            "inner": {"a": 0.9, "b": 1}, "tasks": {}, **changes}


def test_a_competing_default_a_code_only_one_and_a_nested_one_are_caught():
    rows = defaults.field_rows(_Fake, _fake_values(), "fake")
    assert [(r.path, r.kind, r.default, r.value) for r in rows] == [
        ("rounds", "competing", 10, 20),
        ("steps", "code-only", 3, None),
        ("inner.a", "competing", 0.5, 0.9)]
    assert [r.disagrees for r in rows] == [True, False, True]
    assert defaults.violations(rows, {}) == [
        "fake.rounds: competing default 10 in _Fake (params.yaml: 20)",
        "fake.steps: code-only default 3 in _Fake (params.yaml does not set it)",
        "fake.inner.a: competing default 0.5 in _Inner (params.yaml: 0.9)"]
    assert defaults.violations(rows, {("_Inner", "a"): "why", ("_Fake", "rounds"): "why"}) == [
        "fake.steps: code-only default 3 in _Fake (params.yaml does not set it)"]


def test_a_default_inside_a_discriminated_union_is_caught_for_its_member_only():
    rows = defaults.field_rows(_Fake, _fake_values(tasks={"a": {"kind": "image"}, "b": {"kind": "text", "hidden": 2}}),
                               "fake")
    assert [(r.path, r.owner, r.kind) for r in rows if r.path.startswith("tasks.")] == [
        ("tasks.a.width", "_Image", "code-only")]


def test_a_required_key_params_does_not_set_is_caught():
    values = _fake_values()
    del values["lr"]
    assert defaults.unset_required(_Fake, values) == ["stage", "results_dir", "figures_dir", "lr"]
    assert [k for k in defaults.unset_required(_Fake, values) if k not in RUNNER_KEYS] == ["lr"]
