"""PERM with heterogeneous client models (Sec. 3.3): width masks, partial training, the complexity
term of the mixing weights, shuffling with distinct architectures, and the reduction to PERM."""
import pytest
import torch

from pflkit.algorithms.perm import PERM, shuffle_steps, solve_alpha, water_filling
from pflkit.algorithms.perm_hetero import PartialFedAvg, PERMHetero, complexity_costs, hetero_mixing_weights
from pflkit.algorithms.round import aggregate, local_round
from pflkit.engine.params import apply_masks
from pflkit.data import perm_synthetic
from pflkit.engine import FunctionalModel, broadcast, make_generator
from pflkit.models import count_parameters
from pflkit.models.width import cnn_spec, masks_for, mlp_spec, num_parameters, unit_indices, unit_masks

from reference import perm_hetero as ref

FRACTIONS = [1.0, 0.5, 0.25, 1.0, 0.5]  # the `mixed` fixture has 5 clients


def _spec():
    return mlp_spec((6,), 3, hidden=(8, 6))


def _random_params(model, n, seed=0, scale=0.3):
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(n, *p.shape, generator=g) * scale for k, p in model.init(0).items()}


@pytest.mark.parametrize("extraction", ["static", "rolling", "random"])
def test_masked_mlp_equals_the_small_module(extraction):
    """The design's premise: m (.) w at full width computes what the explicitly built sub-model does,
    and the mask keeps exactly that module's parameter count."""
    spec = mlp_spec((5,), 4, hidden=(16, 12))
    model = FunctionalModel(spec.factory())
    fractions = [1.0, 0.5, 0.25, 0.125]
    units = unit_masks(spec, fractions, extraction, round=7, generator=make_generator(3))
    from pflkit.models.width import param_masks
    masks = param_masks(spec, units)
    w = {k: torch.randn(p.shape, generator=make_generator(1)) for k, p in model.init(0).items()}
    x = torch.randn(9, 5, generator=make_generator(2))
    masked = apply_masks(broadcast(w, 4), masks)
    for i, r in enumerate(fractions):
        idx = unit_indices(units, i)
        assert [len(u) for u in idx] == [max(1, round(16 * r)), max(1, round(12 * r))]
        small = ref._module_with(ref.small_factory(spec, idx), ref.extract(spec, w, idx))
        want = small(x)
        got = model.forward({k: p[i] for k, p in masked.items()}, x)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        assert int(num_parameters(masks)[i]) == count_parameters(small)
    if extraction == "rolling":  # window [7, 7 + k) mod size
        assert units[0][1].nonzero().flatten().tolist() == list(range(7, 15))
        assert units[1][2].nonzero().flatten().tolist() == [7, 8, 9]


def test_masked_cnn_equals_the_small_module():
    spec = cnn_spec((1, 8, 8), 3, channels=(4, 6), hidden=10)
    model = FunctionalModel(spec.factory())
    fractions = [1.0, 0.5, 0.25]
    units = unit_masks(spec, fractions, "random", generator=make_generator(0))
    from pflkit.models.width import param_masks
    masks = param_masks(spec, units)
    w = {k: torch.randn(p.shape, generator=make_generator(1)) * 0.3 for k, p in model.init(0).items()}
    x = torch.randn(5, 1, 8, 8, generator=make_generator(2))
    masked = apply_masks(broadcast(w, 3), masks)
    for i in range(3):
        idx = unit_indices(units, i)
        small = ref._module_with(ref.small_factory(spec, idx), ref.extract(spec, w, idx))
        torch.testing.assert_close(model.forward({k: p[i] for k, p in masked.items()}, x), small(x),
                                   atol=1e-5, rtol=1e-5)
        assert int(num_parameters(masks)[i]) == count_parameters(small)


def test_hetero_shuffling_equals_the_per_model_reference(mixed):
    """A whole epoch of the visiting rule, batched on masks vs small modules one at a time."""
    spec = _spec()
    model = FunctionalModel(spec.factory())
    n = mixed.num_clients
    masks = masks_for(spec, FRACTIONS)
    units = [unit_indices(unit_masks(spec, FRACTIONS), i) for i in range(n)]
    v = apply_masks(_random_params(model, n), masks)
    alpha = torch.distributions.Dirichlet(torch.ones(n)).sample((n,)).double()
    sigma = torch.randperm(n, generator=make_generator(4))
    got, want = v, v
    for step in range(n):
        got = shuffle_steps(model, got, mixed, alpha, sigma, step, local_steps=3, lr=0.1, batch_size=4,
                            generator=make_generator(step), masks=masks)
        want = ref.shuffle_round(spec, want, units, mixed, alpha, sigma, step, 3, 0.1, 4, make_generator(step))
    for k in got:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got["1.weight"], v["1.weight"])  # it trained


