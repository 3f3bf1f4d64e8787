"""The server side of a federated run: the algorithm's state, its draws, and its round cut into passes.

A server's ``round()`` (and ``start()``, ``evaluate()``) is a generator: it yields one pass at a time,
``{client: Job}``, and receives the replies ``{client: Reply}``, so any transport can drive it
(``drive``: the loopback in one process, or Flower's Grid in ``apps``). The round is the algorithm's
own, in the same order of random draws as its in-process ``round`` (see each method's module docstring
"Randomness per round"); the math is the algorithm's (``client_work`` on the clients;
``server_update``, ``round.aggregate``, ``PERM.global_update``, ``PERM.alpha_from_gradients`` here).

The server never sees a sample: its dataset is ``sizes_only`` (the clients' sizes, reported at
registration), which is all ``sample_indices``, ``sample_clients`` and the alpha solver read.
"""
from __future__ import annotations

from collections.abc import Callable, Generator

import pandas as pd
import torch
from torch import Tensor

from ..algorithms.base import eval_generator
from ..algorithms.fedavg import FedAvgState
from ..algorithms.perm import PERMState, alpha_visit_clients, shuffle_clients, shuffle_step_sizes
from ..algorithms.round import aggregate
from ..data.federated import FederatedDataset
from ..engine.local_sgd import expand_schedule
from ..engine.params import Params, flatten
from ..eval import HISTORY_COLUMNS, ClientMetrics
from .client import EVALUATE, GRAD, GRADIENTS, MODEL, TRAIN, Job, Reply, draw_arrays, prefixed, unprefixed
from .spec import RunSpec

Pass = dict[int, Job]
Replies = dict[int, Reply]
Passes = Generator[Pass, Replies, object]


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


def _rows_dtype(size: int) -> torch.dtype:
    """The smallest integer type holding row numbers below ``size`` (the draws travel in it)."""
    return torch.int16 if size <= 2**15 else torch.int32 if size <= 2**31 else torch.int64


class FederatedServer:
    """What every method's server shares: the spec, the algorithm built from it, the sizes-only data,
    the history rows of its evaluations."""

    def __init__(self, spec: RunSpec, infos: list[dict]):
        self.spec = spec
        self.data = sizes_only(infos, spec.batch_order)
        first = min(infos, key=lambda i: i["partition"])
        self.model = spec.functional_model(tuple(first["feature_shape"]), first["num_classes"])
        self.algorithm = spec.algorithm(self.model)
        self.rows: list[tuple] = []

    @property
    def num_clients(self) -> int:
        return self.data.num_clients

    # -- the draws: made here with the state's generator, each client sent its slice
    def draw(self, schedule: Tensor, batch_size: int | None, generator: torch.Generator) -> Tensor | None:
        """``sample_indices(schedule)`` as the batched engine calls it (rows into the whole federation);
        None without minibatches (batch_size None: exact local gradients, no draw)."""
        return None if batch_size is None else self.data.sample_indices(schedule, batch_size, generator)

    def slice_for(self, rows: Tensor | None, columns: list[int], client: int) -> list[Tensor]:
        """The rows of ``columns`` (the client axis, second to last) as client-local row numbers."""
        if rows is None:
            return []
        local = rows.index_select(-2, torch.tensor(columns)) - self.data.train_offsets[client]
        return [local.to(_rows_dtype(int(self.data.train_sizes[client])))]

    # -- the protocol every server follows
    def start(self) -> Passes:
        """Passes before round 1 (none by default)."""
        return
        yield

    def round(self) -> Passes:
        raise NotImplementedError

    def evaluate(self) -> Passes:
        raise NotImplementedError

    @property
    def round_number(self) -> int:
        return self.state.round

    def global_model(self) -> Params:
        return self.state.w

    def record(self, replies: Replies) -> dict[str, float]:
        """The personalized scores of every client (as ``eval.evaluate`` gives them in-process), their
        summary, appended to the history at the current round."""
        order = sorted(replies)
        if order != list(range(self.num_clients)):
            raise RuntimeError(f"evaluation needs every client's scores, got clients {order}")
        metrics = ClientMetrics(*(torch.cat([replies[c].arrays[k] for c in order]).cpu() for k in ("accuracy", "loss")),
                                n=torch.cat([replies[c].arrays["n"] for c in order]).long().cpu())
        summary = metrics.summary()
        self.rows.extend((self.round_number, self.spec.name, self.spec.seed, k, float(v)) for k, v in summary.items())
        return summary

    def history(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=HISTORY_COLUMNS)


