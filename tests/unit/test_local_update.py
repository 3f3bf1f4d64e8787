"""LocalUpdate / MAML / ServerOpt against plain reference loops, the Table 1 presets against their
definitions, and the generic engine path against the closed-form quadratic path."""
import pytest
import torch
from torch import nn

from pflkit.algorithms.fedavg import FedAvg
from pflkit.algorithms.local_update import (MAML, LocalUpdate, QuadraticLocalUpdate, ServerOpt, Theta,
                                            fedavg, fedprox, fedsgd, fomaml, lookahead, maml, minibatch_sgd,
                                            sample_clients, theta_1_to_K, theta_K)
from pflkit.data.federated import FederatedDataset
from pflkit.data.quadratic import QuadraticModel, quadratic_clients
from pflkit.engine import FunctionalModel

from reference import local_update as ref


def tiny_data(num_clients=3, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    train, test = [], []
    for j in range(num_clients):
        x = torch.randn(n, 3, generator=g) + j
        y = (x.sum(1) > j * 3).long()
        train.append((x, y))
        test.append((x[:2], y[:2]))
    return FederatedDataset.from_client_arrays(train, test, num_classes=2, name="tiny")


def tiny_model():
    return FunctionalModel(lambda: nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)))


def close(a: dict, b: dict, atol=1e-5):
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=1e-4), (k, (a[k] - b[k]).abs().max())


def draws(seed, data, m, steps, batch):
    """The generator draws LocalUpdate.round makes: clients, then [steps, M, B] rows."""
    g = torch.Generator().manual_seed(seed)
    clients = sample_clients(data.num_clients, m, g)
    rows = data.sample_indices(clients.unsqueeze(0).expand(steps, len(clients)), batch, g)
    return clients, rows


def test_local_update_round_matches_reference_loop_on_tiny_nn():
    data, model = tiny_data(), tiny_model()
    theta = Theta.of([0.5, 0.0, 2.0])
    algo = LocalUpdate(model, theta=theta, gamma=0.1, alpha=0.3, batch_size=2, clients_per_round=2,
                       server_opt=ServerOpt("gd", 0.7))
    s0 = algo.init(data, seed=5)
    x0 = {k: v.clone() for k, v in s0.w.items()}
    s1 = algo.round(s0)
    clients, rows = draws(5, data, 2, 3, 2)
    q = ref.local_update_pseudo_gradient(model.loss, x0, data, clients.tolist(), rows, alpha=0.3, gamma=0.1,
                                         theta=[0.5, 0.0, 2.0])
    close(s1.w, {k: x0[k] - 0.7 * q[k] for k in x0})
    assert not torch.allclose(s1.w["0.weight"], x0["0.weight"])


def test_maml_matches_autograd_reference_on_tiny_nn():
    data, model = tiny_data(), tiny_model()
    algo = MAML(model, inner_steps=2, gamma=0.2, batch_size=3)
    x = model.init(1)
    g = torch.Generator().manual_seed(9)
    clients = torch.tensor([0, 2])
    q = algo.client_updates(x, data, clients, g)
    g = torch.Generator().manual_seed(9)
    rows = data.sample_indices(clients.unsqueeze(0).expand(3, 2), 3, g)
    for m in range(2):
        want = ref.maml_gradient(model.loss, x, data, [rows[0, m], rows[1, m]], rows[2, m], 0.2)
        close({k: v[m] for k, v in q.items()}, want)


@pytest.mark.parametrize("kind", ["gd", "heavy_ball", "nesterov"])
def test_server_opt_matches_textbook_iterations(kind):
    A = torch.diag(torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64))
    grad = lambda x: A @ x  # noqa: E731
    opt = ServerOpt(kind, 0.1, 0.0 if kind == "gd" else 0.6)
    x = {"x": torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)}
    state = opt.init(x)
    got = [x["x"]]
    for _ in range(15):
        x, state = opt.step(x, {"x": grad(x["x"])}, state)
        got.append(x["x"])
    want = ref.server_steps(kind, got[0], grad, 0.1, 0.0 if kind == "gd" else 0.6, 15)
    assert torch.allclose(torch.stack(got), torch.stack(want), atol=1e-12)


