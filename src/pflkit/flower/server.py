"""The server side of a federated run: the algorithm's state, and its own round cut into passes.

One server runs every method: it asks the algorithm for its passes (``round_passes``, ``start_passes``,
``personalize_pass``: ``algorithms.round``), sends every client the models it hosts, their per-model
values and the pass's key (each client draws its own minibatch rows and dropout masks from its stream of
that key, as inside the batch: ``data.draws``), and hands the stacked replies back to the algorithm, which
aggregates and steps with its own functions. So a federated run is the in-process round, pass for pass.

A server's ``round()`` (and ``start()``, ``evaluate()``) is a generator: it yields one pass at a time,
``{client: Job}``, and receives the replies ``{client: Reply}``, so any transport can drive it
(``algorithms.round.drive``: the loopback in one process, or Flower's Grid in ``apps``).

The server never sees a sample: its dataset is ``sizes_only`` (the clients' sizes, reported at
registration), which is all ``sample_clients`` and the alpha solver read.
"""
from __future__ import annotations

from collections.abc import Generator

import pandas as pd
import torch

from ..algorithms.round import Outputs
from ..algorithms.round import Pass as AlgorithmPass
from ..data.federated import FederatedDataset
from ..engine.params import Params
from ..eval import HISTORY_COLUMNS, ClientMetrics
from .client import EVALUATE, EXTRA, MODEL, TRAIN, Job, Reply, prefixed, unprefixed
from .spec import RunSpec

Pass = dict[int, Job]
Replies = dict[int, Reply]
Passes = Generator[Pass, Replies, object]


class FederationError(RuntimeError):
    """A federated run cannot go on: a node is missing, silent or failed (the message says which)."""


def sizes_only(infos: list[dict], batch_order: str = "replacement") -> FederatedDataset:
    """The server's view of the federation from the clients' registration infos (one per partition
    0..N-1): sizes, offsets and shapes, and no sample (zero-width feature tensors)."""
    infos = sorted(infos, key=lambda i: i["partition"])
    n = infos[0]["num_clients"]
    if [i["partition"] for i in infos] != list(range(n)) or any(i["num_clients"] != n for i in infos):
        raise ValueError(f"need exactly one client per partition 0..{n - 1}, got partitions "
                         f"{sorted(i['partition'] for i in infos)} "
                         f"(num-partitions {sorted({i['num_clients'] for i in infos})})")
    train = torch.tensor([i["train_size"] for i in infos], dtype=torch.long)
    test = torch.tensor([i["test_size"] for i in infos], dtype=torch.long)
    empty = lambda m: (torch.zeros(int(m.sum()), 0), torch.zeros(int(m.sum()), dtype=torch.long))  # noqa: E731
    (xtr, ytr), (xte, yte) = empty(train), empty(test)
    return FederatedDataset(xtr, ytr, torch.cumsum(train, 0) - train, train, xte, yte, torch.cumsum(test, 0) - test,
                            test, int(infos[0]["num_classes"]), infos[0]["name"], batch_order=batch_order)


