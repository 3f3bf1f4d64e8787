"""Federated and personalized learning algorithms, all batched on the engine."""
from .base import Algorithm
from .ditto import Ditto
from .fedavg import FedAvg, Local, LocalizedFedAvg
from .local_update import MAML, LocalUpdate, QuadraticLocalUpdate, ServerOpt, fedprox, fedsgd, fomaml, lookahead
from .local_update import fedavg as fedavg_preset
from .local_update import maml, minibatch_sgd
from .perfedavg import PerFedAvg
from .perm import PERM
from .perm_hetero import PartialFedAvg, PERMHetero
from .pfedme import PFedMe

__all__ = [
    "Algorithm", "Local", "FedAvg", "LocalizedFedAvg", "PerFedAvg", "PFedMe", "Ditto", "PERM", "PERMHetero",
    "PartialFedAvg",
    "LocalUpdate", "MAML", "QuadraticLocalUpdate", "ServerOpt", "minibatch_sgd", "lookahead", "fedsgd",
    "fedavg_preset", "fedprox", "fomaml", "maml",
]
