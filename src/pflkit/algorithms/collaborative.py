"""Personalized collaborative SGD (Chayti et al.): Alone, WGA (Alg. 2), BC (Alg. 3), BC with a bias oracle (Thm. 2).

User 0 minimizes f_0 with the help of N collaborators; every step each user sends a stochastic gradient
at user 0's current point x_t (Alg. 1), user 0 forms a pseudo-gradient g_t and steps
x_{t+1} = x_t - eta g_t (eq. 2). With g_avg = (1/N) sum_{i>=1} g_i:

- Alone:            g_t = g_0
- WGA (Alg. 2):     g_t = (1 - a) g_0 + a g_avg,                          a in [0, 1]
- BC (Alg. 3):      g_t = (1 - a) g_0 + a (g_avg - c_t),  c_0 given (default 0),
                    observed bias D_t = g_avg - g_0,  c_{t+1} = (1 - b) c_t + b D_t   (EMA, b in [0, 1])
- Bias oracle (Thm. 2): as BC but c_t = grad f_avg(x_t) - grad f_0(x_t) + noise of variance s_b^2 / N
                    (per coordinate), drawn fresh each step.

**Gradient oracle interface.** An oracle is any callable ``oracle(x, generator) -> G`` with
``x [R, d]`` (user 0's point in each of R independent runs) and ``G [R, N + 1, d]``: one stochastic
gradient per run and user at that run's point, user 0 first (``G[:, 0]``), collaborators after. It
draws all its randomness from ``generator``. Any differentiable objective fits: wrap per-user stochastic
losses with :func:`autograd_oracle`; the noisy quadratic users of :mod:`pflkit.data.quadratic` are one.

**Batching.** Independent runs are the batch dimension R, users the second; the only Python loop is
over time steps. Hyperparameters (``eta``, ``a``, ``b``) are numbers or tensors ``[R]`` (one value per
run), so a grid of values x runs is one batched pass (:func:`tune_step_size`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from ..checks import check_int, is_real

if TYPE_CHECKING:  # pandas loads only where a table is built (a ClientApp process imports none)
    import pandas as pd

__all__ = ["GradientOracle", "Alone", "WGA", "BC", "BiasOracleBC", "CollaborativeRun", "run",
           "autograd_oracle", "tune_step_size", "per_run"]

GradientOracle = Callable[[torch.Tensor, torch.Generator], torch.Tensor]


def per_run(name: str, value, runs: int, like: torch.Tensor, lo: float | None = None,
            hi: float | None = None) -> torch.Tensor:
    """``value`` (number or [runs] tensor/sequence) as a ``[runs, 1]`` column, checked to lie in [lo, hi]."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a number or a tensor of {runs} numbers, got {value!r}")
    t = torch.as_tensor(value, dtype=like.dtype, device=like.device)
    if t.ndim == 0:
        t = t.expand(runs)
    if t.shape != (runs,):
        raise ValueError(f"{name} must be a number or have shape [{runs}] (one per run), got shape {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got {value!r}")
    if (lo is not None and (t < lo).any()) or (hi is not None and (t > hi).any()):
        raise ValueError(f"{name} must lie in [{lo}, {hi}], got {value!r}")
    return t[:, None]


def _collaborator_mean(grads: torch.Tensor) -> torch.Tensor:
    """g_avg = (1/N) sum_{i>=1} g_i: [R, d]. (``.contiguous()`` first: torch's mean over the strided slice
    is ~100x slower on CPU.)"""
    return grads[:, 1:].contiguous().mean(1)


class Method(Protocol):
    name: str

    def init(self, x0: torch.Tensor, n_collaborators: int): ...

    def direction(self, grads: torch.Tensor, state, x: torch.Tensor, generator): ...


class Alone:
    """User 0 alone: g_t = g_0 (collaborators' gradients are drawn but unused, so the random
    stream is the same as WGA's and BC's)."""

    name = "Alone"

    def init(self, x0, n_collaborators):
        return None

    def direction(self, grads, state, x, generator):
        return grads[:, 0], state


@dataclass
class WGA:
    """Weighted gradient averaging (Alg. 2): g_t = (1 - a) g_0 + a g_avg, a in [0, 1] (number or [R])."""

    a: float | torch.Tensor = 0.5
    name = "WGA"

    def init(self, x0, n_collaborators):
        return per_run("a", self.a, x0.shape[0], x0, 0.0, 1.0)

    def direction(self, grads, a, x, generator):
        return (1 - a) * grads[:, 0] + a * _collaborator_mean(grads), a


