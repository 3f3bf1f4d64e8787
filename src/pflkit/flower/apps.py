"""The Flower apps: a ClientApp that runs ``FederatedClient`` jobs, a ServerApp that registers every node
and runs the method's server (``server``) through ``PflkitStrategy``, a Flower Strategy whose
``configure_train`` addresses each node with its own message (PERM: the personalized model visiting it).

Message types: ``query.info`` (registration: partition and sizes), ``train`` (a training pass: the
client step the pass names) and ``evaluate`` (personalized scores). A pass waits at most
``RunSpec.timeout`` seconds; a node that answers with an error stops the run with a ``FederationError``
naming the client, its node, the round and the pass; a node that does not answer stops it too (naming
client, round and pass), unless ``RunSpec.min_clients`` lets the round go on without it (the server
decides: ``server.FederatedServer``). So the server never hangs.

A run holds one or more RunSpecs on the same federation (``spec.specs_to_json``), run one after the
other over the same registered nodes; every message names its spec (config ``run``). The specs come
from the run config (``spec.RUN_CONFIG``: one method's keys, or ``specs``; ``results``: a file for the results,
written by the ServerApp): ``flower_server_app`` / ``flower_client_app`` are the components of pflkit's Flower
App (pyproject.toml ``[tool.flwr.app]``, run with ``flwr run``), or ``client_app`` / ``server_app`` bind them for
the simulation engine. Messages carry their tensors in an ``ArrayRecord`` and their values in a ConfigRecord
(a job) or MetricRecord (a reply), and only Flower's public API is used.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from ..algorithms.round import drive
from ..io import write_text
from .client import EVALUATE, MODEL, TRAIN, FederatedClient, Job, Reply, read_partition
from .server import FederatedServer, FederationError, Pass, Replies, evaluation_due
from .spec import RunSpec, specs_from_json, specs_from_run_config, specs_to_json

MESSAGE_TYPES = {TRAIN: "train", EVALUATE: "evaluate"}
INFO = "query.info"
#: seconds between looks at the registered nodes while waiting for all of them
REGISTRATION_POLL = 0.2
#: seconds between pulls while a pass waits for its replies (``PollingGrid``)
POLL_SECONDS = 0.05


# --------------------------------------------------------------------------- messages
def message_content(arrays: dict[str, torch.Tensor], values: dict, name: str, record=ConfigRecord) -> RecordDict:
    """A message's content as Flower documents it: its tensors in an ``ArrayRecord`` (``arrays``, one ``Array`` per
    tensor, its dtype and shape kept) and its plain ``values`` (a job's config, a reply's metrics) in a record
    named ``name``."""
    tensors = ArrayRecord({k: Array.from_numpy_ndarray(t.detach().cpu().contiguous().numpy())
                           for k, t in arrays.items()})
    return RecordDict({"arrays": tensors, name: record(values)})


def tensors_and_values(records: RecordDict, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors (fresh, writable) and the values :func:`message_content` put in a message's content
    (``records``). A record that is missing or an array that does not deserialize raises (ValueError, KeyError
    or TypeError), and the transport turns it into a refused reply."""
    arrays = records["arrays"]
    if not isinstance(arrays, ArrayRecord):
        raise TypeError(f"'arrays' is a {type(arrays).__name__}, not an ArrayRecord")
    tensors = {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in arrays.items()}
    return tensors, dict(records[name])


def job_content(job: Job) -> RecordDict:
    return message_content(job.arrays, job.config, "config")


def job_from(message: Message) -> Job:
    return Job(*tensors_and_values(message.content, "config"))


def reply_content(reply: Reply) -> RecordDict:
    return message_content(reply.arrays, {k: float(v) for k, v in reply.metrics.items()}, "metrics", MetricRecord)


def reply_from(message: Message) -> Reply:
    return Reply(*tensors_and_values(message.content, "metrics"))


