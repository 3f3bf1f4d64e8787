"""The settings taken from the authors' code (issue 57, docs/papers.md "Beside the authors' code"): every profile
that runs the stage keeps them, and the code paths read them."""
import pytest

from pflkit.config import ConfigError
from pflkit.experiments.charles_nn import _task_setup
from pflkit.experiments.curves import METHODS
from stage_params import build


@pytest.mark.parametrize("profile", ["default", "paper", "smoke"])
@pytest.mark.parametrize("stage", ["charles_fig6", "charles_fig12", "charles_fig13"])
def test_charles_nn_stages_draw_the_k_batches_as_tff_does(stage, profile):
    """google-research/federated: shuffle().repeat().batch(B).take(K), i.e. passes over shuffled rows."""
    assert build(stage, profile).batch_order == "shuffled"


def test_the_grid_trains_on_data_in_the_configured_batch_order():
    cfg = build("charles_fig12", "smoke")
    for t in cfg.tasks.values():
        _, data, _, _ = _task_setup(cfg, t)
        assert data.batch_order == "shuffled"
        _, data, _, _ = _task_setup(cfg.model_copy(update={"batch_order": "replacement"}), t)
        assert data.batch_order == "replacement"
        break


@pytest.mark.parametrize("profile", ["default", "paper"])
@pytest.mark.parametrize("stage", ["perm_fig1", "perm_fig2", "perm_fig4"])
def test_torchfed_variant_runs_beside_alg1_with_the_sources_warmup(stage, profile):
    cfg = build(stage, profile)
    assert {"perm", "perm_torchfed"} <= set(cfg.methods)
    assert cfg.perm_torchfed.warmup_rounds == 10  # configs/_base_/federated/fedshuffle.py: num_comms_warmup
    algo = METHODS["perm_torchfed"].make(None, cfg)
    assert (algo.visit, algo.alpha_init, algo.update_every, algo.lr) == \
        ("interpolate", "correlation", None, cfg.lr["perm_torchfed"])
    assert algo.warmup_lr == cfg.lr["fedavg"]


def test_a_warmup_as_long_as_the_run_is_refused_for_the_variant_too():
    with pytest.raises(ConfigError, match=r"perm_torchfed\.warmup_rounds: 5 >= rounds = 5"):
        build("perm_fig1", "smoke", methods=["perm", "perm_torchfed"], lr={"perm": 1.0, "perm_torchfed": 1.0},
              perm_torchfed={"warmup_rounds": 5})
    with pytest.raises(ConfigError, match="perm_torchfed: not given, but methods lists perm_torchfed"):
        build("perm_fig1", "smoke", methods=["perm", "perm_torchfed"], lr={"perm": 1.0, "perm_torchfed": 1.0},
              perm_torchfed=None)