def test_server_adam_first_step_is_signed_step():
    opt = ServerOpt("adam", 0.05)
    x = {"x": torch.tensor([1.0, -1.0, 3.0])}
    q = {"x": torch.tensor([2.0, -0.5, 1e-3])}
    new, _ = opt.step(x, q, opt.init(x))
    assert torch.allclose(new["x"], x["x"] - 0.05 * torch.sign(q["x"]), atol=1e-4)


def test_engine_path_and_quadratic_path_agree():
    g = torch.Generator().manual_seed(0)
    qc = quadratic_clients(5, 3, mu=1.0, L=10.0, C=1.0, examples_per_client=4, example_noise=0.5, generator=g)
    model = QuadraticModel(3)
    kw = dict(theta=Theta.of([1.0, 0.5, 0.0, 2.0]), gamma=0.03, alpha=0.2, batch_size=2, clients_per_round=3)
    engine = LocalUpdate(model, server_opt=ServerOpt("nesterov", 0.05, 0.5), **kw)
    s = engine.init(qc.to_federated(), seed=3)
    x0 = s.w["x"].double().clone()
    for _ in range(6):
        s = engine.round(s)
    quad = QuadraticLocalUpdate(server_opt=ServerOpt("nesterov", 0.05, 0.5), **kw).run(qc, x0, 6, seed=3)
    assert torch.allclose(s.w["x"].double(), quad[-1], atol=1e-4)
    assert (quad[-1] - quad[0]).norm() > 0.1


# ---------------------------------------------------------------------- Table 1 presets (GD server)
def test_preset_minibatch_sgd_is_sgd_on_one_client():
    data, model = tiny_data(num_clients=1), tiny_model()
    algo = minibatch_sgd(model, lr=0.3, batch_size=4)
    assert algo.theta == theta_K(1) and algo.gamma == 0.0 and algo.alpha == 0.0
    s0 = algo.init(data, 2)
    x0 = {k: v.clone() for k, v in s0.w.items()}
    s1 = algo.round(s0)
    _, rows = draws(2, data, None, 1, 4)
    close(s1.w, ref.sgd_steps(model.loss, x0, data, [rows[0, 0]], 0.3))


def test_preset_lookahead_is_lookahead():
    data, model = tiny_data(num_clients=1), tiny_model()
    algo = lookahead(model, steps=4, fast_lr=0.2, slow_step=0.5, batch_size=3)
    s0 = algo.init(data, 4)
    x0 = {k: v.clone() for k, v in s0.w.items()}
    s1 = algo.round(s0)
    _, rows = draws(4, data, None, 4, 3)
    close(s1.w, ref.lookahead_step(model.loss, x0, data, [rows[k, 0] for k in range(4)], 0.2, 0.5))


def test_preset_fedsgd_sums_gradients_at_the_broadcast_point():
    data, model = tiny_data(), tiny_model()
    algo = fedsgd(model, steps=3, lr=0.1, batch_size=2, clients_per_round=2)
    s0 = algo.init(data, 6)
    x0 = {k: v.clone() for k, v in s0.w.items()}
    s1 = algo.round(s0)
    _, rows = draws(6, data, 2, 3, 2)
    total = {k: torch.zeros_like(v) for k, v in x0.items()}
    for k in range(3):
        for m in range(2):
            g = ref._grad(model.loss, ref._leaf(x0), data.x_train[rows[k, m]], data.y_train[rows[k, m]])
            total = {n: total[n] + g[n] / 2 for n in total}
    close(s1.w, {n: x0[n] - 0.1 * total[n] for n in x0})


