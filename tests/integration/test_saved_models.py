"""Trained models are pipeline outputs: every PERM training stage, run at its smoke configuration, saves its
models (pflkit.model_store), and evaluating the models loaded back gives the stage's recorded final numbers
exactly (the same floats, compared with ==: the evaluation code and data are the same, only the models come
from disk). The Charles et al. NN stages have their own file (test_saved_models_charles.py)."""
from pathlib import Path

import pandas as pd
import pytest

from pflkit import model_store
from pflkit.config import load_params, validate_stage
from pflkit.experiments import perm, perm_hetero

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _smoke(stage: str):
    return validate_stage(load_params(ROOT / "params.yaml"), stage, "smoke")


def _assert_exactly(saved: pd.DataFrame, recorded: pd.DataFrame):
    assert list(saved.index) == list(recorded.index) and list(saved.columns) == list(recorded.columns)
    both_nan = saved.isna() & recorded.isna()
    diff = [(r, c, saved.loc[r, c], recorded.loc[r, c]) for r in saved.index for c in saved.columns
            if not saved.loc[r, c] == recorded.loc[r, c] and not both_nan.loc[r, c]]
    assert not diff, diff[:5]


@pytest.mark.parametrize("stage, figure", [("perm_fig1", perm.fig1), ("perm_fig2", perm.image_curves),
                                           ("perm_fig4", perm.image_curves)])
def test_curve_stage_models_reproduce_the_recorded_final_metrics(stage, figure, tmp_path):
    cfg = _smoke(stage)
    result = figure(cfg, show_progress=False, checkpoint=False)
    written = perm.save_models(cfg, result, tmp_path)
    assert len(written) == len(cfg.methods) * len(cfg.seeds)
    index = (tmp_path / model_store.INDEX).read_text()
    assert '"stage": "' + stage + '"' in index and all(p.name in index for p in written)
    recorded = pd.DataFrame(result.metrics["final"]).T.drop(index="Majority class")
    saved = perm.saved_final(cfg, tmp_path)
    _assert_exactly(saved, recorded.loc[saved.index, saved.columns])
    # the loaded state is the algorithm's: PERM's alpha comes back as trained
    payload = model_store.load(tmp_path / model_store.file_name("PERM", cfg.seeds[0]))
    state = result.states[("PERM", cfg.seeds[0])]
    assert payload["round"] == cfg.rounds and payload["metrics"]["accuracy"] >= 0
    if state.alpha is not None:
        assert payload["state"]["fields"]["alpha"]["value"].equal(state.alpha.cpu())


def test_saved_bytes_do_not_depend_on_the_run_or_the_file_name(tmp_path):
    """The same final state gives the same file (DVC's hash of models/<stage> changes only with the models)."""
    cfg = _smoke("perm_fig1").model_copy(update={"methods": ["fedavg", "perm"], "seeds": [0]})
    first = perm.fig1(cfg, show_progress=False, checkpoint=False)
    again = perm.fig1(cfg, show_progress=False, checkpoint=False)
    a = perm.save_models(cfg, first, tmp_path / "a")
    b = perm.save_models(cfg, again, tmp_path / "b")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]
    assert (tmp_path / "a" / model_store.INDEX).read_bytes() == (tmp_path / "b" / model_store.INDEX).read_bytes()


def test_a_model_file_for_other_data_is_refused(tmp_path):
    cfg = _smoke("perm_fig1").model_copy(update={"methods": ["fedavg"], "seeds": [0]})
    perm.save_models(cfg, perm.fig1(cfg, show_progress=False, checkpoint=False), tmp_path)
    other = cfg.model_copy(update={"samples_per_client": cfg.samples_per_client + 10})
    with pytest.raises(model_store.CheckpointError, match="the data differs"):
        perm.saved_final(other, tmp_path)


def test_fig6_alpha_convergence_and_hetero_models_reproduce_their_tables(tmp_path):
    cfg = _smoke("perm_fig6")
    result = perm.fig6(cfg)
    perm.save_fig6_models(cfg, result, tmp_path / "fig6")
    _assert_exactly(perm.saved_fig6(cfg, tmp_path / "fig6"), result.table)

    cfg = _smoke("perm_alpha_convergence")
    result = perm.alpha_convergence(cfg)
    perm.save_convergence_models(cfg, result, tmp_path / "conv")
    _assert_exactly(perm.saved_convergence(cfg, tmp_path / "conv"), result.convergence)

    cfg = _smoke("perm_hetero")
    result = perm_hetero.hetero_experiment(cfg, show_progress=False)
    perm_hetero.save_models(cfg, result, tmp_path / "hetero")
    saved = perm_hetero.saved_groups(cfg, tmp_path / "hetero")
    _assert_exactly(saved, result.groups.drop(index="Majority class").loc[saved.index])


def test_flower_equivalence_saves_the_in_process_models_and_they_reproduce_its_table(tmp_path):
    from pflkit.experiments import flower
    cfg = _smoke("flower_equivalence")
    result = flower.equivalence(cfg, engines=[], show_progress=False)  # in-process and the one-process protocol
    written = flower.save_models(cfg, result, tmp_path)
    assert len(written) == len(cfg.methods) * len(cfg.seeds)
    saved = perm.saved_final(cfg, tmp_path)
    recorded = result.table.xs(flower.IN_PROCESS, level="engine")
    for method in saved.index:
        for metric in ("accuracy", "loss"):
            assert saved.loc[method, f"{metric}_mean"] == recorded.loc[method, metric], (method, metric)
