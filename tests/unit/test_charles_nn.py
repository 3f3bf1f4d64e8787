"""Charles & Konecny NN experiments: model shapes, the vmappable char-LSTM against nn.LSTM, the batched
(gamma, eta, momentum, alpha) grid against LocalUpdate and its reference loop, tuning and divergence."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from pflkit.algorithms.local_update import LocalUpdate, ServerOpt, sample_clients, theta_1_to_K
from pflkit.config import ConfigError
from pflkit.data.federated import FederatedDataset
from pflkit.engine import FunctionalModel
from pflkit.experiments import charles_nn as E
from pflkit.models.femnist import femnist_cnn
from pflkit.models.lstm import CharLSTM, char_lstm
from pflkit.models.resnet import resnet18_gn

from reference import local_update as ref
from stage_params import build
from test_local_update import tiny_data, tiny_model  # the same tiny problem (tests/unit is on sys.path)


def test_femnist_cnn_shapes_and_paper_size():
    m = femnist_cnn((1, 28, 28), 62)
    assert m(torch.rand(3, 1, 28, 28)).shape == (3, 62)
    # Reddi et al.'s CNN: 32 and 64 3x3 filters, dense 128 on 64 x 12 x 12 features, 62 outputs
    assert sum(p.numel() for p in m.parameters()) == ((9 * 32 + 32) + (9 * 32 * 64 + 64) + (9216 * 128 + 128)
                                                      + (128 * 62 + 62))
    assert femnist_cnn((1, 28, 28), 10, width=0.25)(torch.rand(2, 1, 28, 28)).shape == (2, 10)
    with pytest.raises(ValueError, match="width"):
        femnist_cnn(width=0)


def test_resnet18_gn_shapes_no_buffers_and_depth():
    m = resnet18_gn((3, 32, 32), 100, width=0.125)
    assert m(torch.rand(2, 3, 32, 32)).shape == (2, 100)
    assert not list(m.buffers())  # GroupNorm: stackable by the engine
    assert not any(isinstance(x, nn.BatchNorm2d) for x in m.modules())
    convs = [x for x in m.modules() if isinstance(x, nn.Conv2d) and x.kernel_size == (3, 3)]
    assert len(convs) == 17  # stem + 8 BasicBlocks x 2: ResNet-18's 17 3x3 convs (+ the dense head)
    assert resnet18_gn((1, 28, 28), 10, width=0.0625)(torch.rand(2, 1, 28, 28)).shape == (2, 10)


def test_char_lstm_shapes_and_equals_nn_lstm():
    torch.manual_seed(0)
    model = char_lstm(90, 8, 16, 2)
    x = torch.randint(0, 90, (3, 80))
    logits = model(x.float())  # the engine stores token ids as float
    assert logits.shape == (3, 90, 80)
    lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
    model.load_from_lstm(lstm)
    expected = model.out(lstm(model.embed(x))[0]).transpose(1, 2)
    assert torch.allclose(model(x.float()), expected, atol=1e-5)
    y = torch.randint(0, 90, (3, 80))
    y[:, 70:] = -100  # padding is ignored by the loss
    with torch.no_grad():
        loss = nn.functional.cross_entropy(model(x.float()), y)
    assert torch.isfinite(loss) and abs(float(loss) - math.log(90)) < 0.5


def test_char_lstm_runs_under_the_engine_vmap():
    fm = FunctionalModel(lambda: CharLSTM(90, 8, 8, 2))
    p0, p1 = fm.init(0), fm.init(1)
    stacked = {k: torch.stack([p0[k], p1[k]]) for k in p0}
    x = torch.randint(0, 90, (2, 4, 80)).float()
    y = torch.randint(0, 90, (2, 4, 80))
    grads, losses = fm.batched_grad(stacked, x, y)
    for i, p in enumerate((p0, p1)):
        leaf = {k: v.clone().requires_grad_(True) for k, v in p.items()}
        g = torch.autograd.grad(fm.loss(leaf, x[i], y[i]), list(leaf.values()))
        for (k, _), gk in zip(leaf.items(), g):
            assert torch.allclose(grads[k][i], gk, atol=1e-5), k
        assert torch.isclose(losses[i], fm.loss(p, x[i], y[i]), atol=1e-5)


def no_eval(params):
    return {"train_loss": torch.zeros(next(iter(params.values())).shape[0])}


def final_params(model, data, settings, rounds, **kw):
    """run_grid's last iterate per setting (captured through the evaluator)."""
    seen = {}

    def grab(params):
        seen["x"] = {k: v.clone() for k, v in params.items()}
        return no_eval(params)

    E.run_grid(model, data, settings, rounds=rounds, evaluate=grab, eval_every=rounds, **kw)
    return seen["x"]