def test_preset_fedavg_with_server_lr_gamma_is_model_averaging():
    data, model = tiny_data(num_clients=4), tiny_model()
    algo = fedavg(model, steps=3, gamma=0.2, batch_size=2, clients_per_round=2)
    plain = FedAvg(model, local_steps=3, lr=0.2, batch_size=2, clients_per_round=2)
    s, p = algo.init(data, 8), plain.init(data, 8)
    x0 = {k: v.clone() for k, v in s.w.items()}
    for _ in range(3):
        s, p = algo.round(s), plain.round(p)
    close(s.w, p.w)
    # and one round against the reference model-averaging loop
    s1 = algo.round(algo.init(data, 8))
    _, rows = draws(8, data, 2, 3, 2)
    close(s1.w, ref.fedavg_round(model.loss, x0, data, rows, 0.2))


def test_preset_fedprox_averages_proximal_local_models():
    data, model = tiny_data(), tiny_model()
    algo = fedprox(model, steps=3, gamma=0.2, alpha=0.5, batch_size=2)
    s0 = algo.init(data, 1)
    x0 = {k: v.clone() for k, v in s0.w.items()}
    s1 = algo.round(s0)
    _, rows = draws(1, data, None, 3, 2)
    close(s1.w, ref.fedavg_round(model.loss, x0, data, rows, 0.2, prox=0.5))
    with pytest.raises(ValueError, match="alpha"):
        fedprox(model, steps=3, gamma=0.2, alpha=0.0, batch_size=2)


def test_preset_fomaml_sends_the_gradient_after_k_minus_1_steps():
    data, model = tiny_data(), tiny_model()
    algo = fomaml(model, steps=3, gamma=0.2, lr=1.0, batch_size=2)
    x = model.init(0)
    g = torch.Generator().manual_seed(3)
    clients = torch.arange(3)
    q = algo.client_updates(x, data, clients, g)
    g = torch.Generator().manual_seed(3)
    rows = data.sample_indices(clients.unsqueeze(0).expand(3, 3), 2, g)
    for m in range(3):
        want = ref.fomaml_gradient(model.loss, x, data, [rows[k, m] for k in range(3)], 0.2)
        close({k: v[m] for k, v in q.items()}, want)


def test_preset_maml_is_second_order_maml():
    data, model = tiny_data(), tiny_model()
    algo = maml(model, inner_steps=3, gamma=0.1, lr=0.5, batch_size=2)
    assert isinstance(algo, MAML) and algo.server_opt.lr == 0.5
    x = model.init(2)
    q = algo.client_updates(x, data, torch.tensor([1]), torch.Generator().manual_seed(0))
    rows = data.sample_indices(torch.tensor([[1]] * 4), 2, torch.Generator().manual_seed(0))
    want = ref.maml_gradient(model.loss, x, data, [rows[k, 0] for k in range(3)], rows[3, 0], 0.1)
    close({k: v[0] for k, v in q.items()}, want)
    # first-order MAML differs from MAML (the Hessian terms matter)
    fo = ref.fomaml_gradient(model.loss, x, data, [rows[k, 0] for k in range(4)], 0.1)
    assert max((fo[k] - want[k]).abs().max() for k in fo) > 1e-4


# ------------------------------------------------------------------------------- bad input
def test_bad_input_is_rejected_before_work():
    model = tiny_model()
    with pytest.raises(ValueError, match="theta"):
        LocalUpdate(model, theta=[0.0, -1.0], gamma=0.1, batch_size=2)
    with pytest.raises(ValueError, match="theta"):
        Theta.of([0.0, 0.0])
    with pytest.raises(ValueError, match="gamma"):
        LocalUpdate(model, theta=theta_1_to_K(2), gamma=-0.1, batch_size=2)
    with pytest.raises(ValueError, match="kind"):
        ServerOpt("sgd-ish", 0.1)
    with pytest.raises(ValueError, match="momentum"):
        ServerOpt("heavy_ball", 0.1, momentum=1.5)
    with pytest.raises(ValueError, match="clients_per_round"):
        LocalUpdate(model, theta=theta_1_to_K(2), gamma=0.1, batch_size=2, clients_per_round=0)


