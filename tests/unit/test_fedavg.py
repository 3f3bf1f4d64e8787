"""Local, FedAvg and localized FedAvg: batched vs reference loop, convergence, the paper-level claim."""
import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from pflkit.algorithms import FedAvg, Local, LocalizedFedAvg
from pflkit.algorithms.base import eval_generator
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel
from pflkit.models import logistic, mlp
from pflkit.runner import final_table, run_methods

from reference import fedavg as ref


def _close(a, b, tol=1e-5):
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=tol, rtol=tol)


@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_fedavg_equals_reference(mixed, weighting):
    factory = lambda: mlp((6,), 3, hidden=(8,))  # noqa: E731
    model = FunctionalModel(factory)
    algo = FedAvg(model, local_steps=3, lr=0.2, batch_size=4, weighting=weighting)
    state = algo.init(mixed, seed=5)
    w0 = state.w
    for _ in range(3):
        state = algo.round(state)
    want = ref.fedavg(factory, w0, mixed, rounds=3, local_steps=3, lr=0.2, batch_size=4, seed=5,
                      weighting=weighting)[-1]
    _close(state.w, want)


def test_local_and_localized_equal_reference(mixed):
    factory = lambda: logistic((6,), 3)  # noqa: E731
    model = FunctionalModel(factory)
    alone = Local(model, local_steps=4, lr=0.3, batch_size=3)
    s = alone.init(mixed, seed=2)
    w0 = {k: v[0] for k, v in s.params.items()}
    for _ in range(2):
        s = alone.round(s)
    want = ref.local(factory, w0, mixed, rounds=2, local_steps=4, lr=0.3, batch_size=3, seed=2)
    for j in range(mixed.num_clients):
        _close({k: v[j] for k, v in s.params.items()}, want[j])

    loc = LocalizedFedAvg(model, local_steps=2, lr=0.3, batch_size=3, finetune_steps=5, finetune_lr=0.1)
    st = loc.round(loc.init(mixed, seed=1))
    tuned = loc.personalized(st)
    want = ref.finetune(factory, st.w, mixed, 5, 0.1, 3, eval_generator(st))
    for j in range(mixed.num_clients):
        _close({k: v[j] for k, v in tuned.items()}, want[j])
    # evaluation draws never touch the training stream: personalizing twice gives the same models
    _close(tuned, loc.personalized(st))


def test_fedavg_one_exact_step_reaches_the_known_optimum(mixed):
    """K=1 full-batch FedAvg is gradient descent on (1/N) sum_j f_j: it must reach that minimizer,
    computed independently by L-BFGS on the pooled per-client means."""
    factory = lambda: logistic((6,), 3)  # noqa: E731
    model = FunctionalModel(factory)
    algo = FedAvg(model, local_steps=1, lr=2.0, batch_size=None)
    s = algo.init(mixed, seed=0)
    for _ in range(3000):
        s = algo.round(s)
    shapes = {k: v.shape for k, v in s.w.items()}

    def objective(theta):
        t = torch.tensor(theta, dtype=torch.float64, requires_grad=True)
        w, b = t[:18].reshape(3, 6), t[18:]
        loss = sum(torch.nn.functional.cross_entropy(mixed.client(j)[0].double() @ w.T + b, mixed.client(j)[1])
                   for j in range(mixed.num_clients)) / mixed.num_clients
        loss.backward()
        return loss.item(), t.grad.numpy()

    opt = minimize(objective, np.zeros(21), jac=True, method="L-BFGS-B", options={"gtol": 1e-10, "maxiter": 5000})
    # softmax is invariant to adding a constant to every class: compare centred parameters
    w_star = torch.tensor(opt.x[:18]).reshape(shapes["1.weight"])
    w_fed = s.w["1.weight"].double()
    torch.testing.assert_close(w_fed - w_fed.mean(0), w_star - w_star.mean(0), atol=2e-3, rtol=0)
    assert objective(torch.cat([s.w["1.weight"].flatten(), s.w["1.bias"]]).double().numpy())[0] - opt.fun < 1e-6


def test_localized_fedavg_beats_fedavg_on_synthetic():
    """Personalizing the global model helps when the two groups label data oppositely."""
    model = FunctionalModel(lambda: logistic((60,), 2))
    kw = dict(local_steps=10, lr=0.2, batch_size=20)
    methods = {"FedAvg": lambda: FedAvg(model, **kw),
               "Localized": lambda: LocalizedFedAvg(model, finetune_steps=20, finetune_lr=0.2, **kw)}
    hist = run_methods(methods, lambda s: perm_synthetic(20, 200, 60, seed=s), [0, 1], rounds=15,
                       eval_every=15, show_progress=False)
    table = final_table(hist)
    gain = table.loc["Localized", "accuracy_mean"] - table.loc["FedAvg", "accuracy_mean"]
    assert gain > 0.03, table
    assert table.loc["Localized", "loss_mean"] < table.loc["FedAvg", "loss_mean"] - 0.05


@pytest.mark.parametrize("kwargs, match", [
    (dict(local_steps=0, lr=0.1, batch_size=2), "local_steps must be an integer > 0"),
    (dict(local_steps=1, lr=-1.0, batch_size=2), "lr must be a number > 0"),
    (dict(local_steps=1, lr=0.1, batch_size=0), "batch_size must be an integer > 0"),
    (dict(local_steps=1, lr=0.1, batch_size=2, clients_per_round=1.5),
     r"clients_per_round must be an integer > 0, got 1.5"),
    (dict(local_steps=1, lr=0.1, batch_size=2, weighting="median"), "weighting must be"),
])
def test_bad_hyperparameters_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FedAvg(FunctionalModel(lambda: logistic((2,), 2)), **kwargs)


def test_partial_participation_is_seeded(mixed):
    model = FunctionalModel(lambda: logistic((6,), 3))
    algo = FedAvg(model, local_steps=2, lr=0.1, batch_size=3, clients_per_round=2)
    a, b = algo.init(mixed, 9), algo.init(mixed, 9)
    assert torch.equal(algo.participants(a), algo.participants(b))
    assert len(algo.participants(a)) == 2