def test_grid_one_setting_matches_local_update_and_reference_loop():
    data, model = tiny_data(num_clients=4), tiny_model()
    kw = dict(local_steps=3, batch_size=2, clients_per_round=2, seed=5)
    x1 = final_params(model, data, [E.Setting(gamma=0.1, eta=0.7)], 1, **kw)
    # the reference loop with the same draws: clients, then [K, M, B] rows, from one generator
    g = torch.Generator().manual_seed(5)
    clients = sample_clients(data.num_clients, 2, g)
    rows = data.sample_indices(clients.unsqueeze(0).expand(3, 2), 2, g)
    x0 = model.init(5)
    q = ref.local_update_pseudo_gradient(model.loss, x0, data, clients.tolist(), rows, alpha=0.0, gamma=0.1,
                                         theta=[1.0, 1.0, 1.0])
    for k in x0:
        assert torch.allclose(x1[k][0], x0[k] - 0.7 * q[k], atol=1e-5), k
    assert not torch.allclose(x1["0.weight"][0], x0["0.weight"])
    # and LocalUpdate itself over 3 rounds, with Nesterov momentum
    algo = LocalUpdate(model, theta=theta_1_to_K(3), gamma=0.1, batch_size=2, clients_per_round=2,
                       server_opt=ServerOpt("nesterov", 0.3, 0.9))
    s = algo.init(data, 5)
    for _ in range(3):
        s = algo.round(s)
    x3 = final_params(model, data, [E.Setting(0.1, 0.3, "nesterov", 0.9)], 3, **kw)
    for k in s.w:
        assert torch.allclose(x3[k][0], s.w[k], atol=1e-5), k


def test_grid_of_settings_equals_separate_local_update_runs():
    """One example per client and all clients each round: no randomness, so the batched grid (mixed
    servers, momenta, alphas, gammas) must equal each setting run alone by LocalUpdate."""
    data = tiny_data(num_clients=3, n=2)
    data = FederatedDataset.from_client_arrays([data.client(j) for j in range(3)],
                                               [data.client(j, "test") for j in range(3)], 2, "tiny1")
    data = FederatedDataset(data.x_train[[0, 2, 4]], data.y_train[[0, 2, 4]], torch.arange(3),
                            torch.ones(3, dtype=torch.long), data.x_test, data.y_test, data.test_offsets,
                            data.test_sizes, 2, "one-each")
    model = tiny_model()
    settings = [E.Setting(0.1, 0.5), E.Setting(0.05, 0.2, "heavy_ball", 0.9), E.Setting(0.2, 0.3, "nesterov", 0.5),
                E.Setting(0.1, 0.5, alpha=1.0), E.Setting(0.0, 0.4)]
    grid = final_params(model, data, settings, 3, local_steps=4, batch_size=3, clients_per_round=None, seed=2)
    for i, s in enumerate(settings):
        opt = ServerOpt(s.server, s.eta, s.momentum)
        algo = LocalUpdate(model, theta=theta_1_to_K(4), gamma=s.gamma, alpha=s.alpha, batch_size=3, server_opt=opt)
        st = algo.init(data, 2)
        for _ in range(3):
            st = algo.round(st)
        for k in st.w:
            assert torch.allclose(grid[k][i], st.w[k], atol=1e-5), (i, k)


