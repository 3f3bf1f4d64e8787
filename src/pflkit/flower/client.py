"""The client side of a federated run: one partition, the algorithm's own client code for one client.

A ``Job`` is what the server sends one client in one pass (tensors + plain config), a ``Reply`` what the
client sends back. ``FederatedClient.run`` executes a job with the same functions the batched engine
calls for all clients at once, on a one-client dataset (``one_client``) that replays the minibatch rows
the server drew (``ReplayedDraws``). Nothing here imports flwr.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from torch import Tensor

from ..data.federated import FederatedDataset
from ..engine.params import Params
from ..eval import evaluate
from .spec import RunSpec

# job kinds: a training pass (its outputs go back to the server) or an evaluation (the client scores them)
TRAIN, EVALUATE = "train", "evaluate"
KINDS = (TRAIN, EVALUATE)
MODEL, EXTRA, DRAW = "model.", "extra.", "draw."


@dataclass
class Job:
    """One pass's work for one client: ``arrays`` (``model.<name>`` the models it starts from, stacked
    [m, ..] or one shared model [1, ..]; ``extra.<name>`` per-model values [m, ..]; ``draw.<i>`` the rows of
    the i-th ``sample_indices`` call) and ``config`` (plain values: ``kind``, ``step`` (the algorithm's
    client step), ``shared``, ``models`` (m), ``round``, ``seed``)."""

    arrays: dict[str, Tensor]
    config: dict

    @property
    def kind(self) -> str:
        return self.config["kind"]


@dataclass
class Reply:
    """A client's answer: ``model.<name>`` [m, ..] (the step's outputs) or ``accuracy``/``loss``/``n`` [1],
    and ``metrics`` (plain numbers: the client's compute seconds)."""

    arrays: dict[str, Tensor]
    metrics: dict = field(default_factory=dict)


def prefixed(prefix: str, params: Params) -> dict[str, Tensor]:
    return {prefix + k: v.contiguous() for k, v in params.items()}


def unprefixed(prefix: str, arrays: dict[str, Tensor]) -> Params:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


def draw_arrays(draws: list[Tensor]) -> dict[str, Tensor]:
    return {f"{DRAW}{i}": d for i, d in enumerate(draws)}


# --------------------------------------------------------------------------- one client's data
@dataclass
class ReplayedDraws(FederatedDataset):
    """A one-client dataset whose ``sample_indices`` returns, call after call, the rows the server drew
    (client-local row numbers, in the order the client code asks for them), after checking each has the
    shape the call asks for: the same minibatches as the batched engine, without this client's
    generator."""

    draws: list = field(default_factory=list)

    def sample_indices(self, clients: Tensor, batch_size: int, generator: torch.Generator) -> Tensor:
        clients = torch.as_tensor(clients, dtype=torch.long).cpu()
        want = (*clients.shape, batch_size)
        if not self.draws:
            raise RuntimeError(f"the client update asked for minibatch rows {want} the server did not send "
                               "(its draws and the client code are out of step)")
        rows = self.draws.pop(0).long()
        if tuple(rows.shape) != want:
            raise RuntimeError(f"the server sent rows of shape {tuple(rows.shape)}, the client update asks for {want}")
        return (self.train_offsets[clients].unsqueeze(-1) + rows).to(self.device)


def one_client(data: FederatedDataset, j: int) -> FederatedDataset:
    """Client j of ``data`` as a federation of one (its train and test rows only)."""
    if not 0 <= j < data.num_clients:
        raise ValueError(f"partition-id must be in [0, {data.num_clients}) for this federation, got {j!r}")
    return FederatedDataset.from_client_arrays([data.client(j, "train")], [data.client(j, "test")], data.num_classes,
                                               data.name, data.paper_dataset).with_batch_order(data.batch_order)


def write_partitions(whole: FederatedDataset, key: str, folder: Path) -> list[Path]:
    """One file per client of ``whole`` in ``folder`` (``partition-<j>.pt``: its train and test rows, what it
    needs to know of the federation, and ``key``, the federation's identity): the data a SuperNode holds."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for j in range(whole.num_clients):
        own = one_client(whole, j)  # its rows copied (a view would save the whole federation's storage)
        record = {"key": key, "partition": j, "num_clients": whole.num_clients, "train": (own.x_train, own.y_train),
                  "test": (own.x_test, own.y_test), "num_classes": own.num_classes, "name": own.name,
                  "paper_dataset": own.paper_dataset, "batch_order": own.batch_order}
        paths.append(folder / f"partition-{j}.pt")
        torch.save(record, paths[-1])
    return paths


def read_partition(path: str | Path, key: str, partition: int) -> tuple[FederatedDataset, int]:
    """The one-client dataset in ``path`` (``write_partitions``) and the federation's number of clients, after
    checking that the file holds ``partition`` of the federation ``key`` names."""
    record = torch.load(path, weights_only=True)
    if record["key"] != key or record["partition"] != partition:
        raise ValueError(f"{path} holds partition {record['partition']} of another federation than this run's "
                         f"partition {partition} ({record['key']} vs {key})")
    data = FederatedDataset.from_client_arrays([tuple(record["train"])], [tuple(record["test"])],
                                               record["num_classes"], record["name"], record["paper_dataset"])
    return data.with_batch_order(record["batch_order"]), int(record["num_clients"])


def replaying(data: FederatedDataset, draws: list[Tensor]) -> ReplayedDraws:
    """``data`` (one client) replaying ``draws``; it shares the data's tensors and caches."""
    return ReplayedDraws(**{f.name: getattr(data, f.name) for f in fields(FederatedDataset)}, draws=list(draws))


# --------------------------------------------------------------------------- the client
class FederatedClient:
    """Partition ``partition`` of the spec's federation, and the spec's algorithm built for it."""

    def __init__(self, spec: RunSpec, partition: int, federation: FederatedDataset | None = None,
                 own: tuple[FederatedDataset, int] | None = None):
        """``own``: the partition as a one-client dataset and the federation's number of clients (what
        ``read_partition`` returns); else it is taken from ``federation`` (default: the spec's, rebuilt)."""
        self.spec, self.partition = spec, int(partition)
        if own is None:
            whole = spec.federation() if federation is None else federation
            own = one_client(whole, self.partition), whole.num_clients
        self.data, self.num_clients = own
        self.model = spec.functional_model(self.data.feature_shape, self.data.num_classes)
        self.algorithm = spec.algorithm(self.model)

    def info(self) -> dict:
        """What the server learns at registration: the partition, its sizes and the data's shape (no sample)."""
        return {"partition": self.partition, "num_clients": self.num_clients,
                "train_size": int(self.data.train_sizes[0]), "test_size": int(self.data.test_sizes[0]),
                "num_classes": self.data.num_classes, "feature_shape": list(self.data.feature_shape),
                "name": self.data.name}

    def run(self, job: Job) -> Reply:
        """Run the job's client step (a method the algorithm lists in ``client_steps``) on this client."""
        start = time.perf_counter()
        alg, kind, step = self.algorithm, job.kind, job.config.get("step")
        if kind not in KINDS or step not in alg.client_steps:
            raise ValueError(f"job kind must be one of {KINDS} and step one of {type(alg).__name__}'s client steps "
                             f"{alg.client_steps}, got kind {kind!r}, step {step!r}")
        draws = [job.arrays[k] for k in sorted((k for k in job.arrays if k.startswith(DRAW)),
                                               key=lambda k: int(k[len(DRAW):]))]
        data = replaying(self.data, draws)
        models = unprefixed(MODEL, job.arrays)
        if job.config["shared"]:
            models = _single(models)
        hosted = torch.zeros(int(job.config["models"]), dtype=torch.long)
        # every draw is replayed: the generator is never read
        out = getattr(alg, step)(models, data, hosted, torch.Generator(), unprefixed(EXTRA, job.arrays))
        if data.draws:
            raise RuntimeError(f"{len(data.draws)} of the rows the server sent were not used by the {step} step "
                               "(its draws and the client code are out of step)")
        if kind == EVALUATE:
            scores = evaluate(alg.model, out, data)
            arrays = {"accuracy": scores.accuracy, "loss": scores.loss, "n": scores.n.double()}
        else:
            arrays = prefixed(MODEL, out)
        return Reply(arrays, {"seconds": time.perf_counter() - start})


def _single(models: Params) -> Params:
    """The one model of a stack [1, ..] (a shared model: every hosted model starts from it)."""
    n = next(iter(models.values())).shape[0]
    if n != 1:
        raise ValueError(f"this job carries one model, got a stack of {n}")
    return {k: v[0] for k, v in models.items()}