def _stack(replies: Replies, clients: list[int], prefix: str) -> Params:
    parts = [unprefixed(prefix, replies[c].arrays) for c in clients]
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


def _one(params: Params) -> dict[str, Tensor]:
    return prefixed(MODEL, {k: v.unsqueeze(0) for k, v in params.items()})


class FedAvgServer(FederatedServer):
    """FedAvg, localized FedAvg, Per-FedAvg and pFedMe: ``FedAvg.round`` = participants -> client_work ->
    server_update, with client_work on the participants."""

    def __init__(self, spec: RunSpec, infos: list[dict]):
        super().__init__(spec, infos)
        self.state: FedAvgState = self.algorithm.init(self.data, spec.seed)

    def round(self) -> Passes:
        s, alg = self.state, self.algorithm
        clients = alg.participants(s)
        rows = self.draw(alg.batch_schedule(clients), alg.batch_size, s.generator)
        config = {"kind": TRAIN, "phase": "client_work", "round": s.round + 1, "seed": s.seed}
        order = clients.tolist()
        replies = yield {c: Job({**_one(s.w), **draw_arrays(self.slice_for(rows, [m], c))}, config)
                         for m, c in enumerate(order)}
        local = _stack(replies, order, MODEL)
        self.state = FedAvgState(s.data, s.generator, s.seed, s.round + 1, alg.server_update(s, clients, local))

    def evaluate(self) -> Passes:
        s, alg, n = self.state, self.algorithm, self.num_clients
        schedule = alg.personal_schedule(n)
        rows = None if schedule is None else self.draw(schedule, alg.batch_size, eval_generator(s))
        config = {"kind": EVALUATE, "phase": "personalize", "round": s.round, "seed": s.seed}
        replies = yield {c: Job({**_one(s.w), **draw_arrays(self.slice_for(rows, [c], c))}, config) for c in range(n)}
        return self.record(replies)


