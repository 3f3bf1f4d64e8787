"""The compiled client update (engine.compiled) against the eager local_sgd on the same draws, and its fallbacks.

Tolerance: 1e-6 absolute, the issue's bar. Measured (torch 2.13 CPU, float32): logistic N = 50, K = 20 differs
from eager by at most 4.5e-8 in the parameters and 2.4e-7 in the losses; the MLPs by 6e-8 / 7.2e-7 (summation
order of the fused loops vs bmm). Each compile takes a few seconds; the file runs in well under a minute.
"""
import pytest
import torch

from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel, broadcast, local_sgd, make_generator
from pflkit.engine import compiled as C
from pflkit.models import cnn, logistic, mlp

TOL = 1e-6


def _both(model, data, clients, lr, steps=6, batch=5, **kw):
    params = broadcast(model.init(0), clients.shape[-1])
    run = [local_sgd(model, params, data, clients, steps=steps, lr=lr, batch_size=batch,
                     generator=make_generator(3), compiled=c, **kw) for c in (False, True)]
    return params, run[0], run[1]


def _close(eager, comp, tol=TOL):
    assert set(eager[0]) == set(comp[0])
    for k in eager[0]:
        assert (eager[0][k] - comp[0][k]).abs().max().item() <= tol, k
    assert (eager[1] - comp[1]).abs().max().item() <= tol


@pytest.fixture(scope="module")
def synthetic():
    return perm_synthetic(6, 30, 12, seed=0)


def test_logistic_matches_eager_fedavg_and_perm_schedules(synthetic):
    model = FunctionalModel(lambda: logistic((12,), 2))
    params, eager, comp = _both(model, synthetic, torch.arange(6), 0.3)
    _close(eager, comp)
    assert not torch.equal(comp[0]["1.weight"], params["1.weight"])  # it trained
    # PERM-style: models move between clients every step, one step size per (step, model)
    g = torch.Generator().manual_seed(1)
    sched = torch.randint(0, 6, (6, 6), generator=g)
    _, eager, comp = _both(model, synthetic, sched, torch.rand(6, 6, generator=g))
    _close(eager, comp)
    # one program per shapes, reused by later rounds
    assert len(C._programs[model.stacked]) == 1
    _both(model, synthetic, torch.arange(6), 0.3)
    assert len(C._programs[model.stacked]) == 1


def test_mlp_matches_eager_and_env_switch(synthetic, monkeypatch):
    model = FunctionalModel(lambda: mlp((12,), 2, hidden=(20, 8)))  # a bmm layer (20 wide) and fused ones
    _, eager, comp = _both(model, synthetic, torch.arange(6), 0.2)
    _close(eager, comp)
    monkeypatch.setenv("PFLKIT_COMPILE", "1")
    assert C.requested(None) and not C.requested(False)
    params = broadcast(model.init(0), 6)
    env = local_sgd(model, params, synthetic, torch.arange(6), steps=6, lr=0.2, batch_size=5,
                    generator=make_generator(3))
    _close(comp, env, 0.0)  # the same compiled program as the compiled=True call


def test_cnn_prox_and_large_networks_fall_back_to_eager_with_a_warning(monkeypatch):
    g = torch.Generator().manual_seed(0)
    from pflkit.data import FederatedDataset
    x, y = torch.rand(3, 10, 1, 8, 8, generator=g), torch.randint(0, 3, (3, 10), generator=g)
    data = FederatedDataset.from_client_arrays([(x[j, :8], y[j, :8]) for j in range(3)],
                                               [(x[j, 8:], y[j, 8:]) for j in range(3)], 3, "tiny")
    model = FunctionalModel(lambda: cnn((1, 8, 8), 3, channels=(2, 2), hidden=4))
    with pytest.warns(UserWarning, match="not a dense stacked network.*running eagerly"):
        _, eager, comp = _both(model, data, torch.arange(3), 0.1, steps=2, batch=3)
    _close(eager, comp, 0.0)
    dense = FunctionalModel(lambda: logistic((1, 8, 8), 3))
    anchor = broadcast(dense.init(1), 3)
    with pytest.warns(UserWarning, match="prox, masks.*running eagerly"):
        _, eager, comp = _both(dense, data, torch.arange(3), 0.1, steps=2, batch=3, prox=0.5, anchor=anchor)
    _close(eager, comp, 0.0)
    monkeypatch.setattr(C, "LARGEST", 10)
    with pytest.warns(UserWarning, match="over 10 stacked parameters: eager is as fast"):
        _, eager, comp = _both(dense, data, torch.arange(3), 0.1, steps=2, batch=3)
    _close(eager, comp, 0.0)


def test_failed_compile_warns_and_runs_eagerly(synthetic, monkeypatch):
    def no_compiler(layers, names):
        def fail(*args):
            raise RuntimeError("no C++ compiler found\nmore detail")
        return fail
    monkeypatch.setattr(C, "_program", no_compiler)
    model = FunctionalModel(lambda: logistic((12,), 2))
    with pytest.warns(UserWarning, match=r"compiled local SGD failed \(RuntimeError: no C\+\+ compiler found\)"):
        _, eager, comp = _both(model, synthetic, torch.arange(6), 0.3)
    _close(eager, comp, 0.0)
    assert list(C._programs[model.stacked].values()) == [None]  # not retried on the next call