def tensor_bytes(arrays: dict[str, torch.Tensor]) -> dict[str, int]:
    """Tensor bytes of a job's or reply's models (and gradients), and the rest."""
    out = {"model": 0, "other": 0}
    for k, v in arrays.items():
        part = "model" if k.startswith(MODEL) else "other"
        out[part] += v.numel() * v.element_size()
    return out


def flower_bytes(content: RecordDict) -> int:
    """Bytes a message carries as Flower counts them (``count_bytes``: serialized arrays with their npy
    headers, keys, config values)."""
    return sum(record.count_bytes() for record in content.values())


# --------------------------------------------------------------------------- client
def run_config_specs(run_config) -> str:
    """The runs of a Flower run config (``spec.specs_from_run_config``: ``specs``, or the one run its keys
    describe) as one JSON text, the key of the processes' caches."""
    return specs_to_json(specs_from_run_config(run_config))


@lru_cache(maxsize=2)
def _federation(specs_json: str):
    return specs_from_json(specs_json)[0].federation()  # every spec of a run has the same data


@lru_cache(maxsize=256)
def _client(specs_json: str, index: int, partition: int, data_path: str | None = None) -> FederatedClient:
    torch.set_num_threads(1)
    spec = specs_from_json(specs_json)[index]
    if data_path is None:
        return FederatedClient(spec, partition, _federation(specs_json))
    return FederatedClient(spec, partition, own=read_partition(data_path, spec.federation_key(), partition))


def client_app(specs_json: str | None = None) -> ClientApp:
    """The ClientApp: its specs are ``specs_json`` or the run config's ``specs``; its partition the node
    config's ``partition-id`` (set by the simulation engine, or ``flower-supernode --node-config``), its data
    the node config's ``data-path`` (a file of ``client.write_partitions``: the deployment's SuperNodes each hold
    theirs) or, without one, its partition of the federation the spec rebuilds."""
    app = ClientApp()

    def client(context: Context, index: int) -> FederatedClient:
        text = specs_json or run_config_specs(context.run_config)
        if "partition-id" not in context.node_config:
            raise FederationError("this SuperNode has no partition-id in its node config "
                                  "(flower-supernode --node-config 'partition-id=J num-partitions=N')")
        path = context.node_config.get("data-path")
        return _client(text, index, int(context.node_config["partition-id"]), None if path is None else str(path))

    @app.query("info")
    def info(message: Message, context: Context) -> Message:
        facts = client(context, 0).info()
        facts["pid"] = os.getpid()
        return Message(RecordDict({"info": ConfigRecord(facts)}), reply_to=message)

    def work(message: Message, context: Context) -> Message:
        job = job_from(message)
        return Message(reply_content(client(context, int(job.config.pop("run"))).run(job)), reply_to=message)

    app.train()(work)
    app.evaluate()(work)
    return app