class PERMServer(FederatedServer):
    """PERM (``algorithms.perm.PERM.round``): FedAvg warm-up rounds, then every round each personalized
    model visits one client (Alg. 1's shuffle, or ``visit='alpha'``), and every ``update_every`` rounds
    the global step(s) and the alpha update from the clients' gradients at w. The N personalized models,
    alpha and the epoch's permutation live here; a client receives the model(s) visiting it."""

    def __init__(self, spec: RunSpec, infos: list[dict]):
        super().__init__(spec, infos)
        self.state: PERMState = self.algorithm.initial_state(self.data, spec.seed)

    def start(self) -> Passes:
        if self.algorithm.warmup_rounds == 0:
            yield from self._start_personalization(self.state)

    def _start_personalization(self, s: PERMState) -> Passes:
        alpha = None
        if self.algorithm.alpha_init == "estimate":
            grads = yield from self._gradients(s)
            alpha = self.algorithm.alpha_from_gradients(s, flatten(grads), None)
        self.algorithm.start_personalization(s, alpha)

    def _gradients(self, s: PERMState) -> Passes:
        """grad f_j(w) of every client j (``perm.local_gradients``), stacked [N, ..]."""
        n, alg = self.num_clients, self.algorithm
        rows = None if alg.alpha_samples is None else self.draw(torch.arange(n), alg.alpha_samples, s.generator)
        config = {"kind": GRADIENTS, "phase": "gradients", "round": s.round, "seed": s.seed}
        replies = yield {c: Job({**_one(s.w), **draw_arrays(self.slice_for(rows, [c], c))}, config) for c in range(n)}
        return _stack(replies, list(range(n)), GRAD)

    def round(self) -> Passes:
        alg, n = self.algorithm, self.num_clients
        s = PERMState(**{**self.state.__dict__, "round": self.state.round + 1})
        if s.v is None:  # FedAvg warm-up round
            clients = torch.arange(n)
            rows = self.draw(expand_schedule(clients, alg.local_steps), alg.batch_size, s.generator)
            config = {"kind": TRAIN, "phase": "warmup", "round": s.round, "seed": s.seed}
            replies = yield {c: Job({**_one(s.w), **draw_arrays(self.slice_for(rows, [c], c))}, config)
                             for c in range(n)}
            s.w = aggregate(_stack(replies, list(range(n)), MODEL))
            if s.round >= alg.warmup_rounds:
                yield from self._start_personalization(s)
            self.state = s
            return
        if alg.visit == "alpha":
            clients = alpha_visit_clients(s.alpha, s.generator)
            lrs = torch.full((n,), alg.lr, dtype=torch.float32)
        else:
            step = s.shuffle_round % n
            if step == 0:
                s.sigma = torch.randperm(n, generator=s.generator)
            clients = shuffle_clients(s.sigma, step)
            lrs = shuffle_step_sizes(s.alpha, clients, alg.lr)
        rows = self.draw(expand_schedule(clients, alg.local_steps), alg.batch_size, s.generator)
        hosted: dict[int, list[int]] = {}
        for i, c in enumerate(clients.tolist()):
            hosted.setdefault(c, []).append(i)
        config = {"kind": TRAIN, "phase": "shuffle", "round": s.round, "seed": s.seed}
        replies = yield {c: Job({**prefixed(MODEL, {k: v[models] for k, v in s.v.items()}), "lr": lrs[models],
                                 **draw_arrays(self.slice_for(rows, models, c))}, config)
                         for c, models in sorted(hosted.items())}
        v = {k: t.clone() for k, t in s.v.items()}
        for c, models in hosted.items():
            for k, t in unprefixed(MODEL, replies[c].arrays).items():
                v[k][models] = t
        s.v = v
        s.shuffle_round += 1
        if alg.update_due(s):
            for _ in range(alg.global_steps):
                grads = yield from self._gradients(s)
                s.w = alg.global_update(s.w, grads)
            grads = yield from self._gradients(s)
            s.alpha = alg.alpha_from_gradients(s, flatten(grads), s.alpha)
        self.state = s

    def evaluate(self) -> Passes:
        s, n = self.state, self.num_clients
        personal = self.algorithm.personalized(s)
        config = {"kind": EVALUATE, "phase": "given", "round": s.round, "seed": s.seed}
        replies = yield {c: Job(prefixed(MODEL, {k: v[c:c + 1] for k, v in personal.items()}), config)
                         for c in range(n)}
        return self.record(replies)


SERVERS = {"FedAvg": FedAvgServer, "LocalizedFedAvg": FedAvgServer, "PerFedAvg": FedAvgServer,
           "PFedMe": FedAvgServer, "PERM": PERMServer}


def make_server(spec: RunSpec, infos: list[dict]) -> FederatedServer:
    return SERVERS[spec.method](spec, infos)


def drive(passes: Passes, exchange: Callable[[Pass], Replies]):
    """Run a generator of passes to its end, ``exchange`` carrying each pass to the clients and back;
    returns the generator's value."""
    try:
        jobs = next(passes)
        while True:
            jobs = passes.send(exchange(jobs))
    except StopIteration as stop:
        return stop.value


def evaluation_due(spec: RunSpec, r: int) -> bool:
    """Rounds the personalized models are scored at: 0, every ``eval_every``, the last (as ``runner.run``)."""
    return r == 0 or r % spec.eval_every == 0 or r == spec.rounds
