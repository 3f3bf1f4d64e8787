"""Stacked execution of plain ``nn.Sequential`` models: N models' layers as batched tensor ops.

``vmap(grad)`` pays a large fixed cost per call (functorch wrapping of every op), which dominates
small models (logistic regression: ~0.8 ms per call vs ~0.3 ms of actual work). For the layer types
the pflkit models use, the N-model computation is written directly:

* ``Linear``   z = b + h W^T for all models at once (``torch.baddbmm`` over the model dimension);
* ``ReLU``, ``Flatten``;
* ``Conv2d`` / ``MaxPool2d``  one grouped convolution (groups = N) on activations laid out
  [B, N*C, H, W], so the N models never leave one kernel call.

Dense networks (Flatten / Linear / ReLU only) get a hand-written backward pass: the mean
cross-entropy gradient dz = (softmax(z) - onehot(y)) w_b with w_b = 1/B (or mask / sum(mask)),
then dW = dz^T h, db = sum_b dz, dh = dz W, ReLU passes dh where z > 0 -- exactly the chain rule
autograd applies, with no graph bookkeeping. Networks with convolutions run the stacked forward
under ordinary autograd (``FunctionalModel(stacked="all")``), and their K plain SGD steps in
``engine.stacked_conv`` (``sgd_steps``, under every ``stacked`` but False). Any other module falls back
to ``vmap(grad)`` in ``FunctionalModel``.

**K steps at once** (``sgd_steps``, what ``local_sgd`` runs for plain SGD on a dense network): the
same backward with activations laid out [N, features, B] (classes before samples), so the softmax
runs over a middle dimension (several times cheaper on CPU than over a last dimension of 2 classes);
the first layer's bias is the weight of an input column of ones, the labels of all K steps are
gathered in one op, dz = lr_i / B (softmax - onehot) is one ``addcmul`` with the scaled one-hot
labels prepared before the loop, and the losses are read after the loop from the stored
log-probabilities: six ops per step for logistic regression where ``sgd_step_`` takes about twenty
(benchmarks/results/overhead_cpu.md times both). The same arithmetic up to float rounding (the
matmuls sum in another order): tests/unit/test_engine_stacked.py checks it against ``sgd_step_`` on
the same draws.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .stacked_conv import ConvSteps, conv_plan

DENSE = (nn.Flatten, nn.Linear, nn.ReLU)
#: ``sgd_steps``: the per-call buffers of logits and scaled one-hot labels ([steps, N, classes, B] each)
#: stay under this many bytes (longer runs are taken in chunks of steps)
STEP_BUFFER_BYTES = 32 * 2**20
#: ``sgd_steps`` of a single Linear gather from the aligned copy of the inputs
#: (``FederatedDataset.train_rows_with_ones``) only where that copy takes at most this many bytes (it stays
#: cached with the data)
ROWS_COPY_BYTES = 64 * 2**20
SUPPORTED = DENSE + (nn.Conv2d, nn.MaxPool2d)


def _plain_conv(layer: nn.Conv2d) -> bool:
    return (layer.groups == 1 and layer.padding_mode == "zeros" and isinstance(layer.padding, tuple)
            and layer.bias is not None)


def _plain_pool(layer: nn.MaxPool2d) -> bool:
    return not layer.return_indices and not layer.ceil_mode and layer.dilation in (1, (1, 1))


def compile_sequential(module: nn.Module):
    """The layer list [(prefix, layer)] when ``module`` can run stacked, else None."""
    if not isinstance(module, nn.Sequential) or len(module) == 0:
        return None
    layers = []
    for name, layer in module.named_children():
        if not isinstance(layer, SUPPORTED):
            return None
        if isinstance(layer, nn.Flatten) and (layer.start_dim != 1 or layer.end_dim != -1):
            return None
        if isinstance(layer, nn.Linear) and layer.bias is None:
            return None
        if isinstance(layer, nn.Conv2d) and not _plain_conv(layer):
            return None
        if isinstance(layer, nn.MaxPool2d) and not _plain_pool(layer):
            return None
        layers.append((name, layer))
    if not any(isinstance(layer, nn.Linear) for _, layer in layers):
        return None
    if not isinstance(layers[-1][1], nn.Linear):
        return None  # logits must come from a Linear layer
    return layers


def is_dense(layers) -> bool:
    return all(isinstance(layer, DENSE) for _, layer in layers)


class StackedSequential:
    """Forward / loss / gradient of N stacked copies of one supported ``nn.Sequential``."""

    def __init__(self, layers):
        self.layers = layers
        self.dense = is_dense(layers)
        self.linear_plan = _linear_plan(layers) if self.dense else None
        plan = None if self.dense else conv_plan(layers)
        #: the K-step client update of a CNN (``engine.stacked_conv``), None for other non-dense networks
        self.conv_steps = None if plan is None else ConvSteps(plan)

    # ------------------------------------------------------------------ forward
    def forward(self, params: dict, x: Tensor, keep: list | None = None) -> Tensor:
        """Logits [N, B, classes] for inputs [N, B, *features].

        ``keep`` (dense networks only) collects (prefix, layer, input) for the backward pass."""
        n, b = x.shape[0], x.shape[1]
        h = x
        conv_layout = False  # activations as [B, N*C, H, W] inside the convolutional part
        for name, layer in self.layers:
            if isinstance(layer, nn.Conv2d):
                if not conv_layout:
                    h = h.transpose(0, 1).reshape(b, n * h.shape[2], *h.shape[3:])
                    conv_layout = True
                w = params[f"{name}.weight"]
                h = F.conv2d(h, w.reshape(n * w.shape[1], *w.shape[2:]), params[f"{name}.bias"].reshape(-1),
                             stride=layer.stride, padding=layer.padding, dilation=layer.dilation, groups=n)
            elif isinstance(layer, nn.MaxPool2d):
                h = F.max_pool2d(h, layer.kernel_size, layer.stride, layer.padding)
            elif isinstance(layer, nn.ReLU):
                h = torch.relu(h)
            elif isinstance(layer, nn.Flatten):
                if conv_layout:
                    h = h.reshape(b, n, -1).transpose(0, 1)
                    conv_layout = False
                else:
                    h = h.reshape(n, b, -1)
            else:  # Linear
                if conv_layout:
                    raise ValueError("a Linear layer directly after a Conv2d needs a Flatten between them")
                if keep is not None:
                    keep.append((name, h))
                w = params[f"{name}.weight"]
                h = torch.baddbmm(params[f"{name}.bias"].unsqueeze(1), h, w.transpose(1, 2))
                if keep is not None:
                    keep.append((name + ".out", h))
        return h

    # ------------------------------------------------------------------ losses
    @staticmethod
    def _weights(y: Tensor, mask: Tensor | None, dtype, count: Tensor | None = None) -> Tensor:
        """Per-sample weights [N, B] of the mean loss: 1/B, or mask / sum(mask) (mask / count with the
        clients' whole row counts ``count`` [N])."""
        if mask is None:
            return torch.full(y.shape, 1.0 / y.shape[1], dtype=dtype, device=y.device)
        m = mask.to(dtype)
        return m / (m.sum(1, keepdim=True) if count is None else count.to(dtype).unsqueeze(1))

    def stats(self, params: dict, x: Tensor, y: Tensor, mask: Tensor):
        """Per model: (sum of masked losses, number correct), no gradients."""
        with torch.no_grad():
            logits = self.forward(params, x)
            per = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
            m = mask.to(per.dtype)
            correct = ((logits.argmax(-1) == y).to(per.dtype) * m).sum(1)
            return (per * m).sum(1), correct

    def grad(self, params: dict, x: Tensor, y: Tensor, mask: Tensor | None = None, count: Tensor | None = None):
        """(grads, losses [N]) of each model's mean (or masked mean) cross-entropy; with ``count`` [N] the
        masked loss sum divided by it."""
        if self.dense:
            with torch.no_grad():
                return self._dense_grad(params, x, y, mask, count)
        leaves = {k: v.detach().requires_grad_() for k, v in params.items()}
        with torch.enable_grad():
            logits = self.forward(leaves, x)
            per = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
            losses = (per * self._weights(y, mask, per.dtype, count)).sum(1)
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        return dict(zip(leaves, grads)), losses.detach()

    def _dense_grad(self, params: dict, x: Tensor, y: Tensor, mask: Tensor | None, count: Tensor | None = None):
        grads = {}
        losses = self._dense_backward(params, x, y, mask, None, grads, count)
        return {k: grads[k] for k in params}, losses

    def sgd_step_(self, params: dict, x: Tensor, y: Tensor, lr: Tensor) -> Tensor:
        """One SGD step v <- v - lr_i grad f(v; x_i, y_i) in place on ``params``; returns losses [N].

        Dense networks fold the step into the weight-gradient matmul (W <- W - (lr dz)^T h, one
        ``baddbmm_``), so the N x P gradient is never materialised; other networks compute the
        gradients and apply them with one fused multi-tensor update."""
        with torch.no_grad():
            if self.dense:
                return self._dense_backward(params, x, y, None, lr, None)
            grads, losses = self.grad(params, x, y)
            keys = list(params)
            cur = [params[k] for k in keys]
            torch._foreach_sub_(cur, torch._foreach_mul([grads[k] for k in keys],
                                                        [lr.reshape(-1, *([1] * (p.dim() - 1))) for p in cur]))
            return losses

    def _dense_backward(self, params: dict, x: Tensor, y: Tensor, mask: Tensor | None,
                        lr: Tensor | None, grads: dict | None, count: Tensor | None = None) -> Tensor:
        """Backward pass of the mean cross-entropy; fills ``grads`` or, with ``lr``, updates in place."""
        keep: list = []
        logits = self.forward(params, x, keep)
        logp = torch.log_softmax(logits, -1)
        w = self._weights(y, mask, logp.dtype, count)
        nll = -logp.gather(-1, y.unsqueeze(-1)).squeeze(-1)
        losses = (nll * w).sum(1)
        dz = logp.exp_()  # softmax
        dz.scatter_add_(-1, y.unsqueeze(-1), torch.full_like(nll, -1.0).unsqueeze(-1))
        dz.mul_(w.unsqueeze(-1))
        # keep holds (name, input) and (name.out, pre-activation) of every Linear, in order
        linear_in = {name: h for name, h in keep if not name.endswith(".out")}
        linear_out = {name[:-4]: h for name, h in keep if name.endswith(".out")}
        first_linear = next(name for name, layer in self.layers if isinstance(layer, nn.Linear))
        relu_pending = False
        for name, layer in reversed(self.layers):
            if isinstance(layer, nn.ReLU):
                relu_pending = True
                continue
            if isinstance(layer, nn.Flatten):
                continue
            if relu_pending:  # the ReLU after this Linear: pass the gradient where z > 0
                dz = dz.masked_fill_(linear_out[name] <= 0, 0.0)
                relu_pending = False
            h = linear_in[name]
            weight, bias = params[f"{name}.weight"], params[f"{name}.bias"]
            # the gradient w.r.t. this layer's input uses the weights before the update
            dh = torch.bmm(dz, weight) if name != first_linear else None
            if lr is None:
                grads[f"{name}.weight"] = torch.bmm(dz.transpose(1, 2), h)
                grads[f"{name}.bias"] = dz.sum(1)
            else:
                step = dz * lr.reshape(-1, 1, 1)
                weight.baddbmm_(step.transpose(1, 2), h, alpha=-1.0)
                bias.sub_(step.sum(1))
            dz = dh
        return losses

    # ------------------------------------------------------------------ one model, every client's rows
    def grads_at(self, w: dict, data, split: str, rows: int) -> dict:
        """The exact mean-loss gradient of every client of ``data`` (its ``split``) at ONE dense model ``w``
        (no leading dim): stacked [N, ..].

        One unbatched pass over the flat store in chunks of at most ``rows`` rows, activations
        [features, rows]: forward, dz = softmax - onehot, then per layer one weight-gradient matmul per
        (chunk, client) segment and the bias sums per segment; each client's sums are divided by its size
        at the end. On the train split the first layer reads ``rows_with_ones(data)`` where there is one:
        its bias gradient then comes out of the weight-gradient matmul (the column of ones)."""
        plan = self.linear_plan
        x, y, _, sizes = data._split(split)
        ones = rows_with_ones(data) if split == "train" else None
        d = math.prod(x.shape[1:])
        weights, biases = [w[wk] for wk, _, _ in plan], [w[bk].unsqueeze(1) for _, bk, _ in plan]
        if ones is not None:  # the first layer as [W, b, 0..]: inputs [x, 1, 0..]
            w0 = weights[0]
            weights[0] = torch.cat([w0, biases[0], w0.new_zeros(w0.shape[0], ones.shape[1] - d - 1)], 1)
            x, biases[0] = ones, None
        n, total = sizes.numel(), x.shape[0]
        dev, dtype = x.device, weights[0].dtype
        gw = [torch.zeros(n, *v.shape, dtype=dtype, device=dev) for v in weights]
        gb = [None if v is None else torch.zeros(n, v.shape[0], dtype=dtype, device=dev) for v in biases]
        bounds = torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)]).tolist()
        first = 0  # the first client with rows in the chunk
        with torch.no_grad():
            for a in range(0, total, rows):
                e = min(a + rows, total)
                h, inputs = x[a:e].reshape(e - a, -1).T, []  # [D, r]
                for layer, (wt, bias, (_, _, relu)) in enumerate(zip(weights, biases, plan)):
                    if relu:  # the first layer's input is the data itself: not in place
                        h = h.relu_() if layer else h.relu()
                    inputs.append(h)
                    h = torch.mm(wt, h) if bias is None else torch.addmm(bias, wt, h)  # [out, r]
                dz = torch.softmax(h, 0)
                dz.scatter_add_(0, y[a:e].unsqueeze(0), torch.full((1, e - a), -1.0, dtype=dtype, device=dev))
                while bounds[first + 1] <= a:
                    first += 1
                segments, c = [], first
                while c < n and bounds[c] < e:
                    segments.append((c, max(bounds[c], a) - a, min(bounds[c + 1], e) - a))
                    c += 1
                for layer in range(len(plan) - 1, -1, -1):
                    wt, h_in = weights[layer], inputs[layer]
                    dh = torch.mm(wt.T, dz) if layer else None
                    for c, s0, s1 in segments:
                        gw[layer][c].addmm_(dz[:, s0:s1], h_in[:, s0:s1].T)
                        if gb[layer] is not None:
                            gb[layer][c].add_(dz[:, s0:s1].sum(1))
                    if layer and plan[layer][2]:
                        dh = torch.ops.aten.threshold_backward(dh, h_in, 0)  # ReLU: dh where its output > 0
                    dz = dh
        per = sizes.to(dev, dtype)
        if ones is not None:
            gw[0], gb[0] = gw[0][:, :, :d], gw[0][:, :, d]
        out = {}
        for (wk, bk, _), g_w, g_b in zip(plan, gw, gb):
            out[wk], out[bk] = g_w / per.reshape(-1, 1, 1), g_b / per.reshape(-1, 1)
        return {k: out[k] for k in w}

    # ------------------------------------------------------------------ K steps, [N, features, B] layout
    def sgd_steps(self, params: dict, data, idx: Tensor, lr: Tensor, conv_layout: str = "loop") -> tuple[dict, Tensor]:
        """K plain SGD steps of a dense network on ``data`` (a ``FederatedDataset``): at step s model i takes
        the train rows ``idx[s, i]`` ([K, N, B]) and the step ``lr[s, i]`` ([K, N]). Returns the new
        parameters (``params`` is untouched) and the minibatch losses [K, N] (before each step).

        Activations are [N, features, B]; the first layer's bias rides as the weight of an input column
        of ones, so a logistic model's step is six ops: gather, bmm, log_softmax, exp, addcmul
        (dz = lr_i / B (softmax - onehot)) and baddbmm_ (the update). A single Linear (whose steps the
        gather dominates) takes its minibatches from ``data.train_rows_with_ones()`` (whole 64-byte rows:
        12% faster on the logistic round) where that copy of the inputs takes at most ``ROWS_COPY_BYTES``;
        otherwise they are gathered from ``x_train`` into rows ending in a 1.

        A CNN (``conv_steps``) runs ``engine.stacked_conv`` instead, its convolutions in ``conv_layout``."""
        if not self.dense:
            return self.conv_steps.sgd_steps(params, data, idx, lr, conv_layout)
        steps, n, b = idx.shape
        plan = self.linear_plan
        x_store, y_store = data.x_train, data.y_train
        d = math.prod(x_store.shape[1:])
        copy = rows_with_ones(data) if len(plan) == 1 else None
        first = [params[plan[0][0]], params[plan[0][1]].unsqueeze(2)]
        if copy is not None:
            first.append(first[0].new_zeros(n, first[0].shape[1], copy.shape[1] - d - 1))
        w0 = torch.cat(first, 2)  # [N, out, D + 1 (+ zero columns)]
        deep = [(params[wk].clone(), params[bk].unsqueeze(2).clone(), relu) for wk, bk, relu in plan[1:]]
        dtype, device = w0.dtype, w0.device
        classes = (deep[-1][0] if deep else w0).shape[1]
        rows = torch.empty(n * b, w0.shape[2], dtype=dtype, device=device)
        if copy is not None:
            x_store, gathered = copy, rows
        else:
            rows[:, d] = 1.0
            gathered = rows[:, :d].view(n * b, *x_store.shape[1:])  # index_select writes the features here
        x_rows = rows.view(n, b, -1)
        x_in = x_rows.transpose(1, 2)  # [N, D + 1 (+ zeros), B]
        z = torch.empty(n, classes, b, dtype=dtype, device=device)
        prob = torch.empty_like(z)
        scale = (lr / b).to(dtype).reshape(steps, n, 1, 1)
        same_lr = lr.stride(0) == 0  # one step size per model for every step (an expanded [N] or scalar)
        losses = torch.empty(steps, n, dtype=dtype, device=device)
        # the [k, N, classes, B] buffers (log-probabilities, -lr_i / B * onehot) stay under STEP_BUFFER_BYTES
        chunk = max(1, min(steps, STEP_BUFFER_BYTES // (2 * n * classes * b * rows.element_size())))
        with torch.no_grad():
            for a in range(0, steps, chunk):
                k = min(chunk, steps - a)
                y = y_store.index_select(0, idx[a:a + k].reshape(-1)).view(k, n, 1, b)
                sc = scale[a:a + k]
                target = torch.zeros(k, n, classes, b, dtype=dtype, device=device)
                target.scatter_(2, y, -sc.expand(k, n, 1, b))
                logp = torch.empty(k, n, classes, b, dtype=dtype, device=device)
                step = zip(idx[a:a + k].reshape(k, n * b), logp, target, [sc[0]] * k if same_lr else sc)
                if not deep and not plan[0][2]:  # one Linear (logistic regression): the step inline
                    for r, lp, tg, c in step:
                        torch.index_select(x_store, 0, r, out=gathered)
                        torch.bmm(w0, x_in, out=z)
                        torch.exp(torch.log_softmax(z, 1, out=lp), out=prob)
                        w0.baddbmm_(torch.addcmul(tg, prob, c, out=prob), x_rows, alpha=-1.0)
                else:
                    for r, lp, tg, c in step:
                        torch.index_select(x_store, 0, r, out=gathered)
                        _deep_step(w0, deep, x_in.relu_() if plan[0][2] else x_in, z, lp, prob, tg, c)
                losses[a:a + k] = logp.gather(2, y).squeeze(2).sum(2).div_(-b)
        new = {plan[0][0]: w0[:, :, :d].contiguous(), plan[0][1]: w0[:, :, d].contiguous()}
        for (wk, bk, _), (w, bias, _) in zip(plan[1:], deep):
            new[wk], new[bk] = w, bias.squeeze(2)
        return {k: new[k] for k in params}, losses


def rows_with_ones(data) -> Tensor | None:
    """``data.train_rows_with_ones()`` (the inputs as 64-byte rows ending in a 1) where that copy takes at
    most ``ROWS_COPY_BYTES``, else None."""
    x = data.x_train
    width = -(-(math.prod(x.shape[1:]) + 1) // 16) * 16
    return data.train_rows_with_ones() if x.shape[0] * width * x.element_size() <= ROWS_COPY_BYTES else None


def _deep_step(w0: Tensor, deep: list, x_in: Tensor, z: Tensor, lp: Tensor, prob: Tensor, target: Tensor,
               scale: Tensor) -> None:
    """One SGD step of a network with hidden layers, in place (``sgd_steps``' layout): ``w0`` the first
    layer with its bias column, ``deep`` the later layers as (weight, bias [N, out, 1], ReLU on its
    input), ``x_in`` the gathered inputs [N, D + 1, B]; the logits go to ``z`` and their log-softmax to
    ``lp``."""
    inputs, h = [], torch.bmm(w0, x_in)
    for layer, (w, bias, relu) in enumerate(deep):
        if relu:
            h = h.relu_()
        inputs.append(h)
        h = torch.baddbmm(bias, w, h, out=z if layer == len(deep) - 1 else None)
    torch.exp(torch.log_softmax(z, 1, out=lp), out=prob)
    dz = torch.addcmul(target, prob, scale)  # lr_i / B * (softmax - onehot)
    for (w, bias, relu), h in zip(reversed(deep), reversed(inputs)):
        dh = torch.bmm(w.transpose(1, 2), dz)  # with the weights before the step
        w.baddbmm_(dz, h.transpose(1, 2), alpha=-1.0)
        bias.sub_(dz.sum(2, keepdim=True))
        dz = torch.ops.aten.threshold_backward(dh, h, 0) if relu else dh  # ReLU: dh where its output > 0
    w0.baddbmm_(dz, x_in.transpose(1, 2), alpha=-1.0)


def _linear_plan(layers) -> list[tuple[str, str, bool]]:
    """(weight key, bias key, ReLU on its input) for each Linear of a dense network, in order."""
    plan, relu = [], False
    for name, layer in layers:
        if isinstance(layer, nn.ReLU):
            relu = True
        elif isinstance(layer, nn.Linear):
            plan.append((f"{name}.weight", f"{name}.bias", relu))
            relu = False
    return plan