def test_theta_helpers():
    assert torch.equal(theta_K(3).weights, torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64))
    assert torch.equal(theta_1_to_K(3).weights, torch.ones(3, dtype=torch.float64))
    t = Theta.of([0.5, 0.0, 2.0, 0.0, 0.0])
    assert t.K == 3 and t.total == 2.5
    assert Theta.of([1, 1, 1]) == theta_1_to_K(3) and Theta.of([0, 0, 1]) == theta_K(3)
    s = torch.tensor([0.0, 0.01, 0.3], dtype=torch.float64)
    for th in (t, theta_K(4), theta_1_to_K(5)):
        explicit = sum(w * (1 - s) ** k for k, w in enumerate(th.weights.tolist()))
        assert torch.allclose(th.poly(s), explicit, atol=1e-12)


# ------------------------------------------------------------------ the round's parts, composed
@pytest.mark.parametrize("kind, momentum", [("gd", 0.0), ("heavy_ball", 0.6), ("nesterov", 0.6), ("adam", 0.0)])
def test_server_opt_equals_torch_optim(kind, momentum):
    """ServerOpt's tensor-state rules are torch.optim's SGD / Adam: same iterates on a float64
    quadratic (equal to 1e-12 relative: only the order of float operations may differ)."""
    A = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    opt = ServerOpt(kind, 0.05, momentum)
    x = {"x": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    leaf = x["x"].clone().requires_grad_(False)
    torch_opt = (torch.optim.Adam([leaf], lr=0.05) if kind == "adam" else
                 torch.optim.SGD([leaf], lr=0.05, momentum=momentum, nesterov=kind == "nesterov"))
    state = opt.init(x)
    for _ in range(20):
        x, state = opt.step(x, {"x": A @ x["x"]}, state)
        leaf.grad = A @ leaf.detach()
        torch_opt.step()
        assert torch.allclose(x["x"], leaf.detach(), rtol=1e-12, atol=1e-14)
    assert state["step"] == 20 and (x["x"] - torch.tensor([1.0, -2.0], dtype=torch.float64)).norm() > 0.1


@pytest.mark.parametrize("kind, momentum", [("gd", 0.0), ("nesterov", 0.6), ("adam", 0.0)])
def test_server_opt_radius_is_the_step_then_the_projection_onto_the_ball(kind, momentum):
    """With ``radius`` every step is the step without it followed by the l2-ball projection, x r / ||x||
    when ||x|| > r (the projection's own float ops: equal to 1e-15); the iterates stay in the ball, and the
    projection is active (it changes some step)."""
    A = torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    b = torch.tensor([-4.0, 6.0], dtype=torch.float64)  # the minimiser A^-1 b lies outside the ball of 1.5
    free, ball = ServerOpt(kind, 0.1, momentum), ServerOpt(kind, 0.1, momentum, radius=1.5)
    x = {"x": torch.tensor([1.0, -0.5], dtype=torch.float64)}
    state, projected = ball.init(x), 0
    for _ in range(30):
        q = {"x": A @ x["x"] - b}
        want, _ = free.step(x, q, state)
        got, state = ball.step(x, q, state)
        norm = want["x"].norm()
        if norm > 1.5:
            want = {"x": want["x"] * (1.5 / norm)}
            projected += 1
        assert torch.allclose(got["x"], want["x"], rtol=1e-15, atol=1e-15)
        assert got["x"].norm() <= 1.5 + 1e-12
        x = got
    assert projected >= 10
    target = {"x": torch.tensor([3.0, 4.0], dtype=torch.float64)}  # step_to (model averaging) is projected too
    stepped, _ = ServerOpt("gd", 1.0, radius=1.5).step_to(x, target, ServerOpt("gd", 1.0).init(x))
    assert torch.allclose(stepped["x"], torch.tensor([0.9, 1.2], dtype=torch.float64), rtol=1e-15)
    with pytest.raises(ValueError, match="radius"):
        ServerOpt("gd", 1.0, radius=0.0)


def test_a_new_method_is_a_few_lines_of_configuration():
    """FedAvg with a server Adam (FedAdam, Reddi et al.) composed from existing parts: one small class.
    Checked against a plain loop: each sampled client runs K SGD steps from x and sends sum_k g_k
    (Theta_{1:K}), q is their mean, then one textbook Adam step (float32: to 1e-6)."""
    class FedAdam(LocalUpdate):
        name = "FedAdam"

        def __init__(self, model, *, steps, gamma, lr, batch_size, clients_per_round=None):
            super().__init__(model, theta=theta_1_to_K(steps), gamma=gamma, batch_size=batch_size,
                             clients_per_round=clients_per_round, server_opt=ServerOpt("adam", lr))

    data, model = tiny_data(num_clients=4), tiny_model()
    algo = FedAdam(model, steps=3, gamma=0.1, lr=0.01, batch_size=2, clients_per_round=2)
    s = algo.init(data, seed=4)
    x0 = {k: v.clone() for k, v in s.w.items()}
    s = algo.round(s)
    clients, rows = draws(4, data, 2, 3, 2)
    q = ref.local_update_pseudo_gradient(model.loss, x0, data, clients.tolist(), rows, alpha=0.0, gamma=0.1,
                                         theta=[1.0, 1.0, 1.0])
    # Adam's first step from zero moments: m = (1 - b1) q, v = (1 - b2) q^2, bias-corrected to q and q^2
    want = {k: x0[k] - 0.01 * q[k] / (q[k].abs() + 1e-8) for k in x0}
    close(s.w, want, atol=1e-6)
    assert s.server["step"] == 1


def test_client_update_for_one_client_equals_its_result_inside_the_batch():
    """The seam a federated engine calls: a client's update computed alone equals the same client's
    update inside the batched call, given the draws it sees (float32: equal to 1e-6 relative, batched
    and single matmuls may round differently)."""
    from pflkit.algorithms.round import client_update
    data, model = tiny_data(num_clients=3), tiny_model()
    x = model.init(2)
    clients = torch.tensor([0, 1, 2])
    start = {k: v.unsqueeze(0).expand(3, *v.shape).clone() for k, v in x.items()}
    kw = dict(theta=torch.tensor([1.0, 0.5, 2.0]), gamma=0.1, alpha=0.2, batch_size=None)
    batched = client_update(model, start, data, clients, generator=torch.Generator().manual_seed(0), **kw)
    for j in range(3):
        alone = client_update(model, {k: v[j:j + 1] for k, v in start.items()}, data, clients[j:j + 1],
                              generator=torch.Generator().manual_seed(0), **kw)
        close({k: v[0] for k, v in alone.items()}, {k: v[j] for k, v in batched.items()}, atol=1e-6)


def test_local_update_state_is_checkpointable_and_resumes_the_same_run(tmp_path):
    """LocalUpdate's state (server momentum included) is tensors and plain values: a checkpointed run
    resumed halfway gives the same iterates as one uninterrupted run (exactly)."""
    from pflkit.io import state_from_payload, state_to_payload
    data, model = tiny_data(num_clients=4), tiny_model()
    algo = LocalUpdate(model, theta=theta_1_to_K(2), gamma=0.1, batch_size=2, clients_per_round=2,
                       server_opt=ServerOpt("nesterov", 0.5, 0.9))
    s = algo.init(data, seed=1)
    for _ in range(3):
        s = algo.round(s)
    payload = state_to_payload(s)
    torch.save(payload, tmp_path / "s.pt")
    resumed = state_from_payload(algo.init(data, seed=1), torch.load(tmp_path / "s.pt", weights_only=True))
    for _ in range(3):
        s, resumed = algo.round(s), algo.round(resumed)
    for k in s.w:
        assert torch.equal(s.w[k], resumed.w[k])
    assert resumed.server["step"] == 6