# --------------------------------------------------------------------------- server
class Exchange:
    """Carries passes over Flower's Grid: one message per client (to its node), replies matched by node;
    counts bytes and clients per round and pass kind (``traffic``)."""

    def __init__(self, node_of: dict[int, int], timeout: float, run_index: int = 0):
        self.node_of, self.timeout, self.run_index = node_of, float(timeout), run_index
        self.client_of = {node: c for c, node in node_of.items()}
        self.grid: Grid | None = None
        self.traffic: list[dict] = []  # one row per pass: round, kind, clients, bytes down/up
        self._down: dict[str, int] = {}

    def messages(self, jobs: Pass, round_number: int) -> list[Message]:
        """One message per job, addressed to its client's node (the pass's bytes down are counted here)."""
        out, down = [], {"flower": 0, "model": 0, "other": 0}
        for c, job in sorted(jobs.items()):
            content = job_content(Job(job.arrays, {**job.config, "run": self.run_index}))
            _count(down, content, job.arrays)
            out.append(Message(content, dst_node_id=self.node_of[c], message_type=MESSAGE_TYPES[job.kind],
                               group_id=str(round_number)))
        self._down = down
        return out

    def replies(self, jobs: Pass, replies: Iterable[Message], round_number: int) -> Replies:
        """The replies to ``jobs`` by client (a client that sent none within the timeout is absent: the server
        decides whether the run goes on); a client whose ClientApp failed stops the run (FederationError)."""
        got: Replies = {}
        up = {"flower": 0, "model": 0, "other": 0}
        kind = next(iter(jobs.values())).kind if jobs else ""
        for message in replies:
            c = self.client_of.get(message.metadata.src_node_id)
            if c is None or c not in jobs:
                continue
            if message.has_error():
                raise FederationError(f"round {round_number}, {kind} pass: client {c} (node "
                                      f"{message.metadata.src_node_id}) failed: {message.error.reason} "
                                      f"(code {message.error.code})")
            try:
                got[c] = reply_from(message)
            except (ValueError, KeyError, TypeError) as exc:  # the server refuses it, naming the client
                got[c] = Reply({}, {}, problem=f"unreadable message: {exc}")
                continue
            _count(up, message.content, got[c].arrays)
        self.traffic.append({"round": round_number, "kind": kind, "clients": len(jobs),
                             **{f"down_{k}": v for k, v in self._down.items()},
                             **{f"up_{k}": v for k, v in up.items()}})
        return got

    def __call__(self, jobs: Pass, round_number: int = 0) -> Replies:
        messages = self.messages(jobs, round_number)
        return self.replies(jobs, self.grid.send_and_receive(messages, timeout=self.timeout), round_number)


class PollingGrid(Grid):
    """Flower's Grid, polled for replies every ``POLL_SECONDS`` in ``send_and_receive`` where the deployment
    engine's own grid waits 3 s between pulls (every pass of a small run would last 3 s). Only Flower's public
    Grid API is used (``push_messages``, ``pull_messages``; every other call forwarded), with the same
    semantics: push, pull until every reply is in or the timeout passes. A reply that comes from no node of the
    federation (Flower's stand-in error reply for a message whose objects could not be pulled is sent from the
    SuperLink's own node) ends the wait for its message and is handed to the caller, which counts it for no
    client (``Exchange.replies``): that client did not answer.

    The last pull begins at or after the timeout: a pull that Flower holds past it (it waits inside
    ``pull_messages`` for the objects of a reply whose node died between pushing the reply and its objects: a
    known Flower limitation, docs/flower.md) is followed by one more, so the replies the other nodes sent
    meanwhile are collected, not lost with the dead node's."""

    def __init__(self, grid: Grid, poll: float = POLL_SECONDS):
        self.grid, self.poll = grid, float(poll)

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, *args, **kwargs) -> Message:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        waiting = set(self.push_messages(messages))
        end = time.monotonic() + (timeout if timeout is not None else 0.0)
        got: list[Message] = []
        while waiting:
            started = time.monotonic()
            replies = list(self.pull_messages(waiting))
            got.extend(replies)
            waiting.difference_update(m.metadata.reply_to_message_id for m in replies)
            if timeout is not None and started >= end:  # the last pull began at or after the timeout
                break
            if waiting:
                time.sleep(max(0.0, min(self.poll, end - time.monotonic())) if timeout is not None else self.poll)
        return got


