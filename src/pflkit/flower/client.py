"""The client side of a federated run: one partition, the algorithm's own client code for one client.

A ``Job`` is what the server sends one client in one pass (tensors + plain config), a ``Reply`` what the
client sends back. ``FederatedClient.run`` executes a job with the same functions the batched engine
calls for all clients at once, on a one-client dataset (``one_client``), drawing its minibatch rows and
dropout masks from its own stream of the pass (``data.draws.ClientDraws``: the pass's key and its partition),
exactly as it draws them inside the batch. Nothing here imports flwr.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..data.draws import ClientDraws
from ..data.federated import FederatedDataset
from ..engine.params import Params
from ..eval import evaluate
from .spec import RunSpec

# job kinds: a training pass (its outputs go back to the server) or an evaluation (the client scores them)
TRAIN, EVALUATE = "train", "evaluate"
KINDS = (TRAIN, EVALUATE)
MODEL, EXTRA = "model.", "extra."


@dataclass
class Job:
    """One pass's work for one client: ``arrays`` (``model.<name>`` the models it starts from, stacked
    [m, ..] or one shared model [1, ..]; ``extra.<name>`` per-model values [m, ..]) and ``config`` (plain
    values: ``kind``, ``step`` (the algorithm's client step), ``shared``, ``models`` (m), ``draws`` (the
    pass's key: ``ClientDraws``), ``round``, ``seed``)."""

    arrays: dict[str, Tensor]
    config: dict

    @property
    def kind(self) -> str:
        return self.config["kind"]


@dataclass
class Reply:
    """A client's answer: ``model.<name>`` [m, ..] (the step's outputs) or ``accuracy``/``loss``/``n`` [1],
    and ``metrics`` (plain numbers: the client's compute seconds). ``problem``: why the transport could not
    read the message it came in (the server refuses such a reply; ``server.reply_problem``)."""

    arrays: dict[str, Tensor]
    metrics: dict = field(default_factory=dict)
    problem: str | None = None


def prefixed(prefix: str, params: Params) -> dict[str, Tensor]:
    return {prefix + k: v.contiguous() for k, v in params.items()}


def unprefixed(prefix: str, arrays: dict[str, Tensor]) -> Params:
    return {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}


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
        models = unprefixed(MODEL, job.arrays)
        if job.config["shared"]:
            models = _single(models)
        hosted = torch.zeros(int(job.config["models"]), dtype=torch.long)
        draws = ClientDraws(int(job.config["draws"])).for_client(self.partition)
        out = getattr(alg, step)(models, self.data, hosted, draws, unprefixed(EXTRA, job.arrays))
        if kind == EVALUATE:
            scores = evaluate(alg.model, out, self.data)
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
