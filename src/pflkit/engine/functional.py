"""A module template turned into pure functions of (stacked) parameters via torch.func."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, vmap
from torch.nn.modules.dropout import _DropoutNd

from .params import Params, init_params
from .stacked import StackedSequential, compile_sequential
from .stacked_conv import CONV_LAYOUTS, conv_layout_for


class FunctionalModel:
    """Wraps an ``nn.Module`` template (its own parameters are never trained).

    ``loss(params, x, y)`` is the mean cross-entropy of one model on one batch;
    ``batched_grad(params, x, y)`` is the same for N models at once: params [N, ..], x [N, B, ..],
    y [N, B] -> (grads [N, ..], losses [N]).

    ``stacked`` picks how N models run. ``"dense"`` (default): plain ``nn.Sequential`` models of
    Flatten / Linear / ReLU run as stacked tensor ops with a hand-written backward
    (``engine.stacked``; 5x faster than vmap for logistic regression). ``"all"`` also stacks
    Conv2d / MaxPool2d networks' gradients and evaluation (one grouped convolution under autograd;
    measured within 5% of vmap on CPU, where the convolutions dominate, so vmap stays the default
    there; a CNN's K-step client update and its minibatch gradients are ``engine.stacked_conv`` under
    either setting). ``False``: always ``vmap(grad_and_value(loss))``, which is also used for any other
    module, inside torch.func transforms and for parameters that require grad. Every path gives the
    gradient of the same loss.

    The module stays in eval mode: evaluation and every gradient used for estimates (PERM's alpha,
    full-batch gradients) see no dropout. Minibatch training steps (``engine.local_sgd``) call
    ``train_grad``, which applies dropout masks drawn for each model from its own seed (the same masks
    whatever else is in the batch), unless ``dropout=False``.

    ``fast_steps`` (default True): ``local_sgd``'s plain SGD steps on a dense stacked network, or on a CNN
    (Conv2d / ReLU / MaxPool2d, Flatten, Linear / ReLU: ``models.cnn``), run K at a time (``sgd_steps``,
    ``engine.stacked`` / ``engine.stacked_conv``); False runs them one ``sgd_step_`` at a time (for a CNN
    under the default ``stacked``: vmap), the path the K-step one is tested and benchmarked against
    (within float rounding of each other); for a CNN it also moves ``batched_grad`` back to vmap.
    ``conv_layout`` ("loop" | "grouped", default per device type:
    ``stacked_conv.CONV_LAYOUT``) is how the K-step path runs a CNN's convolutions.
    """

    def __init__(self, factory: Callable[[], nn.Module], device: str | torch.device = "cpu",
                 stacked: bool | str = "dense", dropout: bool = True, fast_steps: bool = True,
                 conv_layout: str | None = None):
        self.factory = factory
        self.module = factory().to(device)
        self.module.eval()
        if list(self.module.buffers()):
            raise ValueError("models with buffers (e.g. BatchNorm) cannot be stacked; use GroupNorm")
        if not isinstance(dropout, bool):
            raise ValueError(f"dropout must be True or False, got {dropout!r}")
        if not isinstance(fast_steps, bool):
            raise ValueError(f"fast_steps must be True or False, got {fast_steps!r}")
        self.fast_steps = fast_steps
        self._activation_bytes: dict = {}
        self.device = torch.device(device)
        # dropout layers apply given masks in training steps (train_grad) and are off everywhere else
        self._dropouts = [m for m in self.module.modules() if isinstance(m, _DropoutNd)] if dropout else []
        for m in self._dropouts:
            if type(m) is not nn.Dropout:
                raise ValueError(f"per-model dropout masks support nn.Dropout layers, got {type(m).__name__}; "
                                 "build the model with dropout=False to train without")
            m.register_forward_hook(_apply_given_mask)
        self.dropout = bool(self._dropouts)
        self._dropout_shapes: dict[tuple, list[tuple]] = {}
        self._batched_grad = vmap(grad_and_value(self.loss))
        self._batched_train_grad = vmap(grad_and_value(self._loss_with_masks))
        self._batched_eval = vmap(self._masked_stats)
        self._batched_masked_grad = vmap(grad_and_value(self._masked_loss))
        # a subclass that redefines the loss or the forward pass keeps the vmap path
        overridden = any(getattr(type(self), f) is not getattr(FunctionalModel, f)
                         for f in ("loss", "forward", "_masked_loss", "_masked_stats"))
        if stacked not in (True, False, "dense", "all"):
            raise ValueError(f"stacked must be 'dense', 'all' or False, got {stacked!r}")
        layers = compile_sequential(self.module) if stacked and not overridden else None
        net = None if layers is None else StackedSequential(layers)
        self.stacked = net if net is not None and (stacked == "all" or net.dense) else None
        # the K plain SGD steps at once: dense networks and CNNs (engine.stacked_conv, also under the
        # default stacked="dense", where a CNN's evaluation stays on vmap; its batched_grad takes stacked_conv too)
        self._steps_net = net if net is not None and (net.dense or net.conv_steps is not None) else None
        if conv_layout is not None and conv_layout not in CONV_LAYOUTS:
            raise ValueError(f"conv_layout must be one of {CONV_LAYOUTS} or None, got {conv_layout!r}")
        self.conv_layout = conv_layout or conv_layout_for(self.device)

    def _use_stacked(self, params: Params) -> bool:
        return self.stacked is not None and self._graph_free(params)

    def _fast_net(self, params: Params):
        """The network of the K-step path (``sgd_steps``; a CNN's ``batched_grad`` too) where it applies to
        ``params``: ``fast_steps``, a dense or CNN network, outside torch.func transforms, params without a
        graph; else None."""
        return self._steps_net if self.fast_steps and self._steps_net is not None and self._graph_free(params) \
            else None

    @staticmethod
    def _graph_free(params: Params) -> bool:
        if torch._C._functorch.peek_interpreter_stack() is not None:
            return False  # inside vmap / grad / jvp: let torch.func see every op
        return not (torch.is_grad_enabled() and any(v.requires_grad for v in params.values()))

    def init(self, seed: int) -> Params:
        return init_params(self.factory, seed, self.device)

    def forward(self, params: Params, x: Tensor) -> Tensor:
        return functional_call(self.module, params, (x,))

    def loss(self, params: Params, x: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(self.forward(params, x), y)

    def batched_grad(self, params: Params, x: Tensor, y: Tensor, out: Params | None = None) -> tuple[Params, Tensor]:
        """Model i's gradient of its mean loss on (x[i], y[i]), and the losses [N]. A CNN of
        ``engine.stacked_conv``'s shape takes that module's forward and backward (as its K steps do, and
        under the same conditions: ``fast_steps``, outside torch.func transforms, params without a graph).

        ``out`` (tensors shaped as ``params``, e.g. ``empty_like`` of them): the gradients are written there
        and ``out`` is returned, the same numbers. A loop that takes a gradient per step (pFedMe, Per-FedAvg)
        passes one set of buffers: a fresh N x P gradient is fresh memory from the OS each time (above
        malloc's mmap threshold), and faulting its pages in took about 110 of a CNN gradient's 546 ms
        (perm_fig2's paper CNN, 50 clients, 1 thread: benchmarks/results/grad_buffers.md)."""
        if out is None:
            return self._grad(params, x, y, None)
        grads, losses = self._grad(params, x, y, out)
        for k, g in grads.items():
            if g is not out[k]:
                out[k].copy_(g)
        return out, losses

    def _grad(self, params: Params, x: Tensor, y: Tensor, out: Params | None) -> tuple[Params, Tensor]:
        if self._use_stacked(params):
            return self.stacked.grad(params, x, y)
        net = self._fast_net(params)
        if net is not None and net.conv_steps is not None:
            return net.conv_steps.grad(params, x, y, self.conv_layout, out)
        return self._batched_grad(params, x, y)

    def train_grad(self, params: Params, x: Tensor, y: Tensor, seeds: Tensor) -> tuple[Params, Tensor]:
        """``batched_grad`` of a training step: every dropout layer multiplies by its mask, model i's drawn
        from ``seeds[i]`` alone (``dropout_masks``). The same as ``batched_grad`` for a model without dropout
        or built with dropout=False."""
        if not self.dropout:
            return self.batched_grad(params, x, y)
        return self._batched_train_grad(params, x, y, self.dropout_masks(x, seeds))

    def dropout_masks(self, x: Tensor, seeds: Tensor) -> list[Tensor]:
        """Per dropout layer, the masks [N, B, *its input] for the batches ``x`` [N, B, ..]: model i's from a
        generator seeded with ``seeds[i]`` (each unit kept with probability 1 - p, scaled by 1 / (1 - p))."""
        key = tuple(x.shape[2:])
        if key not in self._dropout_shapes:  # the layers' input shapes, from one sample through the template
            seen = {}

            def probe(mod, inputs, output):  # records, returns None: the output stays
                seen.setdefault(id(mod), tuple(inputs[0].shape[1:]))

            self._forward_with_hooks(self._dropouts, probe, x[0, :1])
            self._dropout_shapes[key] = [seen[id(m)] for m in self._dropouts]
        shapes, batch = self._dropout_shapes[key], x.shape[1]
        masks = []
        for seed in torch.as_tensor(seeds).tolist():
            g = torch.Generator(device=self.device).manual_seed(seed)
            masks.append([(torch.rand(batch, *shape, generator=g, device=self.device) >= m.p).float()
                          * (0.0 if m.p >= 1 else 1.0 / (1.0 - m.p)) for shape, m in zip(shapes, self._dropouts)])
        return [torch.stack(layer) for layer in zip(*masks)]

    def _loss_with_masks(self, params: Params, x: Tensor, y: Tensor, masks: list[Tensor]) -> Tensor:
        for layer, mask in zip(self._dropouts, masks):
            layer.given_mask = mask
        try:
            return self.loss(params, x, y)
        finally:
            for layer in self._dropouts:
                layer.given_mask = None

    def sgd_step_(self, params: Params, x: Tensor, y: Tensor, lr: Tensor) -> Tensor:
        """In place: params_i <- params_i - lr_i * grad of model i's mean loss on (x_i, y_i).

        Returns the losses [N] before the step. ``lr`` is [N]."""
        if self._use_stacked(params):
            return self.stacked.sgd_step_(params, x, y, lr)
        grads, losses = self.batched_grad(params, x, y)
        with torch.no_grad():
            for k, p in params.items():
                p.sub_(lr.reshape(-1, *([1] * (p.dim() - 1))) * grads[k])
        return losses

    def sgd_steps(self, params: Params, data, idx: Tensor, lr: Tensor) -> tuple[Params, Tensor] | None:
        """K plain SGD steps on ``data``'s train rows ``idx`` [K, N, B] with steps ``lr`` [K, N]: the new
        parameters and the minibatch losses [K, N], or None where only ``sgd_step_`` applies (neither a dense
        stacked network nor a CNN of ``engine.stacked_conv``'s shape, ``stacked=False``, ``fast_steps=False``,
        inside torch.func transforms or with differentiable params)."""
        net = self._fast_net(params)
        return None if net is None else net.sgd_steps(params, data, idx, lr, self.conv_layout)

    # full-batch (padded + masked) losses: used for exact client gradients and evaluation; ``count`` (the
    # client's whole row count, default the mask's) divides the loss sum, so that slices of a client's
    # rows (engine.full_batch) give parts that add up to its mean
    def _masked_loss(self, params: Params, x: Tensor, y: Tensor, mask: Tensor, count: Tensor | None = None) -> Tensor:
        per = F.cross_entropy(self.forward(params, x), y, reduction="none")
        m = mask.to(per.dtype)
        return (per * m).sum() / (m.sum() if count is None else count)

    def _masked_stats(self, params: Params, x: Tensor, y: Tensor, mask: Tensor):
        logits = self.forward(params, x)
        per = F.cross_entropy(logits, y, reduction="none")
        m = mask.to(per.dtype)
        correct = ((logits.argmax(-1) == y).to(per.dtype) * m).sum()
        return (per * m).sum(), correct

    def batched_full_grad(self, params: Params, x: Tensor, y: Tensor, mask: Tensor, count: Tensor | None = None):
        """Exact gradient of each model's mean loss over its (padded) client data (the masked loss sum
        divided by ``count`` [N] where given)."""
        if self._use_stacked(params):
            return self.stacked.grad(params, x, y, mask, count)
        if count is None:
            return self._batched_masked_grad(params, x, y, mask)
        return self._batched_masked_grad(params, x, y, mask, count.to(x.dtype))

    def batched_stats(self, params: Params, x: Tensor, y: Tensor, mask: Tensor, count: Tensor | None = None):
        """Per model: (sum of losses, number correct) over the masked samples (``count`` is not needed:
        sums add up over slices)."""
        if self._use_stacked(params):
            return self.stacked.stats(params, x, y, mask)
        with torch.no_grad():
            return self._batched_eval(params, x, y, mask)

    def activation_bytes(self, feature_shape: tuple[int, ...]) -> int:
        """Bytes of one input row and of every layer's output for it (a forward pass of one zero sample
        with hooks, once per input shape; views of a tensor already counted are not counted again):
        what ``engine.full_batch`` sizes its row chunks by."""
        key = tuple(feature_shape)
        if key not in self._activation_bytes:
            x = torch.zeros(1, *key, device=self.device)
            seen, total = {x.untyped_storage().data_ptr()}, [x.numel() * x.element_size()]

            def hook(_module, _inputs, out):
                if isinstance(out, Tensor) and out.untyped_storage().data_ptr() not in seen:
                    seen.add(out.untyped_storage().data_ptr())
                    total.append(out.numel() * out.element_size())

            leaves = [m for m in self.module.modules() if not list(m.children())]
            try:
                self._forward_with_hooks(leaves, hook, x)
            except Exception:  # noqa: BLE001 (a module that runs only through an overridden forward/loss:
                total = total[:1]  # the input's bytes are the estimate)
            self._activation_bytes[key] = int(sum(total))
        return self._activation_bytes[key]

    def _forward_with_hooks(self, modules, hook, x: Tensor) -> None:
        """One forward pass of the template on ``x`` without gradients, ``hook`` a forward hook of every module
        of ``modules`` during it (how the shapes of dropout inputs and the activation sizes are read)."""
        handles = [m.register_forward_hook(hook) for m in modules]
        try:
            with torch.no_grad():
                self.module(x)
        finally:
            for h in handles:
                h.remove()


def _apply_given_mask(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
    """A dropout layer's forward hook: its input times the mask ``train_grad`` gave it (the layer is in eval
    mode, so its own output is its input), or its output as is when none was given."""
    mask = getattr(module, "given_mask", None)
    return output if mask is None else inputs[0] * mask
