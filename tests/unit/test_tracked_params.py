"""Every value a notebook stage reads is a DVC parameter of that stage in every pipeline that runs it (issue 56):
the keys a stage's config reads are derived from the stage table (``stages.value_sources``: the mappings
``config.stage_values`` merges) and the config class's fields, and each one is covered (the key itself or a dotted
prefix of it) by a param dvc.yaml / pipelines/paper/dvc.yaml lists, whether or not params.yaml sets it today: an
overlay added later (``dvc exp run -S profiles.paper.perm_fig1.rounds=5``) re-runs the stage."""
import copy
from pathlib import Path

import pytest
import yaml

from pflkit import stages
from pflkit.config import RUNNER_KEYS, stage_values
from repo_files import load

ROOT = Path(__file__).resolve().parents[2]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
dvc_stages = load("scripts/dvc_stages.py", "dvc_stages_for_tracked_params")
PIPELINES = {profile: yaml.safe_load((ROOT / stages.pipeline_file(profile)).read_text())["stages"]
             for profile in (stages.DEFAULT_PROFILE, *stages.PIPELINE_PROFILES)}


def read_keys(stage: stages.Stage, profile: str) -> list[str]:
    """Every params.yaml key (dotted) the stage's config may take a value from under ``profile``: each field of
    its config class (the runner's keys aside) in each mapping its values are merged from."""
    fields = [f for f in stage.config_class().model_fields if f not in RUNNER_KEYS]
    return [f"{source}.{field}" for source in stages.value_sources(stage.section, profile) for field in fields]


def covered(key: str, listed: list[str]) -> bool:
    """Whether a change of ``key`` changes one of the DVC params ``listed`` (the key itself or a prefix)."""
    return any(key == p or key.startswith(p + ".") for p in listed)


@pytest.mark.parametrize("profile,stage", [(p, s.name) for p in PIPELINES for s in stages.STAGES])
def test_every_key_a_stage_reads_is_a_param_of_it_in_its_pipeline(profile, stage):
    entry = stages.get(stage)
    listed = PIPELINES[profile][stage]["params"]
    untracked = [k for k in read_keys(entry, profile) if not covered(k, listed)]
    assert not untracked, f"{stages.pipeline_file(profile)}: {stage} reads {untracked[:5]} but lists {listed}"
    # DVC refuses a listed key params.yaml lacks
    assert all(dvc_stages._has(PARAMS, p) for p in listed), (stage, listed)


@pytest.mark.parametrize("key,stage", [
    ("profiles.paper.perm_fig1.rounds", "perm_fig1"),        # no paper overlay today: adding one must re-run it
    ("profiles.paper.defaults.threads", "perm_fig2"),        # a profile-wide default, not in params.yaml today
    ("profiles.paper.perm_fig2.lr", "perm_fig2"),            # an overlay params.yaml has
    ("profiles.paper.figures.dpi", "perm_fig1_plot"),        # a plot stage's figure settings under the profile
    ("profiles.paper.defaults.device", "charles_fig1_plot"),
])
def test_a_new_overlay_key_is_tracked_in_the_paper_pipeline(key, stage):
    assert key in read_keys(stages.get(stage), "paper")
    assert covered(key, PIPELINES["paper"][stage]["params"]), (key, PIPELINES["paper"][stage]["params"])


@pytest.mark.parametrize("key,stage", [("defaults.threads", "perm_fig1_plot"), ("figures.dpi", "perm_fig1_plot"),
                                       ("defaults.device", "perm_fig1"), ("perm_fig1.rounds", "perm_fig1")])
def test_the_default_pipeline_tracks_defaults_and_the_section(key, stage):
    assert covered(key, PIPELINES["default"][stage]["params"])
    assert not covered(f"profiles.paper.{key}", PIPELINES["default"][stage]["params"])  # no profile is read there


def test_stage_values_reads_exactly_the_value_sources_in_order():
    """The sources the test derives from are what ``stage_values`` merges: a value set in each, then removed from
    the last one after the other, shows each source read and a later one winning."""
    params = copy.deepcopy(PARAMS)
    params["profiles"]["paper"]["defaults"] = {}
    params["profiles"]["paper"].setdefault("perm_fig1", {})
    sources = stages.value_sources("perm_fig1", "paper")
    assert sources == ("defaults", "perm_fig1", "profiles.paper.defaults", "profiles.paper.perm_fig1")

    def node(path):
        out = params
        for part in path.split("."):
            out = out[part]
        return out

    for i, source in enumerate(sources):
        node(source)["threads"] = i + 1
    for i in reversed(range(len(sources))):
        assert stage_values(params, "perm_fig1", "paper")["threads"] == i + 1, sources[i]
        del node(sources[i])["threads"]


@pytest.mark.parametrize("overlay,expected", [
    (None, ["defaults", "perm_fig1", "profiles.paper"]),                                     # no overlay at all
    ({"perm_fig2": {"rounds": 3}}, ["defaults", "perm_fig1", "profiles.paper"]),             # another stage's only
    ({"defaults": {}, "perm_fig1": {}}, ["defaults", "perm_fig1", "profiles.paper.defaults",
                                         "profiles.paper.perm_fig1"]),                       # both there: precise
    ({"defaults": {}}, ["defaults", "perm_fig1", "profiles.paper"]),                         # the stage's missing
    ({"perm_fig1": {"rounds": 3}}, ["defaults", "perm_fig1", "profiles.paper"]),             # the defaults missing
])
def test_the_generator_lists_each_source_or_its_longest_prefix_params_yaml_has(overlay, expected):
    params = {"defaults": {"threads": 1}, "perm_fig1": {"rounds": 1}, "perm_fig2": {"rounds": 1},
              "profiles": {"paper": overlay}}
    assert dvc_stages.tracked_params("perm_fig1", "paper", params) == expected
    assert dvc_stages.tracked_params("perm_fig1", "default", params) == ["defaults", "perm_fig1"]
    assert all(dvc_stages._has(params, k) for k in expected if overlay is not None)
