"""K plain SGD steps of N stacked CNNs in one call (``FunctionalModel.sgd_steps`` for a network of
Conv2d / ReLU / MaxPool2d layers, then Flatten, then Linear / ReLU layers: ``models.cnn``), and the N
models' gradients on their own minibatches (``FunctionalModel.batched_grad``: the steps of pFedMe,
Per-FedAvg and PERM's global step) by the same forward and backward.

Forward and backward are written out with ATen's own kernels (``convolution_backward``,
``max_pool2d_with_indices_backward``, ``threshold_backward``), no autograd graph:

* the dense tail runs batched over the N models, activations [N, B, features]: dz = lr_i / B
  (softmax - onehot), then per Linear dh = dz W (the weights before the step), W <- W - dz^T h (one
  ``baddbmm_``), b <- b - sum_b dz, and ReLU passes dh where its output is > 0. The step size rides in
  dz, so every layer's gradient comes out already scaled and the update is one subtraction;
* the convolutional part runs in one of two layouts (``CONV_LAYOUTS``), chosen per device type
  (``CONV_LAYOUT``, by measurement: benchmarks/results/cnn_stacked.md):

  - ``"loop"``: one plain convolution per model (activations [B, C, H, W] per model, slices of one
    gathered [N, B, C, H, W] batch), forward and backward, inside the one K-step call. On CPU a plain
    convolution of one model's batch runs at close to the machine's matmul rate, while one grouped
    convolution over the N models (groups = N) is 1.1-3.5x slower than the N plain ones (measured on
    this repository's CNN shapes), so a loop of N plain calls is the fastest layout there (with the
    activations channels-last: see ``ConvSteps._forward``);
  - ``"grouped"``: one grouped convolution (groups = N) per layer on activations [B, N*C, H, W] (the N
    models in one kernel call: what a GPU wants, where N small kernel launches would dominate).

  Both are the same arithmetic (tests/unit/test_engine_stacked_conv.py checks both in float64 against
  a per-model autograd loop). ``vmap(grad)`` (``FunctionalModel(fast_steps=False)``, one step at a
  time) stays the reference the K-step path is tested and benchmarked against.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

aten = torch.ops.aten

CONV_LAYOUTS = ("loop", "grouped")
#: the convolutional layers' layout per device type; a device type not listed takes ``"grouped"``
#: (CUDA: not measured yet, no device was lent; grouped is one kernel per layer for the N models)
CONV_LAYOUT = {"cpu": "loop"}


def conv_layout_for(device: torch.device) -> str:
    return CONV_LAYOUT.get(torch.device(device).type, "grouped")


def conv_plan(layers):
    """(convolutional part, tail) of a network that is Conv2d / ReLU / MaxPool2d layers (at least one
    Conv2d), one Flatten, then Linear / ReLU layers ending in a Linear; None for any other network.

    The convolutional part is a list of (kind, name, layer) with kind "conv", "relu" or "pool"; the tail
    is (weight key, bias key, ReLU on its input) per Linear, plus whether a ReLU follows the Flatten
    directly (it is folded into the first Linear's flag)."""
    kinds = {nn.Conv2d: "conv", nn.ReLU: "relu", nn.MaxPool2d: "pool"}
    flat = [i for i, (_, layer) in enumerate(layers) if isinstance(layer, nn.Flatten)]
    if len(flat) != 1:
        return None
    head, rest = layers[:flat[0]], layers[flat[0] + 1:]
    if not head or not all(type(layer) in kinds for _, layer in head):
        return None
    if not any(isinstance(layer, nn.Conv2d) for _, layer in head):
        return None
    if not rest or not all(isinstance(layer, (nn.Linear, nn.ReLU)) for _, layer in rest):
        return None
    if not isinstance(rest[-1][1], nn.Linear):
        return None
    tail, relu = [], False
    for name, layer in rest:
        if isinstance(layer, nn.ReLU):
            relu = True
        else:
            tail.append((f"{name}.weight", f"{name}.bias", relu))
            relu = False
    return [(kinds[type(layer)], name, layer) for name, layer in head], tail


def _pool_args(layer: nn.MaxPool2d):
    pair = nn.modules.utils._pair
    stride = layer.stride if layer.stride is not None else layer.kernel_size
    return [pair(layer.kernel_size), pair(stride), pair(layer.padding), pair(layer.dilation)]


class ConvSteps:
    """The K-step client update of one CNN layer list (``conv_plan``)."""

    def __init__(self, plan):
        self.convs, self.tail = plan
        self.first_conv = next(j for j, (kind, _, _) in enumerate(self.convs) if kind == "conv")
        self.pool_args = {name: _pool_args(layer) for kind, name, layer in self.convs if kind == "pool"}

    # ---------------------------------------------------------------------------- convolutional part
    def _forward(self, weights: dict, h: Tensor, groups: int, saved: list) -> Tensor:
        """The convolutional part on one block of activations (one model's [B, C, H, W], or the N models'
        [B, N*C, H, W] with ``groups`` = N); ``weights[name]`` = (weight, bias) as that block sees them.
        Appends what the backward pass needs to ``saved``.

        On CPU the activations are channels-last after each convolution: the channels-last max-pool kernel
        (vectorized over channels) is 6-15x faster than the NCHW one at these shapes, and the convolutions
        and ReLU run as fast or faster on it (measured: a 5% faster round than converting around the pool
        only). The layout is memory only: every op, and the Flatten (``reshape``), reads in logical order."""
        for j, (kind, name, layer) in enumerate(self.convs):
            if kind == "conv":
                w, b = weights[name]
                saved.append(h)
                h = aten.convolution(h, w, b, list(layer.stride), list(layer.padding), list(layer.dilation),
                                     False, [0, 0], groups)
                if h.device.type == "cpu":  # channels-last from here on (see ``_forward``)
                    h = h.contiguous(memory_format=torch.channels_last)
            elif kind == "relu":
                # in place where the input is an activation of ours, not the gathered data
                h = h.relu_() if j > self.first_conv else h.relu()
                saved.append(h)
            else:
                saved.append(h)
                if h.device.type == "cpu":
                    h, idx = aten.max_pool2d_with_indices(h.contiguous(memory_format=torch.channels_last),
                                                          *self.pool_args[name], False)
                else:
                    h, idx = aten.max_pool2d_with_indices(h, *self.pool_args[name], False)
                saved.append(idx)
        return h

    def _backward_(self, weights: dict, g: Tensor, groups: int, saved: list, grads: dict | None) -> None:
        """Back through the convolutional part from ``g`` (the gradient of its output, already scaled by
        the step size): each weight's gradient subtracted from it in place, or, with ``grads``, stored
        there (``grads[name] = (weight gradient, bias gradient)``) and the weights left alone."""
        for j in range(len(self.convs) - 1, self.first_conv - 1, -1):
            kind, name, layer = self.convs[j]
            if kind == "conv":
                w, b = weights[name]
                gi, gw, gb = aten.convolution_backward(
                    g, saved.pop(), w, [b.shape[0]], list(layer.stride), list(layer.padding),
                    list(layer.dilation), False, [0, 0], groups, [j > self.first_conv, True, True])
                if grads is None:
                    w.sub_(gw)
                    b.sub_(gb)
                else:
                    grads[name] = (gw, gb)
                g = gi
            elif kind == "relu":
                g = aten.threshold_backward(g, saved.pop(), 0)
            else:
                idx, inp = saved.pop(), saved.pop()
                g = aten.max_pool2d_with_indices_backward(g, inp, *self.pool_args[name], False, idx)

    def _blocks(self, params: dict, n: int, layout: str) -> list[dict]:
        """The convolutions' (weight, bias) as each block of activations sees them: per model (``"loop"``),
        or the N models' [N, out, ..] as one grouped convolution's [N*out, ..] (``"grouped"``; views of
        contiguous parameters, so an in-place step on them steps ``params``)."""
        if layout not in CONV_LAYOUTS:
            raise ValueError(f"conv layout must be one of {CONV_LAYOUTS}, got {layout!r}")
        convs = [name for kind, name, _ in self.convs if kind == "conv"]
        if layout == "loop":
            return [{c: (params[f"{c}.weight"][i], params[f"{c}.bias"][i]) for c in convs} for i in range(n)]
        return [{c: (params[f"{c}.weight"].reshape(-1, *params[f"{c}.weight"].shape[2:]),
                     params[f"{c}.bias"].reshape(-1)) for c in convs}]

    def _pass(self, blocks: list[dict], tail: list, x: Tensor, y: Tensor, scale: Tensor, layout: str,
              grads: dict | None = None) -> Tensor:
        """Forward and backward of the N models on their minibatches ``x`` [N, B, C, H, W], ``y`` [N, B, 1]:
        returns the mean losses [N]. Every gradient comes out scaled by ``scale`` [N, 1, 1] (a step size / B,
        riding in dz = scale (softmax - onehot)); without ``grads`` each weight takes it off in place (one SGD
        step), with ``grads`` (a dict) it is stored there -- the convolutions' by name (``_backward_``), the
        tail's Linears by position, (weight gradient [N, out, in], bias gradient [N, out]) -- and no weight
        changes. A tail entry present on entry is where that Linear's gradients go (``grad``'s ``out``: the
        caller's buffers, written in place). ``tail``: (weight [N, out, in], bias [N, 1, out], ReLU on its
        input) per Linear."""
        n, b = x.shape[:2]
        if layout == "loop":
            saved = [[] for _ in range(n)]
            outs = [self._forward(blocks[i], x[i], 1, saved[i]) for i in range(n)]
            shape = outs[0].shape[1:]
            h = torch.stack([o.reshape(b, -1) for o in outs])  # [N, B, features]
        else:
            saved = []
            xg = x.transpose(0, 1).reshape(b, n * x.shape[2], *x.shape[3:])
            out = self._forward(blocks[0], xg, n, saved)
            shape = (out.shape[1] // n, *out.shape[2:])
            h = out.reshape(b, n, -1).transpose(0, 1)  # [N, B, features]
        # dense tail, batched over the models
        inputs = []
        for w, bias, relu in tail:
            if relu:  # h is ours (stacked features, a view of the last block output, or logits)
                h = h.relu_()
            inputs.append(h)
            h = torch.baddbmm(bias, h, w.transpose(1, 2))
        logp = torch.log_softmax(h, 2)
        losses = logp.gather(2, y).squeeze(2).mean(1).neg_()
        dz = logp.exp_().scatter_add_(2, y, torch.full((n, b, 1), -1.0, dtype=h.dtype, device=h.device)).mul_(scale)
        for j in range(len(tail) - 1, -1, -1):
            (w, bias, relu), h_in = tail[j], inputs[j]
            dh = torch.bmm(dz, w)  # with the weights before the step
            if grads is None:
                w.baddbmm_(dz.transpose(1, 2), h_in, alpha=-1.0)
                bias.sub_(dz.sum(1, keepdim=True))
            elif j in grads:  # the caller's buffers (``grad``'s ``out``)
                gw, gb = grads[j]
                torch.bmm(dz.transpose(1, 2), h_in, out=gw)
                torch.sum(dz, 1, out=gb)
            else:
                grads[j] = (torch.bmm(dz.transpose(1, 2), h_in), dz.sum(1))
            dz = aten.threshold_backward(dh, h_in, 0) if relu else dh
        # back through the convolutional part
        if layout == "loop":
            g = dz.view(n, b, *shape)
            per_model = [None if grads is None else {} for _ in range(n)]
            for i in range(n):
                self._backward_(blocks[i], g[i], 1, saved[i], per_model[i])
            if grads is not None:
                for name in per_model[0]:
                    grads[name] = tuple(torch.stack(parts) for parts in zip(*(m[name] for m in per_model)))
        else:
            g = dz.transpose(0, 1).reshape(b, n * shape[0], *shape[1:])
            self._backward_(blocks[0], g, n, saved, grads)
            if grads is not None:
                for name in blocks[0]:
                    gw, gb = grads[name]
                    grads[name] = (gw.view(n, -1, *gw.shape[1:]), gb.view(n, -1))
        return losses

    # ---------------------------------------------------------------------------- K steps, one gradient
    def sgd_steps(self, params: dict, data, idx: Tensor, lr: Tensor, layout: str) -> tuple[dict, Tensor]:
        """K plain SGD steps on ``data``'s train rows ``idx`` [K, N, B] with step sizes ``lr`` [K, N]: the
        new parameters (``params`` untouched) and the minibatch losses [K, N] (before each step)."""
        steps, n, b = idx.shape
        x_store, y_store = data.x_train, data.y_train
        new = {k: v.clone() for k, v in params.items()}  # contiguous copies, updated in place
        blocks = self._blocks(new, n, layout)
        tail = [(new[wk], new[bk].unsqueeze(1), relu) for wk, bk, relu in self.tail]  # bias [N, 1, out]
        dtype, device = new[self.tail[0][0]].dtype, new[self.tail[0][0]].device
        scale = (lr.to(dtype) / b).reshape(steps, n, 1, 1)  # dz = lr_i / B (softmax - onehot)
        losses = torch.empty(steps, n, dtype=dtype, device=device)
        with torch.no_grad():
            for s in range(steps):
                rows = idx[s].reshape(-1)
                x = x_store.index_select(0, rows).view(n, b, *x_store.shape[1:])
                y = y_store.index_select(0, rows).view(n, b, 1)
                losses[s] = self._pass(blocks, tail, x, y, scale[s], layout)
        return {k: new[k] for k in params}, losses

    def grad(self, params: dict, x: Tensor, y: Tensor, layout: str, out: dict | None = None) -> tuple[dict, Tensor]:
        """Each model's gradient of its mean cross-entropy on its own minibatch, x [N, B, C, H, W] and
        y [N, B], and the losses [N]: ``FunctionalModel.batched_grad`` of a CNN, the same forward and
        backward as one of ``sgd_steps``' steps, with the gradients kept instead of applied. ``out``
        (tensors shaped as ``params``): the dense tail's gradients are written into its tensors (the
        weight gradients are the N x P-sized ones: fresh memory per call otherwise); the convolutions' come
        fresh, and ``FunctionalModel.batched_grad`` copies them into ``out``."""
        n, b = x.shape[:2]
        dtype = params[self.tail[0][0]].dtype
        grads: dict = {}
        if out is not None:
            for j, (wk, bk, _) in enumerate(self.tail):
                grads[j] = (out[wk], out[bk])
        with torch.no_grad():
            tail = [(params[wk], params[bk].unsqueeze(1), relu) for wk, bk, relu in self.tail]
            scale = torch.full((n, 1, 1), 1.0 / b, dtype=dtype, device=x.device)
            losses = self._pass(self._blocks(params, n, layout), tail, x, y.reshape(n, b, 1), scale, layout, grads)
        named = {}
        for j, (wk, bk, _) in enumerate(self.tail):
            named[wk], named[bk] = grads.pop(j)
        for name, (gw, gb) in grads.items():
            named[f"{name}.weight"], named[f"{name}.bias"] = gw, gb
        return {k: named[k] for k in params}, losses
