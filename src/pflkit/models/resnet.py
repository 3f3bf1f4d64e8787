"""ResNet-18 with GroupNorm in place of BatchNorm (Hsieh et al. 2020; Charles & Konecny App. E.1,
CIFAR-100). GroupNorm has no running buffers, so the engine can stack and vmap it.

CIFAR-style stem (3x3 conv, stride 1, no max-pool), four stages of two BasicBlocks with
``base * (1, 2, 4, 8)`` channels (paper: base = 64) and strides (1, 2, 2, 2), global average pool,
dense output. ``width`` multiplies ``base`` (CPU runs: e.g. width = 0.125 -> base 8); ``groups`` is
the GroupNorm group count (capped by the channel count). ``blocks`` (default (2, 2, 2, 2) = ResNet-18)
may be reduced for speed.
"""
from __future__ import annotations

from torch import Tensor, nn


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    g = max(1, min(groups, channels))
    while channels % g:
        g -= 1
    return nn.GroupNorm(g, channels)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.norm1 = _norm(cout, groups)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.norm2 = _norm(cout, groups)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(cout, groups))

    def forward(self, x: Tensor) -> Tensor:
        out = self.norm1(self.conv1(x)).relu()
        out = self.norm2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNetGN(nn.Module):
    def __init__(self, input_shape=(3, 32, 32), num_classes: int = 100, width: float = 1.0,
                 base: int = 64, groups: int = 2, blocks: tuple[int, ...] = (2, 2, 2, 2)):
        super().__init__()
        if len(input_shape) != 3:
            raise ValueError(f"resnet18_gn needs input_shape (C, H, W), got {input_shape!r}")
        if not width > 0:
            raise ValueError(f"width must be > 0, got {width!r}")
        c0 = max(1, round(base * width))
        self.stem = nn.Sequential(nn.Conv2d(input_shape[0], c0, 3, 1, 1, bias=False), _norm(c0, groups), nn.ReLU())
        layers, cin = [], c0
        for i, n in enumerate(blocks):
            cout = c0 * 2 ** i
            for b in range(n):
                layers.append(BasicBlock(cin, cout, 2 if (b == 0 and i > 0) else 1, groups))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(cin, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.layers(self.stem(x)).mean(dim=(-2, -1)))


def resnet18_gn(input_shape=(3, 32, 32), num_classes: int = 100, width: float = 1.0, groups: int = 2,
                blocks: tuple[int, ...] = (2, 2, 2, 2)) -> nn.Module:
    """ResNet-18 (GroupNorm); see the module docstring."""
    return ResNetGN(tuple(input_shape), num_classes, width, 64, groups, tuple(blocks))
