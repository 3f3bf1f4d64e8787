"""The one memory estimate (``StageConfig.memory_estimate``): a stage config says what it holds
(``footprint()``: data, models and work, each with the key that drives it); the estimate and the key it names
are computed in one place."""
import ast
from pathlib import Path

import pytest
from pydantic import BaseModel

from pflkit import config as config_module
from pflkit import stages
from pflkit.config import Footprint, StageConfig, load_params, model_bytes, stage_config, stage_values
from pflkit.paths import project_root

ROOT = project_root()
SRC = Path(__file__).resolve().parents[2] / "src" / "pflkit"


def test_memory_estimate_is_defined_once():
    defs = [f"{p.relative_to(SRC)}:{n.lineno}" for p in SRC.rglob("*.py")
            for n in ast.walk(ast.parse(p.read_text()))
            if isinstance(n, ast.FunctionDef) and n.name == "memory_estimate"]
    assert defs == [f"config.py:{StageConfig.memory_estimate.__code__.co_firstlineno}"], defs
    overridden = [s.name for s in stages.compute_stages()
                  if stage_config(s.name).memory_estimate is not StageConfig.memory_estimate]
    assert not overridden


def test_parts_add_with_the_key_of_the_larger_addend():
    a = Footprint(data=10, models=5, work=1, data_key="pool_size", models_key="num_clients", work_key="batch_size")
    b = Footprint(models=7, work=4, models_key="methods")  # work without a key of its own
    s = a + b
    assert (s.data, s.models, s.work, s.bytes) == (10, 12, 5, 27)
    assert (s.data_key, s.models_key, s.work_key) == ("pool_size", "methods", "batch_size")
    assert s.key == "methods"  # models (12) is the largest part
    assert max(a, b) is a and max(b, a) is a  # 16 > 11 bytes
    assert Footprint().key == "" and Footprint().bytes == 0
    assert model_bytes(1_000, 10, 3) == 120_000  # float32 parameters


@pytest.fixture(scope="module")
def params():
    return load_params(ROOT / "params.yaml")


def _names_a_field(cfg, key: str) -> bool:
    """Whether ``key`` (``a``, ``a.b``, ``tasks.<name>.c``) is a field path of ``cfg``."""
    node = cfg
    for part in key.split("."):
        if isinstance(node, dict):
            if part not in node:
                return False
            node = node[part]
        elif isinstance(node, BaseModel) and part in type(node).model_fields:
            node = getattr(node, part)
        else:
            return False
    return True


@pytest.mark.parametrize("profile", ["default", "paper"])
def test_every_stage_s_estimate_names_a_key_of_its_config(params, monkeypatch, profile):
    """The key named when a stage does not fit is one the researcher can set in the stage's section (perm_fig3's
    used to name ``hidden``, which its config has not: its network is fixed)."""
    monkeypatch.setattr(config_module, "image_may_load", lambda name, root="data/raw", allow_download=False: False)
    seen = 0
    for s in stages.compute_stages():
        cfg = stage_config(s.name)(**stage_values(params, s.name, profile))
        need, key = cfg.memory_estimate()
        if need:
            seen += 1
            assert key and _names_a_field(cfg, key), (s.name, key)
    assert seen >= 20
