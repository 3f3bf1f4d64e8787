"""Reference twin of algorithms.collaborative on the noisy quadratic users: one run at a time, plain floats.

For each run r the whole random stream is replayed from the same seed: every step draws the batched
xi ``users.sample(R, generator)`` (and, for the bias oracle, the batched noise ``randn(R, d)``) exactly as
the vectorized code does, then keeps only run r's slice. Everything else is a Python loop over time
steps, users and coordinates with the formulas of Alg. 1-3 written out.
"""
from __future__ import annotations

import torch

from pflkit.data.quadratic_users import NoisyQuadraticUsers

METHODS = ("Alone", "WGA", "BC", "Bias oracle")


def collaborative_losses(method: str, users: NoisyQuadraticUsers, x0: list[float], *, runs: int, steps: int,
                         eta: float, seed: int, a: float = 0.0, b: float = 0.0, c0: float = 0.0,
                         s_b: float = 0.0) -> list[list[float]]:
    """Loss f_0(x_t) - f_0* for t = 0..steps, one list per run (all runs start at ``x0``, length d)."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    n, d = users.n_collaborators, users.dim
    h = [float(v) for v in users.curvatures]
    zeta = [float(v) for v in users.bias(torch.zeros(1, d))[0] / -users.curvatures]
    out = []
    for r in range(runs):
        generator = torch.Generator().manual_seed(seed)
        x = [float(v) for v in x0]
        c = [float(c0)] * d
        losses = [sum(0.5 * h[k] * x[k] ** 2 for k in range(d))]
        for _ in range(steps):
            xi = users.sample(runs, generator)[r].tolist()            # [N+1][d], run r's draw
            grads = [[h[k] * (x[k] - xi[i][k]) for k in range(d)] for i in range(n + 1)]
            if method == "Bias oracle":
                noise = torch.randn(runs, d, generator=generator, dtype=users.dtype)[r].tolist()
            new_x = []
            for k in range(d):
                g0 = grads[0][k]
                g_avg = sum(grads[i][k] for i in range(1, n + 1)) / n
                if method == "Alone":
                    g = g0
                elif method == "WGA":
                    g = (1 - a) * g0 + a * g_avg
                elif method == "BC":
                    g = (1 - a) * g0 + a * (g_avg - c[k])
                    c[k] = (1 - b) * c[k] + b * (g_avg - g0)
                else:
                    bias_k = -h[k] * zeta[k]
                    c_k = bias_k + s_b / n ** 0.5 * noise[k]
                    g = (1 - a) * g0 + a * (g_avg - c_k)
                new_x.append(x[k] - eta * g)
            x = new_x
            losses.append(sum(0.5 * h[k] * x[k] ** 2 for k in range(d)))
        out.append(losses)
    return out
