"""Full-batch passes over every client's real rows: exact gradients and evaluation statistics, with the
memory of each call bounded.

* ``over_buckets``: a masked batched call per size bucket (``FederatedDataset.size_buckets``), every
  model on its own client's rows; at most ``rows`` rows (models x columns) per call: a wider bucket is
  taken in column slices whose results add up (the masked calls are told each client's whole row count),
  and fewer models per call.
* ``full_gradients``: each stacked model's exact gradient on its client (``over_buckets``).
* ``full_gradients_at``: every client's exact gradient at ONE model w (PERM's alpha and global step).
  A dense stacked network (``engine.stacked``) runs one unbatched pass over the flat store in row
  chunks, with per-client segment sums: no buckets, no padding (its first layer reads the inputs'
  cached 64-byte-row copy where there is one). Other models take ``full_gradients`` of w broadcast.

Memory: a call holds at most ``rows_per_call`` rows, ``budget`` bytes (default ``FULL_BATCH_BYTES``) over
the model's estimated bytes per row (``ROW_BYTES_FACTOR`` x its input and every layer's output for one
sample: activations, their gradients and temporaries). Chunking changes only the order of float sums.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..checks import check_int
from ..data.federated import FederatedDataset
from .params import Params, broadcast, num_models, take

#: bytes of activations a full-batch call may hold (the default ``budget``)
FULL_BATCH_BYTES = 256 * 2**20
#: a row's memory in a gradient call, per byte of its input and layer outputs (forward activations,
#: their gradients, and the temporaries of vmap and autograd)
ROW_BYTES_FACTOR = 4


def rows_per_call(model, data: FederatedDataset, budget: int | None = None) -> int:
    """How many rows (models x samples) a full-batch call of ``model`` on ``data`` may take."""
    budget = FULL_BATCH_BYTES if budget is None else budget
    check_int("budget", budget, 1, "a positive number of bytes")
    measure = getattr(model, "activation_bytes", None)
    per_row = measure(data.feature_shape) if measure is not None else \
        data.x_train[:1].numel() * data.x_train.element_size()
    return max(1, budget // (ROW_BYTES_FACTOR * max(1, per_row)))


def full_gradients(model, params: Params, data: FederatedDataset, split: str = "train",
                   budget: int | None = None) -> tuple[Params, Tensor]:
    """Exact gradient of f_j at model j's parameters for every client j (params stacked [N, ..]), and
    the losses [N]. Runs over the real rows only (up to size-bucket padding, ``over_buckets``), at most
    ``rows_per_call(model, data, budget)`` rows per call."""
    return over_buckets(model.batched_full_grad, params, data, split, rows=rows_per_call(model, data, budget))


def full_gradients_at(model, w: Params, data: FederatedDataset, split: str = "train",
                      budget: int | None = None) -> Params:
    """grad f_j(w) for every client j at one model ``w`` (no leading dim): stacked [N, ..]."""
    if _dense(model, w):
        return model.stacked.grads_at(w, data, split, rows_per_call(model, data, budget))
    return full_gradients(model, broadcast(w, data.num_clients), data, split, budget)[0]


def _dense(model, w: Params) -> bool:
    stacked = getattr(model, "stacked", None)
    return stacked is not None and stacked.dense and model._use_stacked(w)


def over_buckets(fn, params: Params, data: FederatedDataset, split: str, clients: Tensor | None = None,
                 chunk: int | None = None, rows: int | None = None):
    """``fn(params_b, x_b, y_b, mask_b)`` for every model on its client's whole ``split``, one call per size
    bucket (``FederatedDataset.size_buckets``) instead of one call padded to the largest client.

    Model i sits on client ``clients[i]`` (default: model j on client j). ``fn`` is a masked batched call
    (``batched_full_grad``, ``batched_stats``) returning a tuple of tensors [n_b, ..] or dicts of them;
    the results come back in model order, as one call over all models would return them. ``chunk``
    caps the models per call. ``rows`` caps models x columns per call (memory): a bucket wider than
    ``rows`` is taken in column slices, each called as ``fn(params, x, y, mask, count)`` with ``count``
    [n_b] the clients' whole row counts (a mean divides by it), and the slices' results are added.
    Per-model results are exact: a model sees its client's rows, masked, so only the summation order
    can differ from a call padded to another width."""
    n = num_models(params)
    buckets, where = data.size_buckets(split)
    clients = torch.arange(n) if clients is None else torch.as_tensor(clients, dtype=torch.long).cpu()
    if clients.shape != (n,):
        raise ValueError(f"clients must assign one client to each of the {n} models, got {tuple(clients.shape)}")
    chunk = n if chunk is None else int(chunk)
    dev = data.device
    b_of, r_of = where[clients, 0], where[clients, 1]
    order, parts = [], []
    for b, bucket in enumerate(buckets):
        pos = (b_of == b).nonzero().squeeze(1)
        if pos.numel() == 0:
            continue
        width = bucket.width if rows is None else min(bucket.width, rows)  # columns per call
        per_call = chunk if rows is None else max(1, min(chunk, rows // width))  # models per call
        for a in range(0, pos.numel(), per_call):
            p, r = pos[a:a + per_call], r_of[pos[a:a + per_call]]
            if r.numel() == bucket.clients.numel() and bool((r == torch.arange(r.numel())).all()):
                x, y, m = bucket.x, bucket.y, bucket.mask  # the whole bucket in order: no copy
            else:
                rd = r.to(dev)
                x, y, m = bucket.x[rd], bucket.y[rd], bucket.mask[rd]
            whole = p.numel() == n  # then p is 0..n-1 in order (clients in one bucket, increasing rows)
            sub = params if whole else take(params, p.to(dev))
            if width == bucket.width:
                parts.append(fn(sub, x, y, m))
            else:
                count = m.sum(1)
                parts.append(_sum([fn(sub, x[:, c:c + width], y[:, c:c + width], m[:, c:c + width], count)
                                   for c in range(0, bucket.width, width)]))
            order.append(p)
    if len(parts) == 1 and bool((order[0] == torch.arange(n)).all()):
        return parts[0]
    inv = torch.argsort(torch.cat(order)).to(dev)
    return tuple(_gather_back([part[i] for part in parts], inv) for i in range(len(parts[0])))


def _sum(results: list):
    """Elementwise sum, in order, of results shaped as ``fn`` returns them (tuples of tensors or of dicts)."""
    total = results[0]
    for more in results[1:]:
        total = tuple({k: t[k] + m[k] for k in t} if isinstance(t, dict) else t + m for t, m in zip(total, more))
    return total


def _gather_back(pieces: list, inv: Tensor):
    """Concatenate per-bucket results along the model dimension and put them back in model order."""
    if isinstance(pieces[0], dict):
        return {k: torch.cat([p[k] for p in pieces]).index_select(0, inv) for k in pieces[0]}
    return torch.cat(pieces).index_select(0, inv)
