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

Nothing a client sends is believed unchecked: every reply is checked against the job it answers
(``reply_problem``: its keys, each tensor's shape ``[models hosted, *param shape]`` and dtype, finite values;
an evaluation's scores in range and its sample count the client's test size) before it touches the aggregate.
A bad reply counts as no reply, with its reason: the client is dropped where ``RunSpec.min_clients`` lets the
run go on without it (it is sent nothing more, and ``rejected`` and the pass's ``participation`` row say why),
else the run stops with a :class:`RejectedReply` naming client, node, round, pass and key. The evaluations
get the in-process divergence rule (:mod:`pflkit.divergence`), and the models a pass sends must be finite.
"""
from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING

import torch

from ..algorithms.round import Outputs
from ..algorithms.round import Pass as AlgorithmPass
from ..data.federated import FederatedDataset
from ..divergence import DivergenceError, check_finite, check_loss_growth, describe_lr, reference_loss
from ..engine.params import Params, is_finite
from ..eval import HISTORY_COLUMNS, ClientMetrics
from .client import EVALUATE, EXTRA, MODEL, TRAIN, Job, Reply, prefixed, unprefixed
from .spec import RunSpec

if TYPE_CHECKING:  # pandas loads only where a table is built (a ClientApp process imports none)
    import pandas as pd

Pass = dict[int, Job]
Replies = dict[int, Reply]
Passes = Generator[Pass, Replies, object]


class FederationError(RuntimeError):
    """A federated run cannot go on: a node is missing, silent or failed (the message says which)."""


class RejectedReply(FederationError):
    """A client's reply does not answer its job (wrong keys, shapes, dtypes, non-finite or impossible values)
    and the run cannot go on without that client: the message names client, node, round, pass and key."""

#: what an evaluation reply holds: a [1] float64 tensor each (``FederatedClient.run``)
SCORES = ("accuracy", "loss", "n")


def reply_problem(reply: Reply, job: Job, test_size: int | None = None) -> tuple[str, str] | None:
    """Why ``reply`` does not answer ``job`` as (key, reason), or None when it does. A training reply holds
    exactly the job's ``model.<name>`` keys, each [models hosted, *param shape] in the job's dtype, all
    finite; an evaluation reply exactly ``SCORES``, each a finite float64 [1]: accuracy in [0, 1], loss >= 0,
    n the client's ``test_size`` (when given). A reply the transport could not read (``Reply.problem``) is
    refused as a whole (key ``(message)``)."""
    if reply.problem:
        return "(message)", reply.problem
    m = int(job.config["models"])
    if job.kind == EVALUATE:
        want = {k: ((1,), torch.float64) for k in SCORES}
    else:
        models = unprefixed(MODEL, job.arrays)
        tail = lambda t: tuple(t.shape[1:])  # noqa: E731  (a job's models are [m, ..] or, shared, [1, ..])
        want = {MODEL + k: ((m, *tail(t)), t.dtype) for k, t in models.items()}
    got = reply.arrays
    extra, missing = sorted(set(got) - set(want)), sorted(set(want) - set(got))
    if extra:
        return extra[0], f"a key the job does not ask for (it asks for {sorted(want)})"
    if missing:
        return missing[0], f"missing (the job asks for {sorted(want)})"
    for k, (shape, dtype) in want.items():
        t = got[k]
        if not isinstance(t, torch.Tensor):
            return k, f"not a tensor ({type(t).__name__})"
        if tuple(t.shape) != shape:
            return k, f"shape {tuple(t.shape)}, the job's is {shape} ([models hosted, *param shape])"
        if t.dtype != dtype:
            return k, f"dtype {t.dtype}, the job's is {dtype}"
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            return k, (f"{bad} non-finite value(s) of {t.numel()} (a poisoned reply, or the client's training "
                       "diverged: lower the learning rate)")
    if job.kind == EVALUATE:
        acc, loss, n = (float(got[k][0]) for k in SCORES)
        if not 0 <= acc <= 1:
            return "accuracy", f"{acc!r} is not in [0, 1]"
        if loss < 0:
            return "loss", f"{loss!r} is negative"
        if test_size is not None and n != test_size:
            return "n", f"{n:g} samples, the client's test split has {test_size}"
    return None


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
        self.nodes = {int(i["partition"]): i.get("node") for i in infos}  # client -> its Flower node (if any)
        self.rejected: dict[int, dict] = {}  # client -> its refused reply: pass, round, step, key, reason
        self.initial_loss: float | None = None  # the divergence rule's reference (``divergence.reference_loss``)

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
        their scores of the outputs). Every reply is checked against its job first (``reply_problem``): a bad
        one counts as none (``_account``)."""
        r = self.state.round + (kind == TRAIN)
        if not is_finite(p.models):
            raise DivergenceError(f"{self.spec.name} diverged before round {r}'s {p.step} pass (seed "
                                  f"{self.spec.seed}, {describe_lr(self.algorithm)}): the server's models are not "
                                  "finite; lower the learning rate")
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
        replies = {c: reply for c, reply in replies.items() if c in jobs}
        bad = {}
        for c in sorted(replies):
            problem = reply_problem(replies[c], jobs[c], int(self.data.test_sizes[c]))
            if problem is not None:
                bad[c] = problem
                del replies[c]
        self._account(p, kind, sorted(hosted), sorted(replies), bad)
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

    def _node(self, c: int) -> str:
        node = self.nodes.get(c)
        return f"client {c} (node {node})" if node is not None else f"client {c} (in this process: no node)"

    def _account(self, p: AlgorithmPass, kind: str, clients: list[int], answered: list[int],
                 bad: dict[int, tuple[str, str]] | None = None) -> None:
        """Record who answered the pass (and whose reply was refused, ``bad``: client -> (key, reason)); stop
        the run (FederationError; RejectedReply for a refused reply) when a client is missing and the run
        cannot go on without it: the method needs every client, no ``min_clients`` was set, or fewer than
        ``min_clients`` answered."""
        bad = bad or {}
        missing = [c for c in clients if c not in answered]
        r = self.state.round + (kind == TRAIN)
        row = {"pass": self.passes, "round": r, "step": p.step, "clients": clients, "answered": answered}
        if bad:
            row["rejected"] = {c: f"{key}: {why}" for c, (key, why) in bad.items()}
        self.participation.append(row)
        for c in missing:
            self.lost.setdefault(c, self.passes)
        for c, (key, why) in bad.items():
            self.rejected[c] = {"pass": self.passes, "round": r, "step": p.step, "node": self.nodes.get(c),
                                "key": key, "reason": why}
        self.passes += 1
        if not missing:
            return
        at = f"round {r}, {p.step} pass"
        new = [c for c in missing if self.lost[c] == self.passes - 1 and c not in bad]
        refused = "; ".join(f"{self._node(c)} sent a reply that does not answer its job (pass {self.passes - 1} "
                            f"of the run): key {key!r}: {why}"
                            for c, (key, why) in bad.items())
        what = "; ".join(filter(None, [
            refused, f"no reply from client(s) {new} within {self.spec.timeout:g} s" if new else "",
            "" if new or bad else f"client(s) {missing} stopped answering earlier"]))
        error = RejectedReply if bad else FederationError
        minimum = self.spec.min_clients
        if minimum is None or not (kind == EVALUATE or self.algorithm.tolerates_missing):
            need = "every client" if minimum is None else f"every client ({self.spec.method} cannot go on without one)"
            cause = "" if bad and not new else "; a SuperNode may have died or be overloaded"
            raise error(f"{at}: {what}{cause}. The run needs {need} (RunSpec.timeout sets the wait; "
                        "RunSpec.min_clients lets a round go on without a client, for methods that tolerate it)")
        if len(answered) < minimum:
            raise error(f"{at}: {what}: only {len(answered)} of the pass's {len(clients)} clients answered, "
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
        self._check_divergence(summary)
        self.rows.extend((self.round_number, self.spec.name, self.spec.seed, k, float(v)) for k, v in summary.items())
        return summary

    def _check_divergence(self, summary: dict[str, float]) -> None:
        """The in-process rule (:mod:`pflkit.divergence`, as ``runner.run`` applies it) at this evaluation:
        finite scores and server state, the loss within its limits of the round-0 loss (the last round's
        tighter one at ``spec.rounds``); raises DivergenceError."""
        spec, r, lr = self.spec, self.round_number, describe_lr(self.algorithm)
        state = {k: v for name in ("w", "v") if isinstance(getattr(self.state, name, None), dict)
                 for k, v in getattr(self.state, name).items()}
        alpha = getattr(self.state, "alpha", None)
        finite = is_finite(state) and (alpha is None or bool(torch.isfinite(alpha).all()))
        check_finite(spec.name, spec.seed, r, summary, finite, lr)
        loss = summary.get("loss")
        if r == 0:
            self.initial_loss = reference_loss(loss, self.data.num_classes)
        factor = spec.diverge_factor
        if factor is None or loss is None:
            return
        check_loss_growth(spec.name, spec.seed, r, loss, self.initial_loss, factor, lr, final=False)
        if r == spec.rounds:
            check_loss_growth(spec.name, spec.seed, r, loss, self.initial_loss, factor, lr, final=True)

    def history(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.rows, columns=HISTORY_COLUMNS)


def evaluation_due(spec: RunSpec, r: int) -> bool:
    """Rounds the personalized models are scored at: 0, every ``eval_every``, the last (as ``runner.run``)."""
    return r == 0 or r % spec.eval_every == 0 or r == spec.rounds
