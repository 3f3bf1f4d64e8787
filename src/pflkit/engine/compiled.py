"""Optional compiled client update: ``local_sgd``'s K plain-SGD minibatch steps of a dense stacked network
(``engine.stacked``: Flatten / Linear / ReLU) as one ``torch.compile``d program (inductor; C++ on CPU).

Eager runs ~20 small ops per step, each paying dispatch overhead (~200 us per step for the logistic
workload); compiled, a step is a few fused loops plus the wide layers' bmm calls, and the K steps are one
``scan`` (compiled once, whatever K). On by ``local_sgd(..., compiled=True)`` or ``PFLKIT_COMPILE=1``;
off by default. Every new (N, B, K, data shape) compiles once per process (seconds). Where the path
cannot run or gain (another model, prox / masks / dropout / full-batch steps, more than ``LARGEST``
stacked parameters, no C++ compiler, a failed compile) it warns and ``local_sgd`` runs eagerly. Same
arithmetic as the eager path up to summation order (~1e-7 apart after 20 steps; tests/unit/test_compiled_steps.py).
"""
from __future__ import annotations

import os
import warnings
import weakref

import torch

SMALL = 16  # a Linear with at most this many outputs multiplies as broadcast-and-sum (fused), wider ones bmm
# above this many stacked parameters (N x per model) arithmetic dominates and eager, updating in place, is as
# fast (1 thread, N = 50: MLP 2x200 = 10M parameters ~10% slower compiled, MLP 2x50 = 2M ~5% faster)
LARGEST = 4_000_000
_programs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # StackedSequential -> {shapes: fn | None}


def requested(compiled: bool | None) -> bool:
    """``compiled``, or the environment's ``PFLKIT_COMPILE`` (1 = on) when it is None."""
    return os.environ.get("PFLKIT_COMPILE", "0") not in ("", "0") if compiled is None else bool(compiled)


def _step(layers, params: dict, x, y, lr):
    """One SGD step of the stacked models, functional: (new params, losses [N] before the step).

    ``layers``: (name, "Linear" | "ReLU" | "Flatten") in order (plain strings: cheap compile guards)."""
    n, b = y.shape
    h, saved = x.reshape(n, b, -1), []
    for name, layer in layers:
        if layer == "Linear":
            w, bias = params[name + ".weight"], params[name + ".bias"]
            z = (h.unsqueeze(-2) * w.unsqueeze(1)).sum(-1) + bias.unsqueeze(1) if w.shape[1] <= SMALL \
                else torch.baddbmm(bias.unsqueeze(1), h, w.transpose(1, 2))
            saved.append((name, h, z))
            h = z
        elif layer == "ReLU":
            h = h.relu()
    logp = torch.log_softmax(h, -1)
    losses = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1).mean(1)
    onehot = y.unsqueeze(-1) == torch.arange(h.shape[-1], device=y.device)
    dz = (logp.exp() - onehot.to(h.dtype)) * (lr / b).reshape(-1, 1, 1)  # lr x mean-loss gradient of the logits
    new, relu = dict(params), False
    for name, layer in reversed(layers):
        relu = relu or layer == "ReLU"
        if layer != "Linear":
            continue
        _, h, z = saved.pop()
        if relu:
            dz, relu = dz.masked_fill(z <= 0, 0.0), False
        w = params[name + ".weight"]
        new[name + ".weight"] = torch.baddbmm(w, dz.transpose(1, 2), h, alpha=-1.0)
        new[name + ".bias"] = params[name + ".bias"] - dz.sum(1)
        if saved:
            dz = torch.bmm(dz, w)
    return new, losses


def _program(layers, names: list[str]):
    from torch._higher_order_ops.scan import scan

    def run(flat, x_train, y_train, idx, lrs):
        def body(carry, xs):
            i, lr = xs
            rows = i.reshape(-1)
            new, losses = _step(layers, dict(zip(names, carry)), x_train.index_select(0, rows),
                                y_train.index_select(0, rows).reshape(i.shape), lr)
            return [new[k] for k in names], losses
        return scan(body, flat, (idx, lrs))
    return torch.compile(run, fullgraph=True, dynamic=False, options={"cpp_wrapper": True})


def run(model, params: dict, data, idx, lrs, unsupported: str | None = None):
    """(new params, losses [K, N]) of K compiled steps on minibatch rows ``idx`` [K, N, B], or None
    after a warning saying why the eager path has to run instead."""
    stacked = getattr(model, "stacked", None)
    if unsupported is None and (stacked is None or not stacked.dense):
        unsupported = f"{type(getattr(model, 'module', model)).__name__} is not a dense stacked network"
    if unsupported is None and sum(p.numel() for p in params.values()) > LARGEST:
        unsupported = f"over {LARGEST:,} stacked parameters: eager is as fast"
    if unsupported is not None:
        warnings.warn(f"compiled local SGD cannot run ({unsupported}); running eagerly", stacklevel=3)
        return None
    names = list(params)
    key = (tuple(names), tuple(idx.shape), tuple(data.x_train.shape), data.x_train.dtype, str(data.device))
    cache = _programs.setdefault(stacked, {})
    if key not in cache:
        cache[key] = _program(tuple((name, type(layer).__name__) for name, layer in stacked.layers), names)
    if cache[key] is not None:
        try:
            with torch.no_grad():
                flat, losses = cache[key]([params[k] for k in names], data.x_train, data.y_train, idx, lrs.contiguous())
            return dict(zip(names, flat)), losses
        except Exception as err:  # no C++ compiler, recompile limit, an op inductor cannot lower: stay correct
            cache[key] = None
            warnings.warn(f"compiled local SGD failed ({type(err).__name__}: {str(err).splitlines()[0]}); "
                          "running eagerly", stacklevel=3)
    return None
