"""The final models run_grid keeps (GridRun.params), and their re-evaluation as run_grid last evaluated each
setting (charles_nn.evaluate_final): the recorded last evaluations, exactly, diverged settings included."""
import pandas as pd
import pytest
import torch

from pflkit.experiments import charles_nn as E
from test_local_update import tiny_data, tiny_model  # the same tiny problem (tests/unit is on sys.path)

SETTINGS = [E.Setting(0.05, 0.1), E.Setting(1e4, 1e3), E.Setting(0.1, 0.3, "nesterov", 0.9), E.Setting(0.02, 0.2)]


@pytest.mark.parametrize("settings_chunk", [None, 1, 3])
def test_reevaluated_final_models_give_the_recorded_last_evaluations_exactly(settings_chunk):
    data, model = tiny_data(num_clients=4), tiny_model()
    evaluate = E.make_evaluator(model, {"train": E.eval_batch(data, "train", 100, 0)})
    run = E.run_grid(model, data, SETTINGS, rounds=4, local_steps=3, batch_size=2, clients_per_round=2, seed=0,
                     evaluate=evaluate, settings_chunk=settings_chunk)
    assert run.diverged["setting"].tolist() == [1] and int(run.diverged["round"].iloc[0]) < 4
    assert {k: tuple(v.shape[:1]) for k, v in run.params.items()} == {k: (4,) for k in run.params}
    final = E.final_evaluations(run.history.assign(task="t"))
    assert final.groupby("setting")["round"].first().tolist() == [4, int(run.diverged["round"].iloc[0]), 4, 4]
    assert sorted(final["metric"].unique()) == ["train_accuracy", "train_loss"]
    again = E.evaluate_final(evaluate, run.params, E.last_rounds(final, len(SETTINGS)), settings_chunk)
    pd.testing.assert_frame_equal(E.final_evaluations(again.assign(task="t")), final, check_exact=True)


def test_final_models_are_the_last_iterates_and_a_diverged_setting_keeps_the_one_it_was_caught_at():
    data, model = tiny_data(num_clients=4), tiny_model()
    seen = []

    def grab(params):
        seen.append({k: v.clone() for k, v in params.items()})
        return {"train_loss": torch.where(torch.tensor([p.abs().max() > 50 for p in params["0.weight"]]),
                                          torch.tensor(1e9), torch.tensor(1.0))[: len(params["0.weight"])]}

    run = E.run_grid(model, data, SETTINGS[:2], rounds=3, local_steps=3, batch_size=2, clients_per_round=2, seed=0,
                     evaluate=grab)
    caught = int(run.diverged["round"].iloc[0])
    for k, v in run.params.items():
        assert torch.equal(v[0], seen[-1][k][0])  # evaluated last at the final round, alone
        assert torch.equal(v[1], seen[caught][k][1])  # the iterate of the round it was caught