class PflkitStrategy(Strategy):
    """A Flower Strategy running one of pflkit's method servers. ``configure_train`` sends the round's
    first pass, one message per client addressed to its node (PERM: each node gets the personalized
    model that visits it, with its step size and minibatch rows); ``aggregate_train`` takes the replies
    and runs the round's further passes (PERM's gradient passes for the global step and alpha), then
    returns the global model. Evaluation (personalized models on every client's test split) runs at the
    rounds ``runner.run`` evaluates."""

    def __init__(self, server: FederatedServer, exchange: Exchange, progress: Path | None = None):
        self.server, self.exchange, self.progress = server, exchange, progress
        self._round = None
        self._jobs: Pass = {}
        self._evaluation = None
        self.round_seconds: dict[int, float] = {}
        self.eval_seconds: dict[int, float] = {}
        self._t = 0.0

    def _send(self, passes, server_round: int) -> list[Message]:
        try:
            self._jobs = next(passes)
        except StopIteration:
            self._jobs = {}
            return []
        return self.exchange.messages(self._jobs, server_round)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self.exchange.grid = grid
        self._t = time.perf_counter()
        self._round = self.server.round()
        return self._send(self._round, server_round)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]):
        got = self.exchange.replies(self._jobs, replies, server_round)
        drive(self._round, lambda jobs: self.exchange(jobs, server_round), got)
        self.round_seconds[server_round] = time.perf_counter() - self._t
        if self.progress is not None:
            with open(self.progress, "a") as f:
                f.write(f"{server_round}\n")
        w = self.server.global_model()
        return ArrayRecord.from_torch_state_dict(w), MetricRecord({"seconds": self.round_seconds[server_round]})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        self._evaluation = None
        if not evaluation_due(self.server.spec, server_round):
            return []
        self._t = time.perf_counter()
        self._evaluation = self.server.evaluate()
        return self._send(self._evaluation, server_round)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        if self._evaluation is None:
            return None
        got = self.exchange.replies(self._jobs, replies, server_round)
        summary = drive(self._evaluation, lambda jobs: self.exchange(jobs, server_round), got)
        self.eval_seconds[server_round] = time.perf_counter() - self._t
        return MetricRecord({k: float(v) for k, v in summary.items()})

    def summary(self) -> None:
        pass


def _count(total: dict[str, int], content: RecordDict, arrays) -> None:
    """Add one message's bytes to ``total``: Flower's (``flower_bytes``) and its tensors' by kind."""
    total["flower"] += flower_bytes(content)
    for k, v in tensor_bytes(arrays).items():
        total[k] += v


def register(grid: Grid, timeout: float) -> dict[int, dict]:
    """Wait until every partition's node has registered (the number of partitions is what the first
    node reports) and ask each for its info; returns {partition: info (with its node id)}."""
    deadline = time.monotonic() + timeout
    infos: dict[int, dict] = {}  # node -> info
    expected = None
    while True:
        nodes = set(grid.get_node_ids())
        new = sorted(nodes - set(infos))
        if new:
            msgs = [Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=n, message_type=INFO) for n in new]
            for reply in grid.send_and_receive(msgs, timeout=max(1.0, deadline - time.monotonic())):
                if reply.has_error():
                    raise FederationError(f"node {reply.metadata.src_node_id} failed at registration: "
                                          f"{reply.error.reason}")
                info = {k: (list(v) if isinstance(v, (list, tuple)) else v)
                        for k, v in reply.content["info"].items()}
                infos[reply.metadata.src_node_id] = {**info, "node": reply.metadata.src_node_id}
            expected = expected or (next(iter(infos.values()))["num_clients"] if infos else None)
        if expected is not None and len(infos) >= expected:
            break
        if time.monotonic() > deadline:
            raise FederationError(f"only {len(infos)} of {expected or '?'} nodes registered within {timeout:g} s "
                                  f"(registered: {sorted(nodes)})")
        time.sleep(REGISTRATION_POLL)
    by_partition: dict[int, dict] = {}
    for info in infos.values():
        p = int(info["partition"])
        if p in by_partition:
            raise FederationError(f"nodes {by_partition[p]['node']} and {info['node']} both hold partition {p}")
        by_partition[p] = info
    if sorted(by_partition) != list(range(expected)):
        raise FederationError(f"need partitions 0..{expected - 1}, the nodes hold {sorted(by_partition)}")
    return by_partition


