"""Reference twins of LocalUpdate, MAML, the Table 1 methods and the server optimizers.

Plain Python loops over clients and steps with ``torch.autograd``; ``loss(params, x, y)`` is any
single-model loss (``FunctionalModel.loss`` or ``QuadraticModel.loss``). Minibatches are given as
explicit row indices into ``data.x_train`` so tests can reproduce the batched code's draws.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

Loss = Callable[[dict, Tensor, Tensor], Tensor]


def _grad(loss: Loss, params: dict, x: Tensor, y: Tensor, create_graph: bool = False) -> dict:
    names = list(params)
    value = loss(params, x, y)
    grads = torch.autograd.grad(value, [params[n] for n in names], create_graph=create_graph)
    return dict(zip(names, grads))


def _leaf(params: dict) -> dict:
    return {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}


def client_update(loss: Loss, x: dict, data, rows: Sequence[Tensor], *, alpha: float, gamma: float,
                  theta: Sequence[float]) -> dict:
    """Alg. 2 for one client: v_1 = x; g_k = grad f(v_k; rows[k]) + alpha (v_k - x); v_{k+1} = v_k - gamma g_k;
    returns sum_k theta_k g_k."""
    v = {k: t.detach().clone() for k, t in x.items()}
    acc = {k: torch.zeros_like(t) for k, t in x.items()}
    for k, th in enumerate(theta):
        leaf = _leaf(v)
        g = _grad(loss, leaf, data.x_train[rows[k]], data.y_train[rows[k]])
        for n in v:
            gk = g[n] + alpha * (v[n] - x[n])
            acc[n] = acc[n] + float(th) * gk
            v[n] = v[n] - gamma * gk
    return acc


def local_update_pseudo_gradient(loss: Loss, x: dict, data, clients: Sequence[int], rows: Tensor, *,
                                 alpha: float, gamma: float, theta: Sequence[float]) -> dict:
    """q_t of Alg. 1: the mean over clients of ClientUpdate; rows [K, M, B] (client m uses rows[:, m])."""
    qs = [client_update(loss, x, data, [rows[k, m] for k in range(rows.shape[0])], alpha=alpha, gamma=gamma,
                        theta=theta) for m in range(len(clients))]
    return {n: sum(q[n] for q in qs) / len(qs) for n in x}


def maml_gradient(loss: Loss, x: dict, data, inner_rows: Sequence[Tensor], outer_rows: Tensor,
                  gamma: float) -> dict:
    """grad_x f(X_K(x); outer batch) by autograd through K explicit SGD steps (second order)."""
    leaf = _leaf(x)
    v = dict(leaf)
    for rows in inner_rows:
        g = _grad(loss, v, data.x_train[rows], data.y_train[rows], create_graph=True)
        v = {n: v[n] - gamma * g[n] for n in v}
    out = loss(v, data.x_train[outer_rows], data.y_train[outer_rows])
    grads = torch.autograd.grad(out, [leaf[n] for n in x])
    return {n: g.detach() for n, g in zip(x, grads)}


# ---------------------------------------------------------------- the named methods' definitions
def sgd_steps(loss: Loss, x: dict, data, rows: Sequence[Tensor], lr: float, prox: float = 0.0) -> dict:
    """Plain minibatch SGD from x (optionally with a proximal pull alpha (v - x) to the start)."""
    v = {k: t.detach().clone() for k, t in x.items()}
    for r in rows:
        g = _grad(loss, _leaf(v), data.x_train[r], data.y_train[r])
        v = {n: v[n] - lr * (g[n] + prox * (v[n] - x[n])) for n in v}
    return v


def fedavg_round(loss: Loss, x: dict, data, rows: Tensor, lr: float, prox: float = 0.0) -> dict:
    """FedAvg (FedProx with prox > 0): each client runs K SGD steps from x; the server averages models.
    rows [K, M, B]."""
    models = [sgd_steps(loss, x, data, [rows[k, m] for k in range(rows.shape[0])], lr, prox)
              for m in range(rows.shape[1])]
    return {n: sum(mo[n] for mo in models) / len(models) for n in x}


def lookahead_step(loss: Loss, x: dict, data, rows: Sequence[Tensor], fast_lr: float, slow_step: float) -> dict:
    """Lookahead (Zhang et al. 2019): K fast SGD steps, then slow weights x + a (x_K - x)."""
    fast = sgd_steps(loss, x, data, rows, fast_lr)
    return {n: x[n] + slow_step * (fast[n] - x[n]) for n in x}


def fomaml_gradient(loss: Loss, x: dict, data, rows: Sequence[Tensor], gamma: float) -> dict:
    """FOMAML: adapt with K-1 SGD steps on rows[:-1]; the gradient at the adapted point on rows[-1]."""
    adapted = sgd_steps(loss, x, data, rows[:-1], gamma)
    return _grad(loss, _leaf(adapted), data.x_train[rows[-1]], data.y_train[rows[-1]])


def server_steps(kind: str, x0: Tensor, grads: Callable[[Tensor], Tensor], lr: float, beta: float,
                 steps: int) -> list[Tensor]:
    """Textbook server optimizers on a vector: gd; heavy-ball x_{t+1} = x_t - lr g(x_t) + beta (x_t - x_{t-1});
    Nesterov x_{t+1} = y_t - lr g(y_t), y_{t+1} = x_{t+1} + beta (x_{t+1} - x_t) (returns the y_t, where
    gradients are taken)."""
    xs = [x0.clone()]
    if kind == "gd":
        for _ in range(steps):
            xs.append(xs[-1] - lr * grads(xs[-1]))
    elif kind == "heavy_ball":
        prev = x0.clone()
        for _ in range(steps):
            cur = xs[-1]
            xs.append(cur - lr * grads(cur) + beta * (cur - prev))
            prev = cur
    elif kind == "nesterov":
        x_prev, y = x0.clone(), x0.clone()
        for _ in range(steps):
            x_new = y - lr * grads(y)
            y = x_new + beta * (x_new - x_prev)
            x_prev = x_new
            xs.append(y)
    else:
        raise ValueError(f"kind must be gd, heavy_ball or nesterov, got {kind!r}")
    return xs