@dataclass
class BC:
    """Bias correction with an EMA bias estimate (Alg. 3): g_t = (1 - a) g_0 + a (g_avg - c_t),
    c_{t+1} = (1 - b) c_t + b (g_avg - g_0), c_0 = ``c0`` (default 0). ``a``, ``b`` in [0, 1]."""

    a: float | torch.Tensor = 0.9
    b: float | torch.Tensor = 0.01
    c0: float = 0.0
    name = "BC"

    def init(self, x0, n_collaborators):
        runs = x0.shape[0]
        a = per_run("a", self.a, runs, x0, 0.0, 1.0)
        b = per_run("b", self.b, runs, x0, 0.0, 1.0)
        if not is_real(self.c0) or self.c0 != self.c0:
            raise ValueError(f"c0 must be a number (the initial bias estimate, every coordinate), got {self.c0!r}")
        return a, b, torch.full_like(x0, float(self.c0))

    def direction(self, grads, state, x, generator):
        a, b, c = state
        g0, g_avg = grads[:, 0], _collaborator_mean(grads)
        g = (1 - a) * g0 + a * (g_avg - c)
        c = (1 - b) * c + b * (g_avg - g0)
        return g, (a, b, c)


@dataclass
class BiasOracleBC:
    """BC given a bias oracle (Thm. 2): c_t = bias(x_t) + (s_b / sqrt(N)) * standard normal, where
    ``bias(x [R, d]) -> [R, d]`` returns the true grad f_avg(x) - grad f_0(x)
    (e.g. ``NoisyQuadraticUsers.bias``). The noise is drawn from the run's generator after the gradients."""

    bias: Callable[[torch.Tensor], torch.Tensor]
    a: float | torch.Tensor = 0.9
    s_b: float = 1.0
    name = "Bias oracle"

    def init(self, x0, n_collaborators):
        if not is_real(self.s_b) or not self.s_b >= 0:
            raise ValueError(f"s_b must be a number >= 0, got {self.s_b!r}")
        return per_run("a", self.a, x0.shape[0], x0, 0.0, 1.0), float(self.s_b) / n_collaborators ** 0.5

    def direction(self, grads, state, x, generator):
        a, scale = state
        noise = torch.randn(x.shape, generator=generator, dtype=x.dtype, device=x.device)
        c = self.bias(x) + scale * noise
        return (1 - a) * grads[:, 0] + a * (_collaborator_mean(grads) - c), state


@dataclass
class CollaborativeRun:
    """Result of :func:`run`: ``steps [K]`` (0, every, 2*every, ..., T), ``losses [K, R]`` (f_0(x_t) - f_0*
    per run at those steps, when a loss function was given, else None) and the final points ``x [R, d]``."""

    method: str
    steps: torch.Tensor
    losses: torch.Tensor | None
    x: torch.Tensor

    def frame(self, run_offset: int = 0) -> pd.DataFrame:
        """Tidy frame: step, run, loss (one row per recorded step and run)."""
        if self.losses is None:
            raise ValueError("this run recorded no losses (pass loss= to run())")
        import pandas as pd

        k, r = self.losses.shape
        return pd.DataFrame({"step": self.steps.repeat_interleave(r).cpu().numpy(),
                             "run": (torch.arange(r).repeat(k) + run_offset).numpy(),
                             "loss": self.losses.reshape(-1).cpu().numpy()})


def run(method, oracle: GradientOracle, x0: torch.Tensor, *, steps: int, eta, generator: torch.Generator,
        loss: Callable[[torch.Tensor], torch.Tensor] | None = None, record_every: int = 1,
        cpu_threads: int | None = 1) -> CollaborativeRun:
    """Run ``method`` (Alone, WGA, BC, BiasOracleBC) for ``steps`` steps from ``x0 [R, d]`` (R runs at once).

    Each step: G = oracle(x, generator) [R, N+1, d]; g = method's pseudo-gradient; x <- x - eta g (eq. 2).
    ``eta`` is a number > 0 or a tensor [R]. ``loss(x [R, d]) -> [R]`` is recorded at step 0 and every
    ``record_every`` steps (and at the last step).
    ``cpu_threads``: torch intra-op threads while this runs (restored afterwards; None leaves them). The
    per-step tensors are small, so one thread is fastest, and on a loaded machine multi-threaded
    reductions of ~1e5 elements can be 20x slower.
    """
    if cpu_threads is None:
        return _run(method, oracle, x0, steps, eta, generator, loss, record_every)
    check_int("cpu_threads", cpu_threads, 1, "an integer >= 1 or None")
    before = torch.get_num_threads()
    torch.set_num_threads(cpu_threads)
    try:
        return _run(method, oracle, x0, steps, eta, generator, loss, record_every)
    finally:
        torch.set_num_threads(before)