def serve(grid: Grid, specs: list[RunSpec], results: str | None = None) -> dict:
    """The ServerApp's work: register every node once, then for each spec: its start passes, evaluation at
    round 0, ``Strategy.start`` for its rounds. Returns (and with ``results`` writes as JSON, the final
    states beside it as ``.pt``) each run's history, times and traffic."""
    t0 = time.perf_counter()
    progress = None
    if results:
        Path(results).parent.mkdir(parents=True, exist_ok=True)
        progress = Path(results).with_suffix(".progress")
    grid = PollingGrid(grid)
    infos = register(grid, specs[0].timeout)
    out = {"registration_seconds": time.perf_counter() - t0, "registered_at": time.time(), "runs": [],
           "client_pids": sorted({int(i["pid"]) for i in infos.values()})}
    states = []
    for index, spec in enumerate(specs):
        t1 = time.perf_counter()
        server = FederatedServer(spec, list(infos.values()))
        exchange = Exchange({p: info["node"] for p, info in infos.items()}, spec.timeout, index)
        exchange.grid = grid
        drive(server.start(), exchange)  # round 0: before the first round
        drive(server.evaluate(), exchange)
        t_start = time.perf_counter()
        strategy = PflkitStrategy(server, exchange, progress)
        strategy.start(grid, ArrayRecord.from_torch_state_dict(server.global_model()), num_rounds=spec.rounds,
                       timeout=spec.timeout)
        out["runs"].append({"spec": json.loads(spec.to_json()), "history": server.history().to_dict(orient="list"),
                            "round_seconds": strategy.round_seconds, "eval_seconds": strategy.eval_seconds,
                            "setup_seconds": t_start - t1, "total_seconds": time.perf_counter() - t1,
                            "traffic": exchange.traffic, "participation": server.participation,
                            "lost": {str(c): p for c, p in server.lost.items()},
                            "rejected": {str(c): r for c, r in server.rejected.items()},
                            "num_parameters": sum(v.numel() for v in server.global_model().values())})
        states.append(final_state(server))
        history = server.history()
        final = history[history["round"] == history["round"].max()].groupby("metric")["value"].mean()
        print(f"pflkit: {spec.name} finished {spec.rounds} rounds: personalized accuracy "
              f"{final.get('accuracy', float('nan')):.4f}, loss {final.get('loss', float('nan')):.4f}", flush=True)
    out["total_seconds"] = time.perf_counter() - t0
    if results:
        torch.save(states, Path(results).with_suffix(".pt"))
        write_text(results, json.dumps(out, sort_keys=True))  # last and atomically: the run's results are complete
    out["states"] = states
    return out


def final_state(server: FederatedServer) -> dict:
    """The server's final tensors: the global model, and PERM's personalized models and alpha."""
    s = server.state
    state = {f"w.{k}": v for k, v in s.w.items()}
    if getattr(s, "v", None) is not None:
        state.update({f"v.{k}": v for k, v in s.v.items()})
    if getattr(s, "alpha", None) is not None:
        state["alpha"] = s.alpha
    return state


def server_app(specs_json: str | None = None, results: dict | None = None) -> ServerApp:
    """The ServerApp: its specs are ``specs_json`` or the run config's ``specs``; with ``results`` (a dict,
    the simulation engine) the results (final states included) are stored there too, or, when the run
    fails, its exception (``error``)."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        specs = specs_from_json(specs_json or run_config_specs(context.run_config))
        try:
            out = serve(grid, specs, str(context.run_config.get("results", "")) or None)
        except Exception as exc:  # the simulation engine logs it and returns: ``simulate`` raises it again
            if results is not None:
                results["error"] = exc
            raise
        if results is not None:
            results.update(out)

    return app


#: what the deployment engine's FAB names (pyproject [tool.flwr.app.components]); specs from the run config
flower_client_app = client_app()
flower_server_app = server_app()
