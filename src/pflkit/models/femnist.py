"""The FEMNIST CNN of Reddi et al. (2021), used by Charles & Konecny (App. E.1).

conv 3x3 (c1) -> ReLU -> conv 3x3 (c2) -> ReLU -> 2x2 max-pool -> dropout(0.25) -> flatten -> dense
(hidden) -> ReLU -> dropout(0.5) -> dense softmax over ``num_classes`` (62 for FEMNIST). Paper widths:
c1 = 32, c2 = 64, hidden = 128; ``width`` scales all three (CPU runs use width < 1).

Dropout: the engine's training steps (``engine.local_sgd`` -> ``FunctionalModel.train_grad``) run
the dropout layers with an independent mask per model and sample; evaluation and gradient estimates
run without (eval mode). ``FunctionalModel(..., dropout=False)`` turns dropout off in training too.
"""
from __future__ import annotations

from torch import nn


def femnist_cnn(input_shape: tuple[int, int, int] = (1, 28, 28), num_classes: int = 62,
                width: float = 1.0, channels: tuple[int, int] = (32, 64), hidden: int = 128) -> nn.Module:
    if len(input_shape) != 3:
        raise ValueError(f"femnist_cnn needs input_shape (C, H, W), got {input_shape!r}")
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width!r}")
    c, h, w = input_shape
    c1, c2, d = (max(1, round(v * width)) for v in (*channels, hidden))
    feat = c2 * ((h - 4) // 2) * ((w - 4) // 2)
    return nn.Sequential(
        nn.Conv2d(c, c1, 3), nn.ReLU(), nn.Conv2d(c1, c2, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        nn.Flatten(), nn.Linear(feat, d), nn.ReLU(), nn.Dropout(0.5), nn.Linear(d, num_classes),
    )
