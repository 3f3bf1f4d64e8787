"""Trained models are pipeline outputs for the Charles & Konecny NN stages too: each of charles_fig6, charles_fig12
and charles_fig13, run at its smoke configuration, saves the final model of every grid setting (stacked per task,
pflkit.model_store), and re-evaluating the models loaded back (charles_nn.saved_final: the federation rebuilt
from the config, the same fixed evaluation sample) gives every setting's recorded last evaluation exactly (the
same floats, compared with ==): both the values saved beside the models and those the stage wrote to its
history (history.csv, or grid.csv where the history keeps only the tuned settings)."""
import json
from pathlib import Path

import pandas as pd
import pytest

from pflkit import model_store
from pflkit.config import load_params, validate_stage
from pflkit.experiments import charles_nn

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow
KEYS = ["task", "setting", "metric"]


def _smoke(stage: str):
    return validate_stage(load_params(ROOT / "params.yaml"), stage, "smoke")


#: stage, figure function, the frame holding every recorded setting's evaluations, the metrics the stage reports
CASES = [("charles_fig6", charles_nn.fig6, "grid", {"test_accuracy", "test_loss"}),
         ("charles_fig12", charles_nn.fig12, "history", {"train_loss"}),
         ("charles_fig13", charles_nn.fig13, "grid", {"train_loss"})]


@pytest.mark.parametrize("stage, figure, frame, metrics", CASES, ids=[c[0] for c in CASES])
def test_nn_stage_models_reproduce_the_recorded_last_evaluations(stage, figure, frame, metrics, tmp_path):
    cfg = _smoke(stage)
    result = figure(cfg)
    written = charles_nn.save_models(cfg, result, tmp_path)
    assert [p.name for p in written] == [f"{task}.pt" for task in cfg.tasks]
    index = json.loads((tmp_path / model_store.INDEX).read_text())
    assert index["stage"] == stage and [f["file"] for f in index["files"]] == sorted(p.name for p in written)
    assert index["config"]["tasks"].keys() == cfg.tasks.keys()

    saved = charles_nn.saved_final(cfg, tmp_path)
    settings = len(model_store.tensors(written[0])["settings"])
    assert len(saved) == len(cfg.tasks) * settings * 2  # every setting of every task: loss and accuracy
    pd.testing.assert_frame_equal(saved, charles_nn.saved_recorded(cfg, tmp_path), check_exact=True)

    recorded = charles_nn.final_evaluations(getattr(result, frame))
    recorded = recorded[recorded["metric"].isin(metrics)]
    # Fig. 6's "alpha = 0" curve re-uses the "no momentum" run under new setting numbers (>= the grid's size)
    originals = recorded[recorded["setting"] < settings]
    assert set(originals["metric"]) == metrics and len(originals) >= len(cfg.tasks) * len(metrics)
    both = originals.merge(saved, on=KEYS, how="left", suffixes=("", "_saved"), validate="one_to_one")
    assert both["round"].tolist() == both["round_saved"].tolist()
    assert both["value"].tolist() == both["value_saved"].tolist()  # exactly: no tolerance

    again = charles_nn.save_models(cfg, result, tmp_path / "again")
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]


def test_models_for_other_data_are_refused(tmp_path):
    cfg = _smoke("charles_fig6")
    charles_nn.save_models(cfg, charles_nn.fig6(cfg), tmp_path)
    with pytest.raises(model_store.CheckpointError, match="the data differs"):
        charles_nn.saved_final(cfg.model_copy(update={"seed": cfg.seed + 1}), tmp_path)