@pytest.mark.parametrize("extraction", ["static", "rolling", "random"])
def test_partial_training_round_equals_the_reference(mixed, extraction):
    spec = _spec()
    model = FunctionalModel(spec.factory())
    n = mixed.num_clients
    units = unit_masks(spec, FRACTIONS, extraction, round=3, generator=make_generator(5))
    from pflkit.models.width import param_masks
    masks = param_masks(spec, units)
    w = {k: p[0] for k, p in _random_params(model, 1).items()}
    local = local_round(model, w, mixed, torch.arange(n), steps=4, lr=0.2, batch_size=3,
                        generator=make_generator(9), masks=masks)
    got = aggregate(local, masks=masks, base=w)
    want = ref.partial_fedavg_round(spec, w, [unit_indices(units, j) for j in range(n)], mixed, 4, 0.2, 3,
                                    make_generator(9))
    for k in w:
        torch.testing.assert_close(got[k], want[k], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("complexity,discrepancy", [(0.0, "paper"), (0.05, "paper"), (0.05, "shared")])
def test_hetero_mixing_weights_equal_the_reference(mixed, complexity, discrepancy):
    spec = _spec()
    model = FunctionalModel(spec.factory())
    n = mixed.num_clients
    w = {k: p[0] for k, p in _random_params(model, 1, seed=2).items()}
    masks = masks_for(spec, FRACTIONS)
    units = [unit_indices(unit_masks(spec, FRACTIONS), i) for i in range(n)]
    kw = dict(complexity=complexity, discrepancy=discrepancy, spec=spec, fractions=torch.tensor(FRACTIONS))
    got = hetero_mixing_weights(model, w, masks, mixed, lam=3.0, solver="exact", **kw)
    want = ref.hetero_alpha(spec, w, units, mixed, 3.0, complexity, shared=discrepancy == "shared")
    torch.testing.assert_close(got, want, atol=1e-7, rtol=0)
    assert float((got - torch.eye(len(FRACTIONS), dtype=torch.float64)).abs().max()) > 0.1  # it mixes
    gd = hetero_mixing_weights(model, w, masks, mixed, lam=3.0, solver="gd", steps=5000, **kw)
    torch.testing.assert_close(gd, got, atol=1e-6, rtol=0)


def test_complexity_term_moves_alpha_away_from_high_capacity_sources():
    """Sec. 3.3's term kappa sum_j a_j sqrt(VC_j / n_j) is a cost: as kappa grows, each alpha_i puts
    monotonically more mass on the low-capacity sources (sqrt(P_j/n_j) small) and, at large kappa,
    all of it on the cheapest ones. (The issue's wording "toward higher-capacity sources" has the
    sign backwards for a minimized cost; this is the formula's actual behaviour.)"""
    g = torch.Generator().manual_seed(0)
    n_clients = 8
    grads = torch.randn(n_clients, 6, generator=g, dtype=torch.float64)
    from pflkit.algorithms.perm import discrepancies
    d = discrepancies(grads)
    n = torch.full((n_clients,), 50.0, dtype=torch.float64)
    sizes = torch.tensor([20_000, 20_000, 50_000, 50_000, 100_000, 100_000, 200_000, 200_000])
    c = complexity_costs(sizes, n)
    small = (sizes == sizes.min()).double()
    masses, mean_capacity = [], []
    for kappa in (0.0, 1e-3, 1e-2, 0.1, 1.0, 10.0):
        alpha = solve_alpha(d, n, 100.0, kappa * c)
        torch.testing.assert_close(alpha, water_filling(d + kappa * c[None, :], n, 100.0))
        masses.append(float((alpha * small).sum(1).mean()))
        mean_capacity.append(float((alpha * sizes.double()).sum(1).mean()))
    assert all(b >= a - 1e-12 for a, b in zip(masses, masses[1:])), masses
    assert all(b <= a + 1e-9 for a, b in zip(mean_capacity, mean_capacity[1:])), mean_capacity
    assert masses[0] < 0.5 and masses[-1] > 0.999, masses
    assert mean_capacity[0] > 70_000 and mean_capacity[-1] < 20_001


def test_every_trained_model_respects_its_budget(mixed):
    """Each personalized model keeps exactly its own width's parameter count; a visiting model only
    ever changes coordinates inside its host's budget; partial-training locals stay in their masks."""
    spec = _spec()
    model = FunctionalModel(spec.factory())
    n = mixed.num_clients
    algo = PERMHetero(model, spec, fractions=FRACTIONS, local_steps=3, lr=0.1, batch_size=4, lam=5.0,
                      extraction="rolling", warmup_rounds=2, update_every=2, alpha_init="estimate",
                      complexity=1e-3)
    masks = masks_for(spec, FRACTIONS)
    budget = torch.tensor([count_parameters(spec.build(spec.units(r))) for r in FRACTIONS])
    assert torch.equal(num_parameters(masks), budget)
    s = algo.init(mixed, 0)
    for _ in range(9):
        before = s.v
        s = algo.round(s)
        if before is None:
            continue
        from pflkit.algorithms.perm import shuffle_clients
        host = shuffle_clients(s.sigma, (s.shuffle_round - 1) % n)
        for k in s.v:
            outside = 1.0 - masks[k][host]
            assert float(((s.v[k] - before[k]) * outside).abs().max()) == 0.0
    for k, p in s.v.items():
        assert float((p * (1.0 - masks[k])).abs().max()) == 0.0  # nothing outside the own budget
    nonzero = sum((p != 0).reshape(n, -1).sum(1) for p in s.v.values())
    assert (nonzero <= budget).all() and (nonzero >= budget - 2).all()
    # the partial-training baseline's fine-tuned models too
    base = PartialFedAvg(model, spec, fractions=FRACTIONS, extraction="random", local_steps=2, lr=0.1, batch_size=4,
                         finetune_steps=2)
    t = base.round(base.round(base.init(mixed, 0)))
    for k, p in base.personalized(t).items():
        assert float((p * (1.0 - masks[k])).abs().max()) == 0.0


@pytest.mark.parametrize("solver,samples", [("gd", None), ("exact", 8)])
def test_all_budgets_one_reduces_to_perm(solver, samples):
    """fractions = 1 and complexity = 0: warm-up, shuffles, global steps and alphas are PERM's."""
    data = perm_synthetic(6, 40, 5, seed=0)
    spec = mlp_spec((5,), 2, hidden=(7,))
    model = FunctionalModel(spec.factory())
    kw = dict(local_steps=2, lr=0.1, batch_size=5, lam=10.0, alpha_solver=solver, alpha_samples=samples,
              warmup_rounds=2, update_every=3, alpha_init="estimate", global_lr=0.3)
    perm = PERM(model, **kw)
    hetero = PERMHetero(model, spec, fractions=[1.0] * 6, extraction="rolling", **kw)
    s, t = perm.init(data, 0), hetero.init(data, 0)
    for _ in range(11):
        s, t = perm.round(s), hetero.round(t)
    torch.testing.assert_close(t.alpha, s.alpha, atol=1e-6, rtol=0)
    for k in s.w:
        torch.testing.assert_close(t.w[k], s.w[k], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(t.v[k], s.v[k], atol=1e-6, rtol=1e-5)
    assert torch.equal(t.sigma, s.sigma)
    # a shuffle round with identical inputs gives PERM's result (up to float rounding of the engine's
    # fused update)
    alpha = s.alpha
    a = shuffle_steps(model, s.v, data, alpha, s.sigma, 1, local_steps=2, lr=0.1, batch_size=5,
                      generator=make_generator(0), masks=masks_for(spec, [1.0] * 6))
    b = shuffle_steps(model, s.v, data, alpha, s.sigma, 1, local_steps=2, lr=0.1, batch_size=5,
                      generator=make_generator(0))
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-6)


def test_local_sgd_with_full_masks_is_local_sgd_without(mixed):
    from pflkit.engine import local_sgd
    spec = _spec()
    model = FunctionalModel(spec.factory())
    v = _random_params(model, 5)
    ones = {k: torch.ones_like(p) for k, p in v.items()}
    for bs in (3, None):
        a, la = local_sgd(model, v, mixed, torch.arange(5), steps=3, lr=0.1, batch_size=bs,
                          generator=make_generator(1), masks=ones)
        b, lb = local_sgd(model, v, mixed, torch.arange(5), steps=3, lr=0.1, batch_size=bs,
                          generator=make_generator(1))
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(la, lb, atol=1e-6, rtol=1e-6)


def test_bad_input_is_rejected(mixed):
    spec = _spec()
    model = FunctionalModel(spec.factory())
    with pytest.raises(ValueError, match="width fractions must all lie in"):
        PERMHetero(model, spec, fractions=[1.0, 0.0], local_steps=1, lr=0.1, batch_size=2, lam=1.0)
    with pytest.raises(ValueError, match="extraction must be one of"):
        PartialFedAvg(model, spec, fractions=[1.0], extraction="sliding", local_steps=1, lr=0.1, batch_size=2)
    with pytest.raises(ValueError, match="complexity must be"):
        PERMHetero(model, spec, fractions=[1.0], local_steps=1, lr=0.1, batch_size=2, lam=1.0, complexity=-1.0)
    with pytest.raises(ValueError, match="do not match the width spec"):
        PERMHetero(FunctionalModel(mlp_spec((6,), 3, hidden=(9, 6)).factory()), spec, fractions=[1.0],
                   local_steps=1, lr=0.1, batch_size=2, lam=1.0)
    algo = PERMHetero(model, spec, fractions=[1.0, 0.5], local_steps=1, lr=0.1, batch_size=2, lam=1.0)
    with pytest.raises(ValueError, match="fractions has 2 entries but the data has 5 clients"):
        algo.init(mixed, 0)
    with pytest.raises(ValueError, match="width fraction must be"):
        spec.units(1.5)
