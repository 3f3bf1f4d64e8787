"""The batched multi-client engine: stacked parameters, vmap(grad) over clients, local SGD."""
from ..device import resolve_device
from .full_batch import full_gradients, full_gradients_at
from .functional import FunctionalModel
from .local_sgd import local_sgd
from .params import Params, broadcast, flatten, init_params, mean, num_models, take

__all__ = ["FunctionalModel", "Params", "local_sgd", "full_gradients", "full_gradients_at", "broadcast", "mean",
           "take", "flatten", "init_params", "num_models", "resolve_device", "make_generator"]


def make_generator(seed: int):
    """A CPU torch.Generator seeded with ``seed`` (all sampling in pflkit draws from CPU generators)."""
    import torch
    return torch.Generator().manual_seed(int(seed))