class FederatedServer:
    """One run's server: the spec, the algorithm built from it, the sizes-only data, the algorithm's
    state, the history rows of its evaluations."""

    def __init__(self, spec: RunSpec, infos: list[dict]):
        self.spec = spec
        self.data = sizes_only(infos, spec.batch_order)
        first = min(infos, key=lambda i: i["partition"])
        self.model = spec.functional_model(tuple(first["feature_shape"]), first["num_classes"])
        self.algorithm = spec.algorithm(self.model)
        self.state = self.algorithm.initial_state(self.data, spec.seed)
        self.rows: list[tuple] = []
        self.passes = 0  # passes sent so far (the number of the next one)
        self.lost: dict[int, int] = {}  # client -> the pass it first did not answer (it is sent nothing after)
        self.participation: list[dict] = []  # per pass: its round, step, the clients it was for, who answered

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    @property
    def round_number(self) -> int:
        return self.state.round

    def global_model(self) -> Params:
        return self.state.w

    # -- a pass of the algorithm as one job per client
    def exchange(self, p: AlgorithmPass, kind: str) -> Passes:
        """Send pass ``p`` (each client the models it hosts, their per-model values and the pass's key);
        returns the outputs stacked [M, ..] in the pass's order (``kind`` EVALUATE: the clients' replies,
        their scores of the outputs)."""
        hosted: dict[int, list[int]] = {}
        for i, c in enumerate(p.clients.tolist()):
            hosted.setdefault(c, []).append(i)
        config = {"kind": kind, "step": p.step, "shared": p.shared, "draws": p.draws.key, "round": self.state.round,
                  "seed": self.spec.seed}
        jobs = {}
        for c, idx in sorted(hosted.items()):
            if c in self.lost:  # a client that stopped answering is sent nothing more
                continue
            at = torch.tensor(idx)
            models = {k: v.unsqueeze(0) for k, v in p.models.items()} if p.shared else \
                {k: v.index_select(0, at.to(v.device)) for k, v in p.models.items()}
            extra = {k: v.index_select(0, at.to(v.device)) for k, v in p.extra.items()}
            jobs[c] = Job({**prefixed(MODEL, models), **prefixed(EXTRA, extra)}, {**config, "models": len(idx)})
        replies = yield jobs
        replies = {c: r for c, r in replies.items() if c in jobs}
        self._account(p, kind, sorted(hosted), sorted(replies))
        if kind == EVALUATE:
            return replies
        answered = sorted(i for c in replies for i in hosted[c])
        row = {i: j for j, i in enumerate(answered)}
        out: Params = {}
        for c in replies:
            at = torch.tensor([row[i] for i in hosted[c]])
            for k, t in unprefixed(MODEL, replies[c].arrays).items():
                if k not in out:
                    out[k] = torch.empty((len(answered), *t.shape[1:]), dtype=t.dtype)
                out[k][at] = t
        return out if len(answered) == len(p.clients) else Outputs(out, torch.tensor(answered))

    def _account(self, p: AlgorithmPass, kind: str, clients: list[int], answered: list[int]) -> None:
        """Record who answered the pass; stop the run (FederationError) when a client is missing and the run
        cannot go on without it: the method needs every client, no ``min_clients`` was set, or fewer than
        ``min_clients`` answered."""
        missing = [c for c in clients if c not in answered]
        r = self.state.round + (kind == TRAIN)
        self.participation.append({"pass": self.passes, "round": r, "step": p.step, "clients": clients,
                                   "answered": answered})
        for c in missing:
            self.lost.setdefault(c, self.passes)
        self.passes += 1
        if not missing:
            return
        new = [c for c in missing if self.lost[c] == self.passes - 1]
        what = (f"round {r}, {p.step} pass: no reply from client(s) {new} within {self.spec.timeout:g} s"
                if new else f"round {r}, {p.step} pass: client(s) {missing} stopped answering earlier")
        minimum = self.spec.min_clients
        if minimum is None or not (kind == EVALUATE or self.algorithm.tolerates_missing):
            need = "every client" if minimum is None else f"every client ({self.spec.method} cannot go on without one)"
            raise FederationError(f"{what}; a SuperNode may have died or be overloaded. The run needs {need} "
                                  "(RunSpec.timeout sets the wait; RunSpec.min_clients lets a round go on without a "
                                  "client, for methods that tolerate it)")
        if len(answered) < minimum:
            raise FederationError(f"{what}: only {len(answered)} of the pass's {len(clients)} clients answered, "
                                  f"fewer than min_clients={minimum}")

    def run_passes(self, passes) -> Passes:
        """Drive the algorithm's generator of passes over the clients; returns its value."""
        try:
            p = next(passes)
            while True:
                p = passes.send((yield from self.exchange(p, TRAIN)))
        except StopIteration as stop:
            return stop.value

    # -- the protocol
    def start(self) -> Passes:
        """Passes before round 1 (e.g. PERM's first alpha estimate)."""
        self.state = yield from self.run_passes(self.algorithm.start_passes(self.state))

    def round(self) -> Passes:
        self.state = yield from self.run_passes(self.algorithm.round_passes(self.state))

    def evaluate(self) -> Passes:
        """Every client makes (or receives) its personalized model and scores it on its test split."""
        replies = yield from self.exchange(self.algorithm.personalize_pass(self.state), EVALUATE)
        return self.record(replies)

    def record(self, replies: Replies) -> dict[str, float]:
        """The personalized scores of the clients (as ``eval.evaluate`` gives them in-process), their
        summary, appended to the history at the current round."""
        order = sorted(replies)  # every client, or those still answering (``min_clients``)
        metrics = ClientMetrics(*(torch.cat([replies[c].arrays[k] for c in order]).cpu() for k in ("accuracy", "loss")),
                                n=torch.cat([replies[c].arrays["n"] for c in order]).long().cpu())
        summary = metrics.summary()
        self.rows.extend((self.round_number, self.spec.name, self.spec.seed, k, float(v)) for k, v in summary.items())
        return summary

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=HISTORY_COLUMNS)


def evaluation_due(spec: RunSpec, r: int) -> bool:
    """Rounds the personalized models are scored at: 0, every ``eval_every``, the last (as ``runner.run``)."""
    return r == 0 or r % spec.eval_every == 0 or r == spec.rounds
