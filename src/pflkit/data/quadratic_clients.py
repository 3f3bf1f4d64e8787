"""Quadratic clients f_i(x) = 1/2 |A_i^1/2 (x - c_i)|^2 (Charles & Konecny, Sec. 2).

Each client i has a spectrum in [mu, L] (Assumption 1), a centre |c_i| <= C (Assumption 2) and a
finite set of stochastic examples z = (B_z, c_z) with per-example loss f(x; z) = 1/2 (x-c_z)^T B_z (x-c_z)
(eq. 1) whose means give the client exactly (eq. 3): A_i = mean_z B_z, c_i = A_i^-1 mean_z B_z c_z.

``QuadraticClients.to_federated()`` stores the examples in a ``FederatedDataset`` (features = the
flattened [B_z, c_z], labels unused) and ``QuadraticModel`` is the matching drop-in for the engine's
``FunctionalModel`` (parameters {"x": [d]}, the per-example quadratic loss instead of cross-entropy),
so the generic LocalUpdate / MAML run on quadratic clients through ``pflkit.engine.local_sgd``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor
from torch.func import grad_and_value, vmap

from ..checks import check_int
from .federated import FederatedDataset

__all__ = ["QuadraticClients", "QuadraticModel", "quadratic_clients", "random_orthogonal"]

DTYPE = torch.float64


def random_orthogonal(n: int, d: int, generator: torch.Generator) -> Tensor:
    """n Haar-random orthogonal d x d matrices (QR of a Gaussian with sign fix), [n, d, d] float64."""
    G = torch.randn(n, d, d, generator=generator, dtype=DTYPE)
    Q, R = torch.linalg.qr(G)
    return Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)


@dataclass
class QuadraticClients:
    """N quadratic clients (float64): A [N, d, d], c [N, d], and their examples B_z [n, d, d],
    c_z [n, d] stored flat (client j owns rows offsets[j] : offsets[j] + sizes[j])."""

    A: Tensor
    c: Tensor
    Bz: Tensor
    cz: Tensor
    offsets: Tensor
    sizes: Tensor
    mu: float
    L: float
    C: float
    _federated: dict | None = field(default=None, repr=False, compare=False)  # dtype -> FederatedDataset

    @property
    def num_clients(self) -> int:
        return int(self.A.shape[0])

    @property
    def dim(self) -> int:
        return int(self.A.shape[-1])

    @property
    def device(self) -> torch.device:
        return self.A.device

    def loss(self, x: Tensor) -> Tensor:
        """f(x) = mean_i f_i(x) (eq. 2), x [d] or [R, d]."""
        e = torch.as_tensor(x, dtype=DTYPE, device=self.device).unsqueeze(-2) - self.c
        return 0.5 * torch.einsum("...nd,nde,...ne->...n", e, self.A, e).mean(-1)

    def minimizer(self) -> Tensor:
        """x* = argmin f = E[A_i]^-1 E[A_i c_i]."""
        return torch.linalg.solve(self.A.mean(0), (self.A @ self.c.unsqueeze(-1)).squeeze(-1).mean(0))

    def to_federated(self, name: str = "quadratic clients", dtype: torch.dtype = torch.float32) -> FederatedDataset:
        """The examples as a FederatedDataset: x = [vec(B_z), c_z] (``dtype``), y = 0 (unused).
        The same examples serve as the test split. Cached per dtype."""
        cache = self._federated if isinstance(self._federated, dict) else {}
        if dtype not in cache:
            feats = torch.cat([self.Bz.reshape(len(self.Bz), -1), self.cz], dim=1).to(dtype)
            y = torch.zeros(len(feats), dtype=torch.long, device=feats.device)
            off, size = self.offsets.cpu(), self.sizes.cpu()
            cache[dtype] = FederatedDataset(feats, y, off, size, feats, y, off, size, num_classes=1, name=name)
            self._federated = cache
        return cache[dtype]

    def sample_indices(self, clients: Tensor, batch_size: int, generator: torch.Generator) -> Tensor:
        """Rows of Bz / cz for minibatches: the engine's sampler (same draws as local_sgd)."""
        return self.to_federated().sample_indices(clients, batch_size, generator).to(self.device)