def _run(method, oracle, x0, steps, eta, generator, loss, record_every) -> CollaborativeRun:
    check_int("steps", steps, 0), check_int("record_every", record_every, 1)
    if not isinstance(x0, torch.Tensor) or x0.ndim != 2 or not x0.is_floating_point():
        raise ValueError(f"x0 must be a floating tensor of shape [runs, d], got {getattr(x0, 'shape', x0)!r}")
    x = x0.clone()
    runs = x.shape[0]
    eta = per_run("eta", eta, runs, x, 0.0, None)
    if (eta <= 0).any():
        raise ValueError(f"eta must be > 0, got {eta.flatten().tolist()[:5]}")
    probe = oracle(x, generator)
    if probe.ndim != 3 or probe.shape[0] != runs or probe.shape[2] != x.shape[1] or probe.shape[1] < 2:
        raise ValueError(f"the oracle must return [R={runs}, N+1 >= 2, d={x.shape[1]}] gradients, "
                         f"got {tuple(probe.shape)}")
    state = method.init(x, probe.shape[1] - 1)
    record = [t for t in range(0, steps + 1, record_every)]
    if record[-1] != steps:
        record.append(steps)
    losses = [loss(x)] if loss is not None else None
    grads = probe
    for t in range(1, steps + 1):
        g, state = method.direction(grads, state, x, generator)
        x = x - eta * g
        if losses is not None and (t % record_every == 0 or t == steps):
            losses.append(loss(x))
        if t < steps:
            grads = oracle(x, generator)
    return CollaborativeRun(method=method.name, steps=torch.tensor(record),
                            losses=torch.stack(losses) if losses is not None else None, x=x)


def autograd_oracle(sample_losses: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
                    n_users: int) -> GradientOracle:
    """A gradient oracle for any differentiable objective of ``n_users`` users (user 0 + N collaborators).

    ``sample_losses(x_users [R, n_users, d], generator) -> [R, n_users]`` returns one stochastic loss per
    run and user, user i's loss at ``x_users[:, i]`` (every user is given user 0's point). Runs and users do
    not interact, so the gradient of the sum is each (run, user) gradient: one autograd call per step.
    """
    check_int("n_users (user 0 plus N >= 1 collaborators)", n_users, 2)

    def oracle(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        with torch.enable_grad():
            xs = x.detach()[:, None, :].expand(-1, n_users, -1).clone().requires_grad_(True)
            values = sample_losses(xs, generator)
            if values.shape != xs.shape[:2]:
                raise ValueError(f"sample_losses must return [R, n_users] = {tuple(xs.shape[:2])}, "
                                 f"got {tuple(values.shape)}")
            (grads,) = torch.autograd.grad(values.sum(), xs)
        return grads

    return oracle


def tune_step_size(make_method: Callable[[], object], oracle: GradientOracle, x0: torch.Tensor, etas, *,
                   steps: int, generator: torch.Generator,
                   loss: Callable[[torch.Tensor], torch.Tensor]) -> tuple[float, pd.DataFrame]:
    """Pick the step size with the lowest mean final loss, all grid points in one batched pass.

    ``x0 [R, d]`` holds the runs for one step size; the batch is ``len(etas) * R`` runs (grid-major).
    Returns (best eta, frame with eta, mean final loss, its standard error, runs).
    """
    etas = [float(e) for e in etas]
    if not etas or any(not e > 0 for e in etas):
        raise ValueError(f"etas must be a non-empty list of numbers > 0, got {etas!r}")
    runs = x0.shape[0]
    eta = torch.tensor(etas, dtype=x0.dtype, device=x0.device).repeat_interleave(runs)
    result = run(make_method(), oracle, x0.repeat(len(etas), 1), steps=steps, eta=eta, generator=generator,
                 loss=loss, record_every=max(steps, 1))
    import pandas as pd

    final = result.losses[-1].reshape(len(etas), runs)
    table = pd.DataFrame({"eta": etas, "final_loss": final.mean(1).cpu().numpy(),
                          "se": (final.std(1) / runs ** 0.5).cpu().numpy(), "runs": runs})
    return float(table.loc[table["final_loss"].idxmin(), "eta"]), table