def test_grid_in_chunks_of_settings_equals_the_whole_grid_when_draws_are_deterministic():
    """settings_chunk only splits the calls: on the one-example-per-client data (no randomness in the
    minibatches) chunks of 2 give the same iterates as one call (float32, atol as the test above), and
    the evaluator sees at most 2 settings at once."""
    data = tiny_data(num_clients=3, n=2)
    data = FederatedDataset(data.x_train[[0, 2, 4]], data.y_train[[0, 2, 4]], torch.arange(3),
                            torch.ones(3, dtype=torch.long), data.x_test, data.y_test, data.test_offsets,
                            data.test_sizes, 2, "one-each")
    model = tiny_model()
    settings = [E.Setting(0.1, 0.5), E.Setting(0.05, 0.2, "heavy_ball", 0.9), E.Setting(0.2, 0.3, "nesterov", 0.5),
                E.Setting(0.1, 0.5, alpha=1.0), E.Setting(0.0, 0.4)]
    kw = dict(local_steps=4, batch_size=3, clients_per_round=None, seed=2)
    whole = final_params(model, data, settings, 3, **kw)
    calls = []

    def grab(params):
        calls.append({k: v.clone() for k, v in params.items()})
        return no_eval(params)

    E.run_grid(model, data, settings, rounds=3, evaluate=grab, eval_every=1, settings_chunk=2, **kw)
    sizes = [next(iter(c.values())).shape[0] for c in calls]
    assert sizes == [2, 2, 1] * 4  # rounds 0..3, each evaluated in chunks of 2
    chunked = {k: torch.cat([c[k] for c in calls[-3:]]) for k in whole}
    for k in whole:
        assert torch.allclose(chunked[k], whole[k], atol=1e-5), k
    with pytest.raises(ValueError, match="settings_chunk must be a positive int"):
        E.run_grid(model, data, settings, rounds=1, evaluate=no_eval, settings_chunk=0, **kw)


def test_grid_drops_and_reports_diverged_settings():
    data, model = tiny_data(num_clients=4), tiny_model()
    batches = {"train": E.eval_batch(data, "train", 100, 0)}
    run = E.run_grid(model, data, [E.Setting(0.05, 0.1), E.Setting(1e4, 1e3)], rounds=4, local_steps=3,
                     batch_size=2, clients_per_round=2, seed=0, evaluate=E.make_evaluator(model, batches))
    assert run.diverged["gamma"].tolist() == [1e4]
    ok = run.history[(run.history.gamma == 0.05) & (run.history.metric == "train_loss")]
    assert ok["round"].tolist() == [0, 1, 2, 3, 4] and ok["value"].iloc[-1] < ok["value"].iloc[0]
    bad = run.history[run.history.gamma == 1e4]
    assert bad["round"].max() < 4  # no longer computed once diverged


def _scripted_run(losses, patience, rounds=4):
    """run_grid over settings A and B whose watched loss at evaluation e is ``losses[e]`` (for the settings
    still alive, in order); returns the diverged frame and how many settings each evaluation saw."""
    data, model = tiny_data(num_clients=4), tiny_model()
    seen = []

    def scripted(params):
        n = next(iter(params.values())).shape[0]
        seen.append(n)
        return {"train_loss": torch.tensor(losses[len(seen) - 1][:n])}

    run = E.run_grid(model, data, [E.Setting(0.05, 0.1), E.Setting(0.05, 0.2)], rounds=rounds, local_steps=1,
                     batch_size=2, clients_per_round=2, seed=0, evaluate=scripted, diverge_factor=5.0,
                     diverge_patience=patience)
    return run.diverged, seen


def test_diverge_patience_lets_a_transient_spike_run_on_and_stops_a_lasting_one():
    # A spikes once (10 > 5 x 1) and comes back; B stays above from evaluation 1 on
    losses = [[1.0, 1.0], [10.0, 10.0], [1.0, 10.0], [1.0, 10.0], [1.0, 10.0]]
    dead, seen = _scripted_run(losses, patience=1)
    assert dead[["setting", "round"]].values.tolist() == [[0, 1], [1, 1]] and seen == [2, 2]
    assert dead["reason"].tolist() == ["train_loss 10 > 5 x initial 1"] * 2
    dead, seen = _scripted_run(losses, patience=3)
    assert dead[["setting", "round"]].values.tolist() == [[1, 3]] and seen == [2, 2, 2, 2, 1]
    assert dead["reason"].tolist() == ["train_loss 10 > 5 x initial 1 at 3 evaluations in a row"]
    dead, _ = _scripted_run([[1.0, 1.0], [float("nan"), 1.0], [1.0], [1.0], [1.0]], patience=3)
    assert dead[["setting", "round", "reason"]].values.tolist() == [[0, 1, "non-finite"]]  # never waits
    with pytest.raises(ValueError, match="diverge_patience must be a positive int"):
        _scripted_run(losses, patience=0)


