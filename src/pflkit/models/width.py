"""Width-scalable models: a client's sub-model is a slice of the server model by a width fraction r.

A model is described by its *hidden unit groups* (the hidden neurons of each MLP layer; the
channels of each conv layer and the dense hidden units of the CNN) and, for every parameter tensor,
which group indexes its output dimension (dim 0) and which its input dimension (dim 1). A sub-model
of width r keeps ``ceil(r * size)`` units of every group; the input and the output (classes) are
always kept whole. Everything is stored at full server width:

* ``unit_masks`` -> one 0/1 vector per group and model ([N, size_g]): which units are on;
* ``param_masks`` -> one 0/1 tensor per parameter and model ([N, *shape]): weight (o, c) is on iff
  output unit o and input unit c are on (a bias iff its unit is on).

A masked model (parameters multiplied by its mask) computes exactly what the small sub-model
computes: an off unit has zero incoming weights and bias, so its activation is ReLU(0) = 0 (max-pool
of zeros is 0), and zero outgoing weights, so it adds nothing downstream
(``tests/unit/test_perm_hetero.py`` checks this against explicitly built smaller modules).

Extraction (which units a client gets in round t; HeteroFL / FedRolex terminology):

* ``static``: the first k units (HeteroFL, Diao et al. 2021) — nested: a smaller width is a subset
  of a larger one;
* ``rolling``: the window of k consecutive units starting at unit ``t mod size`` (wrapping around),
  so over rounds every unit gets trained (FedRolex, Alam et al. 2022);
* ``random``: k units drawn uniformly without replacement, fresh every round (Federated Dropout).

Sizes (per model): ``num_parameters`` counts the kept coordinates (= the parameter count of the
sub-model built with ``spec.build(units)``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import torch
from torch import Tensor, nn

from ..checks import is_real
from . import cnn, mlp

EXTRACTIONS = ("static", "rolling", "random")


@dataclass(frozen=True)
class WidthParam:
    """Which hidden unit group indexes dim 0 (``out_group``) and dim 1 (``in_group``) of a parameter
    (None: the input or the classes, always whole). ``in_repeat``: consecutive input columns per unit
    of ``in_group`` (the flatten after the last conv: one channel spans H' x W' features)."""
    name: str
    out_group: int | None
    in_group: int | None = None
    in_repeat: int = 1


@dataclass(frozen=True)
class WidthSpec:
    """A width-scalable model: hidden group sizes, the per-parameter layout, and a builder of the
    plain ``nn.Module`` with given unit counts per group (``build(sizes)`` is the server model)."""
    sizes: tuple[int, ...]
    params: tuple[WidthParam, ...]
    builder: Callable[[tuple[int, ...]], nn.Module]
    kind: str

    @cached_property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Parameter shapes of the server model."""
        return {k: tuple(p.shape) for k, p in self.build().named_parameters()}

    def build(self, units: tuple[int, ...] | None = None) -> nn.Module:
        return self.builder(tuple(self.sizes if units is None else units))

    def factory(self) -> Callable[[], nn.Module]:
        """The server-width model template for ``FunctionalModel``."""
        return lambda: self.build()

    def units(self, fraction: float) -> tuple[int, ...]:
        """Units per group of the sub-model of width ``fraction``."""
        return tuple(units_for(fraction, s) for s in self.sizes)


def units_for(fraction: float, size: int) -> int:
    """ceil(r * size), at least 1 (HeteroFL's rounding)."""
    check_fraction(fraction)
    return max(1, min(size, math.ceil(fraction * size - 1e-9)))


def check_fraction(fraction) -> float:
    if not is_real(fraction) or not 0 < fraction <= 1:
        raise ValueError(f"width fraction must be a number in (0, 1], got {fraction!r}")
    return float(fraction)


def mlp_spec(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (200, 200)) -> WidthSpec:
    """``pflkit.models.mlp`` with every hidden layer scaled by r. Parameter names ``{2l+1}.weight``."""
    layers = []
    for layer in range(len(hidden) + 1):
        out = layer if layer < len(hidden) else None
        inp = layer - 1 if layer > 0 else None
        layers += [WidthParam(f"{2 * layer + 1}.weight", out, inp), WidthParam(f"{2 * layer + 1}.bias", out)]
    return WidthSpec(tuple(hidden), tuple(layers),
                     lambda units: mlp(tuple(input_shape), num_classes, hidden=tuple(units)), "mlp")