def quadratic_clients(num_clients: int, dim: int, *, mu: float, L: float, C: float,
                      examples_per_client: int = 1, example_noise: float = 0.0,
                      shared_basis: bool = False, generator: torch.Generator,
                      device: str | torch.device = "cpu") -> QuadraticClients:
    """Random quadratic clients satisfying Assumptions 1-2.

    A_i = U_i diag(lambda_i) U_i^T with lambda_i uniform in [mu, L] and its extremes set to exactly mu
    and L (so Lemmas 3-4 are attained per client); U_i Haar-random, or one shared U when
    ``shared_basis`` (then all A_i commute and share the eigenvectors of mu and L, so kappa (eq. 9)
    equals the condition number of the surrogate's Hessian). c_i uniform in the ball of radius C.

    Examples (``examples_per_client`` n per client): B_z = A_i^1/2 diag(w_z) A_i^1/2 with positive
    w_z whose mean over the client's examples is exactly 1 (spread ``example_noise``), and
    c_z = c_i + B_z^-1 v_z with v_z summing to zero, so mean B_z = A_i and A_i^-1 mean B_z c_z = c_i
    exactly (eq. 3). With n = 1 or noise 0 every example equals (A_i, c_i) and minibatch gradients are
    exact.
    """
    for name, v in (("num_clients", num_clients), ("dim", dim), ("examples_per_client", examples_per_client)):
        check_int(name, v, 1)
    if not (0 < mu <= L) or not math.isfinite(L):
        raise ValueError(f"need 0 < mu <= L < inf, got mu={mu!r}, L={L!r}")
    if not C >= 0:
        raise ValueError(f"C must be >= 0, got {C!r}")
    if not example_noise >= 0:
        raise ValueError(f"example_noise must be >= 0, got {example_noise!r}")
    N, d, n = num_clients, dim, examples_per_client
    g = generator
    lam = mu + (L - mu) * torch.rand(N, d, generator=g, dtype=DTYPE)
    lam[:, 0] = L
    if d > 1:
        lam[:, -1] = mu
    U = random_orthogonal(1 if shared_basis else N, d, g).expand(N, d, d)
    A = (U * lam.unsqueeze(-2)) @ U.transpose(-1, -2)
    A = 0.5 * (A + A.transpose(-1, -2))
    direction = torch.randn(N, d, generator=g, dtype=DTYPE)
    direction = direction / direction.norm(dim=1, keepdim=True)
    radius = C * torch.rand(N, 1, generator=g, dtype=DTYPE) ** (1.0 / d)
    c = direction * radius
    # examples
    logits = example_noise * torch.randn(N, n, d, generator=g, dtype=DTYPE)
    w = torch.exp(logits)
    w = w / w.mean(1, keepdim=True)  # mean over examples exactly 1
    root = (U * lam.sqrt().unsqueeze(-2)) @ U.transpose(-1, -2)  # A^1/2
    Bz = root.unsqueeze(1) @ (w.unsqueeze(-1) * root.unsqueeze(1))  # [N, n, d, d]
    Bz = 0.5 * (Bz + Bz.transpose(-1, -2))
    v = example_noise * max(C, 1.0) * torch.randn(N, n, d, generator=g, dtype=DTYPE)
    v = v - v.mean(1, keepdim=True)
    cz = c.unsqueeze(1) + torch.linalg.solve(Bz, v.unsqueeze(-1)).squeeze(-1)
    sizes = torch.full((N,), n, dtype=torch.long)
    offsets = torch.arange(N, dtype=torch.long) * n
    dev = torch.device(device)
    return QuadraticClients(A.to(dev), c.to(dev), Bz.reshape(N * n, d, d).to(dev), cz.reshape(N * n, d).to(dev),
                            offsets, sizes, float(mu), float(L), float(C))


class QuadraticModel:
    """Drop-in for ``engine.FunctionalModel`` on quadratic examples (eq. 1).

    Parameters are {"x": [d]}; an example's features are [vec(B_z), c_z] (``QuadraticClients.to_federated``)
    and its loss is 1/2 (x - c_z)^T B_z (x - c_z); labels are ignored. ``loss`` is a plain differentiable
    torch function, so torch.func transforms (vmap, grad, grad of grad for MAML) apply.
    """

    def __init__(self, dim: int, device: str | torch.device = "cpu", init_scale: float = 1.0,
                 dtype: torch.dtype = torch.float32):
        self.dim = check_int("dim", dim, 1)
        self.device = torch.device(device)
        self.init_scale = float(init_scale)
        self.dtype = dtype
        self._batched_grad = vmap(grad_and_value(self.loss))
        self._batched_masked_grad = vmap(grad_and_value(self._masked_loss))

    def init(self, seed: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(int(seed))
        return {"x": (self.init_scale * torch.randn(self.dim, generator=g, dtype=DTYPE)).to(self.device, self.dtype)}

    def split(self, feats: Tensor) -> tuple[Tensor, Tensor]:
        d = self.dim
        return feats[..., : d * d].reshape(*feats.shape[:-1], d, d), feats[..., d * d:]

    def per_example(self, params: dict[str, Tensor], feats: Tensor) -> Tensor:
        B, c = self.split(feats)
        e = params["x"] - c
        return 0.5 * torch.einsum("...d,...de,...e->...", e, B, e)

    def loss(self, params: dict[str, Tensor], x: Tensor, y: Tensor | None = None) -> Tensor:
        return self.per_example(params, x).mean()

    def batched_grad(self, params, x, y):
        return self._batched_grad(params, x, y)

    def _masked_loss(self, params, x, y, mask, count=None):
        m = mask.to(x.dtype)
        return (self.per_example(params, x) * m).sum() / (m.sum() if count is None else count)

    def batched_full_grad(self, params, x, y, mask, count=None):
        """Each model's masked mean loss gradient (the loss sum over ``count`` [N] where given:
        ``engine.full_batch`` slices)."""
        if count is None:
            return self._batched_masked_grad(params, x, y, mask)
        return self._batched_masked_grad(params, x, y, mask, count.to(x.dtype))

    def batched_stats(self, params, x, y, mask, count=None):
        """Per model: (sum of losses, 0 correct) over the masked samples (no accuracy for regression)."""
        with torch.no_grad():
            per = vmap(self.per_example)(params, x) * mask.to(x.dtype)
            return per.sum(-1), torch.zeros_like(per.sum(-1))
