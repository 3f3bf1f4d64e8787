"""The hot primitive: K SGD steps for N models at once, each on its own client.

``schedule[s, i]`` is the client model i sits on at step s and ``lr[s, i]`` its step size, so the
same call runs FedAvg (all models on their own client), PERM's shuffling (model i moves between
clients with step eta * alpha_i(client) * N) and fine-tuning.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..data.draws import as_draws
from ..data.federated import FederatedDataset
from .full_batch import over_buckets, rows_per_call
from .functional import FunctionalModel
from .params import Params, num_models, scale_like


def expand_schedule(clients: Tensor, steps: int) -> Tensor:
    """[N] (fixed client per model) or [steps, N] -> [steps, N] int64 on CPU."""
    clients = torch.as_tensor(clients, dtype=torch.long).cpu()
    if clients.dim() == 1:
        return clients.unsqueeze(0).expand(steps, -1)
    if clients.dim() == 2 and clients.shape[0] == steps:
        return clients
    raise ValueError(f"clients must have shape [N] or [steps={steps}, N], got {tuple(clients.shape)}")


def expand_lr(lr: float | Tensor, steps: int, n: int, device) -> Tensor:
    """Scalar, [N] (one value per model), [steps, 1] (one per step) or [steps, N] -> [steps, N].

    A 1-D tensor always means one value per model: per-step values must say so with shape
    [steps, 1], so a length that happens to equal both steps and N is never misread."""
    lr = torch.as_tensor(lr, dtype=torch.float32, device=device)
    if lr.dim() == 0:
        return lr.expand(steps, n)
    if lr.dim() == 1 and lr.shape[0] == n:
        return lr.unsqueeze(0).expand(steps, n)
    if lr.dim() == 2 and lr.shape == (steps, 1):
        return lr.expand(steps, n)
    if lr.dim() == 2 and lr.shape == (steps, n):
        return lr
    raise ValueError(f"lr must be a scalar, [N={n}], [steps={steps}, 1] or [steps={steps}, N={n}], "
                     f"got {tuple(lr.shape)}")


def local_sgd(model: FunctionalModel, params: Params, data: FederatedDataset, clients: Tensor, *,
              steps: int, lr: float | Tensor, batch_size: int | None, generator: torch.Generator,
              prox: float = 0.0, anchor: Params | None = None,
              grad_weights: Tensor | None = None, masks: Params | None = None):
    """Run ``steps`` minibatch SGD steps for every stacked model.

    v_i <- v_i - lr[s, i] * g_{s,i},  g_{s,i} = grad f_{schedule[s, i]}(v_i; batch) + prox * (v_i - anchor_i)

    With ``masks`` (0/1, stacked like ``params``) every model trains its sub-model m_i:
    g_{s,i} = m_i (.) grad f(m_i (.) v_i; batch) (+ the prox term), so coordinates outside m_i never move
    (PERM-hetero, partial-training FedAvg; ``models.width``).

    ``batch_size=None`` uses each client's whole train split at every step (exact local GD, over the
    real rows: masked calls per size bucket, of bounded rows, ``engine.full_batch``); no random draws are
    made then, and dropout layers stay off. Minibatch steps run a model's dropout layers
    (``FunctionalModel.train_grad``) with one mask seed per model and step from its client's stream; plain SGD
    steps of a dense stacked network run all K at once (``FunctionalModel.sgd_steps``).
    Returns the new parameters and the minibatch losses [steps, N] (before each step). With
    ``grad_weights`` (theta, shape [steps, 1] or [steps, N]) it also returns sum_s theta_s g_s per model
    as a third value (LocalUpdate's client output). ``lr`` and ``grad_weights`` take the shapes of
    ``expand_lr``.
    """
    n, schedule, lrs = _checked_arguments(params, clients, steps, lr, data.device, prox, anchor, masks)
    full = batch_size is None
    if not full:
        draws = as_draws(generator)
        idx = data.sample_indices(schedule, batch_size, draws)  # [steps, N, B]
    dropout = bool(getattr(model, "dropout", False)) and not full and steps > 0
    if dropout:  # every model's dropout seeds [N, steps], after the minibatches, from the stream of its first client
        seeds = draws.per_client(schedule[0], lambda g, c, m: torch.randint(0, 2**62, (m, steps), generator=g))
    # plain SGD on graph-free tensors: the model applies the step itself (engine.stacked folds it into
    # the weight-gradient matmul, and runs all K steps in one call where it can); prox, grad_weights,
    # masks, dropout or differentiable inputs take the general path
    fused = (not prox and grad_weights is None and masks is None and not dropout and hasattr(model, "sgd_step_")
             and not (torch.is_grad_enabled() and any(p.requires_grad for p in params.values())))
    if fused and not full and steps and hasattr(model, "sgd_steps"):
        got = model.sgd_steps(params, data, idx, lrs)
        if got is not None:
            return got
    losses = torch.empty(steps, n, device=data.device)
    names = list(params)
    # one working copy, updated in place with fused multi-tensor ops (the caller's tensors are untouched)
    cur = [params[k].clone() for k in names]
    dims = sorted({p.dim() for p in cur})
    anchors = None if not prox else [anchor[k] for k in names]
    mask_list = None if masks is None else [masks[k] for k in names]
    acc = None
    if grad_weights is not None:
        theta = expand_lr(grad_weights, steps, n, data.device)
        acc = [torch.zeros_like(p) for p in cur]
    per_call = rows_per_call(model, data) if full else None  # full-batch rows per call (memory)
    for s in range(steps):
        stacked = dict(zip(names, cur if mask_list is None else torch._foreach_mul(cur, mask_list)))
        if full:
            grads, loss = over_buckets(model.batched_full_grad, stacked, data, "train", schedule[s], rows=per_call)
        else:
            rows = idx[s].reshape(-1)
            x = data.x_train.index_select(0, rows).reshape(*idx.shape[1:], *data.x_train.shape[1:])
            y = data.y_train.index_select(0, rows).reshape(*idx.shape[1:], *data.y_train.shape[1:])
            if fused:
                losses[s] = model.sgd_step_(stacked, x, y, lrs[s])
                continue
            grads, loss = model.train_grad(stacked, x, y, seeds[:, s]) if dropout else model.batched_grad(stacked, x, y)
        losses[s] = loss
        g = [grads[k] for k in names]
        if mask_list is not None:  # m (.) g
            g = torch._foreach_mul(g, mask_list)
        if prox:  # g + prox * (v - anchor)
            g = torch._foreach_add(g, torch._foreach_mul(torch._foreach_sub(cur, anchors), prox))
        if acc is not None:
            torch._foreach_add_(acc, torch._foreach_mul(g, _per_model(theta[s], dims, cur)))
        torch._foreach_sub_(cur, torch._foreach_mul(g, _per_model(lrs[s], dims, cur)))
    params = dict(zip(names, cur))
    if acc is not None:
        return params, losses, dict(zip(names, acc))
    return params, losses


def _checked_arguments(params: Params, clients: Tensor, steps: int, lr: float | Tensor, device, prox: float,
                       anchor: Params | None, masks: Params | None) -> tuple[int, Tensor, Tensor]:
    """:func:`local_sgd`'s arguments checked (ValueError naming the one at fault): the number of stacked models,
    the per-step client schedule [steps, N] and the per-step lrs [steps, N]."""
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps!r}")
    n = num_models(params)
    schedule = expand_schedule(clients, steps)
    if schedule.shape[1] != n:
        raise ValueError(f"clients assigns {schedule.shape[1]} models but params stack {n}")
    lrs = expand_lr(lr, steps, n, device)
    if prox and anchor is None:
        raise ValueError("prox > 0 needs an anchor (the parameters to stay close to)")
    if masks is not None and (set(masks) != set(params) or num_models(masks) != n):
        raise ValueError("masks must have the same names and number of models as params")
    return n, schedule, lrs


def _per_model(values: Tensor, dims: list[int], like: list[Tensor]) -> list[Tensor]:
    """A per-model vector [n] viewed to broadcast against each stacked tensor [n, ..]."""
    views = {d: scale_like(values, torch.empty((0,) * d)) for d in dims}
    return [views[p.dim()] for p in like]
