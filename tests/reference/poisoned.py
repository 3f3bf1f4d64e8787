"""A client that poisons its replies, written as pflkit's own client code (a method named by its import path,
as tests/reference/methods.py's), so every engine runs it unchanged and nothing of Flower is patched.

``PoisonedFedAvg`` is FedAvg whose client step, on the federation's client ``client`` (its partition, which a
federated client's draws carry), turns its local models into one of ``POISONS`` in every round. The other
clients send FedAvg's models. In process (a batch of every client) only the value poisons make sense; the
structural ones are for the federated engines' server, which must refuse them.
"""
from __future__ import annotations

import torch

from pflkit.algorithms import FedAvg
from pflkit.engine import FunctionalModel
from pflkit.flower.spec import RunSpec
from pflkit.models import logistic

#: what the poisoned client sends instead of its local models (``scale``: finite, but far from the others)
POISONS = ("nan", "inf", "shape", "extra_key", "missing_key", "dtype", "scale")


class PoisonedFedAvg(FedAvg):
    name = "Poisoned FedAvg"
    client_steps = FedAvg.client_steps + ("poisoned_models",)
    client_step = "poisoned_models"

    def __init__(self, model, *, poison: str, client: int, scale: float = 1e4, **kwargs):
        if poison not in POISONS:
            raise ValueError(f"poison must be one of {POISONS}, got {poison!r}")
        super().__init__(model, **kwargs)
        self.poison, self.client, self.scale = poison, int(client), float(scale)

    def poisoned_models(self, w, data, clients, draws, extra):
        out = self.local_models(w, data, clients, draws, extra)
        ids = [draws.ids[int(c)] if draws.ids is not None else int(c) for c in clients.tolist()]
        rows = torch.tensor([i for i, c in enumerate(ids) if c == self.client], dtype=torch.long)
        if not len(rows):
            return out
        first = sorted(out)[0]
        if self.poison in ("nan", "inf"):
            out[first][rows] = float(self.poison)
        elif self.poison == "scale":
            out = {k: v.index_copy(0, rows, v[rows] * self.scale) for k, v in out.items()}
        elif self.poison == "shape":
            out[first] = out[first][..., :-1]
        elif self.poison == "extra_key":
            out["backdoor"] = torch.zeros(len(clients), 3)
        elif self.poison == "missing_key":
            del out[first]
        elif self.poison == "dtype":
            out[first] = out[first].double()
        return out


#: the table every engine's poisoned-client test runs: poison -> (the key the server names, its reason), for a
#: logistic model (parameters ``1.weight``, ``1.bias``: the poison hits ``1.bias``, the first by name)
REFUSED = {
    "nan": ("model.1.bias", r"2 non-finite value\(s\) of 2"),
    "inf": ("model.1.bias", r"2 non-finite value\(s\) of 2"),
    "shape": ("model.1.bias", r"shape \(1, 1\), the job's is \(1, 2\) \(\[models hosted, \*param shape\]\)"),
    "extra_key": ("model.backdoor", r"a key the job does not ask for \(it asks for \['model.1.bias', "
                                    r"'model.1.weight'\]\)"),
    "missing_key": ("model.1.bias", r"missing \(the job asks for"),
    "dtype": ("model.1.bias", r"dtype torch.float64, the job's is torch.float32"),
}


def poisoned(model, poison: str, client: int = 1, **kwargs) -> PoisonedFedAvg:
    """The tests' poisoned FedAvg (every client a round, 3 local steps): client ``client`` sends ``poison``."""
    return PoisonedFedAvg(model, poison=poison, client=client, local_steps=3, lr=0.3, batch_size=4, **kwargs)


#: the federation, seed and rounds every engine's poisoned-client test runs (3 clients: 3 SuperNodes)
DATA = dict(num_clients=3, samples_per_client=40, dim=5, test_fraction=0.25, seed=1)
ROUNDS, SEED = 4, 3


def model() -> FunctionalModel:
    return FunctionalModel(lambda: logistic((DATA["dim"],), 2))


def spec(alg, **run) -> RunSpec:
    """``alg``'s run on ``DATA``: ``ROUNDS`` rounds, evaluated every 2."""
    return RunSpec.for_algorithm(alg, model={"name": "logistic"}, data={"name": "perm_synthetic", "kwargs": DATA},
                                 seed=SEED, rounds=ROUNDS, eval_every=2, **run)


def refusal(poison: str, node: str) -> str:
    """The error (a regular expression) a run that needs every client stops with when client 1 sends ``poison``:
    client 1, its node (``node``: a pattern), round 1's training pass (pass 1 of the run: pass 0 is the
    evaluation at round 0), the key and why."""
    key, why = REFUSED[poison]
    return (rf"round 1, poisoned_models pass: client 1 \({node}\) sent a reply that does not answer its job "
            rf"\(pass 1 of the run\): key '{key}': {why}")