def cnn_spec(input_shape: tuple[int, int, int], num_classes: int, channels: tuple[int, int] = (32, 64),
             hidden: int = 512) -> WidthSpec:
    """``pflkit.models.cnn`` with both conv layers' channels and the dense layer scaled by r."""
    _, h, w = input_shape
    hw = (h // 4) * (w // 4)
    layers = (WidthParam("0.weight", 0), WidthParam("0.bias", 0),
              WidthParam("3.weight", 1, 0), WidthParam("3.bias", 1),
              WidthParam("7.weight", 2, 1, hw), WidthParam("7.bias", 2),
              WidthParam("9.weight", None, 2), WidthParam("9.bias", None))
    return WidthSpec((channels[0], channels[1], hidden), layers,
                     lambda u: cnn(tuple(input_shape), num_classes, channels=(u[0], u[1]), hidden=u[2]), "cnn")


def check_fractions(fractions) -> Tensor:
    f = torch.as_tensor(fractions, dtype=torch.float64).flatten()
    if f.numel() == 0 or not bool(((f > 0) & (f <= 1)).all()):
        raise ValueError(f"width fractions must all lie in (0, 1], got {f.tolist()}")
    return f


def unit_masks(spec: WidthSpec, fractions, extraction: str = "static", round: int = 0,
               generator: torch.Generator | None = None, device: str | torch.device = "cpu") -> list[Tensor]:
    """One [N, size_g] float 0/1 tensor per hidden group: the units each of N models keeps."""
    if extraction not in EXTRACTIONS:
        raise ValueError(f"extraction must be one of {EXTRACTIONS}, got {extraction!r}")
    f = check_fractions(fractions)
    masks = []
    for size in spec.sizes:
        k = torch.tensor([units_for(float(r), size) for r in f]).unsqueeze(1)  # [N, 1]
        pos = torch.arange(size).unsqueeze(0)
        if extraction == "static":
            rank = pos
        elif extraction == "rolling":
            rank = (pos - int(round)) % size
        else:
            if generator is None:
                raise ValueError("extraction='random' needs a generator")
            rank = torch.rand(len(f), size, generator=generator).argsort(1).argsort(1)
        masks.append((rank < k).float().to(device))
    return masks


def param_masks(spec: WidthSpec, units: list[Tensor]) -> dict[str, Tensor]:
    """The 0/1 mask of every parameter, [N, *shape], from per-group unit masks ([N, size_g] each)."""
    if len(units) != len(spec.sizes):
        raise ValueError(f"need {len(spec.sizes)} unit masks (one per hidden group), got {len(units)}")
    template = spec.shapes
    n = units[0].shape[0]
    out = {}
    for p in spec.params:
        shape = template[p.name]
        m = torch.ones(n, *shape, device=units[0].device)
        if p.out_group is not None:
            m = m * units[p.out_group].reshape(n, -1, *([1] * (len(shape) - 1)))
        if p.in_group is not None:
            cols = units[p.in_group].repeat_interleave(p.in_repeat, dim=1)
            m = m * cols.reshape(n, 1, -1, *([1] * (len(shape) - 2)))
        out[p.name] = m
    if set(out) != set(template):
        raise ValueError(f"width spec covers {sorted(out)} but the model has {sorted(template)}")
    return out


def masks_for(spec: WidthSpec, fractions, extraction: str = "static", round: int = 0,
              generator: torch.Generator | None = None, device: str | torch.device = "cpu") -> dict[str, Tensor]:
    """``param_masks(unit_masks(...))``: the parameter masks of N sub-models."""
    return param_masks(spec, unit_masks(spec, fractions, extraction, round, generator, device))


def intersect(a: dict[str, Tensor], b: dict[str, Tensor]) -> dict[str, Tensor]:
    """Coordinate-wise AND of two stacked masks (= the masks of the intersected unit sets)."""
    return {k: a[k] * b[k] for k in a}


def num_parameters(masks: dict[str, Tensor]) -> Tensor:
    """Kept coordinates per model: [N] int64."""
    return sum(m.reshape(m.shape[0], -1).sum(1) for m in masks.values()).round().long().cpu()


def unit_indices(units: list[Tensor], model: int) -> list[Tensor]:
    """The kept unit indices of one model, per group (sorted ascending) -- for the reference loops."""
    return [u[model].nonzero().flatten().cpu() for u in units]
