"""Model templates. Every model is a plain ``nn.Module`` without buffers, so the engine can stack
N copies of its parameters and run them with ``torch.func.functional_call``."""
from __future__ import annotations

import math

from torch import nn

from .femnist import femnist_cnn
from .lstm import char_lstm
from .resnet import resnet18_gn

MODELS = ("logistic", "mlp", "cnn", "femnist_cnn", "resnet18_gn", "char_lstm")


def logistic(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Multinomial logistic regression (softmax over ``num_classes`` logits, with bias)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def mlp(input_shape: tuple[int, ...], num_classes: int, hidden: tuple[int, ...] = (200, 200),
        dropout: float = 0.0) -> nn.Module:
    """Fully connected ReLU network (PERM's EMNIST/MNIST model is 2 hidden layers of 200); ``dropout`` > 0
    adds a dropout layer of that rate after every hidden layer."""
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
    layers: list[nn.Module] = [nn.Flatten()]
    width = math.prod(input_shape)
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()] + ([nn.Dropout(dropout)] if dropout else [])
        width = h
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)


def cnn(input_shape: tuple[int, ...], num_classes: int, channels: tuple[int, int] = (32, 64),
        hidden: int = 512) -> nn.Module:
    """The 2-layer CNN of the FedAvg/PERM experiments: two 5x5 conv + 2x2 max-pool blocks, a dense
    hidden layer, softmax output. Sized from ``input_shape`` = (C, H, W) (28x28x1 or 32x32x3)."""
    if len(input_shape) != 3:
        raise ValueError(f"cnn needs input_shape (C, H, W), got {input_shape!r}")
    c, h, w = input_shape
    c1, c2 = channels
    feat = c2 * (h // 4) * (w // 4)
    return nn.Sequential(
        nn.Conv2d(c, c1, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(feat, hidden), nn.ReLU(), nn.Linear(hidden, num_classes),
    )


def build(name: str, input_shape: tuple[int, ...], num_classes: int, **kwargs) -> nn.Module:
    """The model called ``name`` (one of MODELS) for inputs of ``input_shape`` and ``num_classes`` outputs;
    ``kwargs`` go to the model's own function (widths, channels, hidden units)."""
    if name == "logistic":
        return logistic(input_shape, num_classes)
    if name == "mlp":
        return mlp(input_shape, num_classes, **kwargs)
    if name == "cnn":
        return cnn(input_shape, num_classes, **kwargs)
    if name == "femnist_cnn":
        return femnist_cnn(input_shape, num_classes, **kwargs)
    if name == "resnet18_gn":
        return resnet18_gn(input_shape, num_classes, **kwargs)
    if name == "char_lstm":  # input_shape is (sequence length,); the classes are the vocabulary
        return char_lstm(vocab_size=num_classes, **kwargs)
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