def test_pick_best_uses_mean_of_last_window():
    rows = []
    for s, vals in {0: [1, 1, 5, 5], 1: [9, 9, 4, 4], 2: [0, 0, 0, 0]}.items():
        for r, v in enumerate(vals):
            rows.append({"round": r, "setting": s, "metric": "train_loss", "value": v, "gamma": 0.1 * (s < 2),
                         "eta": float(s), "variant": "v"})
    h = pd.DataFrame(rows)
    best = E.pick_best(h, ["gamma"], "train_loss", 2, "min")
    assert dict(zip(best["gamma"], best["setting"])) == {0.0: 2, 0.1: 1}
    assert E.pick_best(h, ["variant"], "train_loss", 2, "max")["setting"].tolist() == [0]


def test_configs_reject_bad_values_naming_the_key():
    # a small task: the section's defaults (M = 10, B = 20, a 2 x 256 LSTM) would need ~40 GiB (memory_estimate)
    base = dict(stage="charles_fig12", results_dir="r", figures_dir="f", device="cpu", local_steps=2, eta=0.01,
                tasks={"s": {"dataset": "shakespeare", "rounds": 1, "clients_per_round": 2, "batch_size": 4,
                             "root": "data/raw", "num_clients": None, "test_fraction": 0.2, "eval_samples": None,
                             "source": "auto", "hidden": 256}})
    build("charles_fig12", **base, gammas=[0, 0.1])
    with pytest.raises(ConfigError, match="gammas"):
        build("charles_fig12", **base, gammas=[-1])
    with pytest.raises(ConfigError, match="dataset"):
        build("charles_fig12", **{**base, "gammas": [0], "tasks": {"s": {"dataset": "mnist", "rounds": 1}}})
    with pytest.raises(ValueError, match="momentum"):
        E.Setting(0.1, 0.1, "gd", 0.9)


def test_local_update_on_char_lstm_matches_reference_loop():
    """Sequence targets [n, 80] with -100 padding through LocalUpdate (engine path) vs the plain loop."""
    from pflkit.data.text import line_to_sequences
    lines = ["Who's there?", "Nay, answer me: stand, and unfold yourself.", "Long live the king!",
             "Bernardo?", "He.", "You come most carefully upon your hour."]
    clients = [[line_to_sequences(t) for t in lines[i:i + 3]] for i in (0, 3)]
    arrays = [tuple(torch.from_numpy(np.concatenate([a[k] for a in c])) for k in (0, 1)) for c in clients]
    data = FederatedDataset.from_client_arrays(arrays, arrays, 90, "tiny-text")
    assert data.x_train.shape[1:] == (80,) and data.y_train.shape[1:] == (80,)
    model = FunctionalModel(lambda: CharLSTM(90, 8, 6, 2))
    algo = LocalUpdate(model, theta=theta_1_to_K(2), gamma=0.5, batch_size=2, clients_per_round=2,
                       server_opt=ServerOpt("gd", 1.0))
    s0 = algo.init(data, 3)
    x0 = {k: v.clone() for k, v in s0.w.items()}
    s1 = algo.round(s0)
    g = torch.Generator().manual_seed(3)
    cl = sample_clients(2, 2, g)
    rows = data.sample_indices(cl.unsqueeze(0).expand(2, 2), 2, g)
    q = ref.local_update_pseudo_gradient(model.loss, x0, data, cl.tolist(), rows, alpha=0.0, gamma=0.5,
                                         theta=[1.0, 1.0])
    for k in x0:
        assert torch.allclose(s1.w[k], x0[k] - q[k], atol=1e-5), k
    assert float(sum((s1.w[k] - x0[k]).abs().sum() for k in x0)) > 1e-3
