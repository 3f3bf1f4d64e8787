"""Federated and personalized learning algorithms, all batched on the engine."""
from .base import Algorithm
from .fedavg import FedAvg, Local, LocalizedFedAvg

__all__ = ["Algorithm", "Local", "FedAvg", "LocalizedFedAvg"]
