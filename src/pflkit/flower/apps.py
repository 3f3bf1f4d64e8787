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
from the run config (``specs``; ``results``: a file for the results, written by the ServerApp) in the
deployment engine, or are bound by ``client_app`` / ``server_app`` for the simulation engine.
"""
from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE, SUPERLINK_NODE_ID
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import Strategy

from ..algorithms.round import drive
from ..io import write_text
from .client import EVALUATE, MODEL, TRAIN, FederatedClient, Job, Reply, read_partition
from .server import FederatedServer, FederationError, Pass, Replies, evaluation_due
from .spec import RunSpec, specs_from_json
from .waits import SERVER_OBJECT_RETRY, quick_object_retries

MESSAGE_TYPES = {TRAIN: "train", EVALUATE: "evaluate"}
INFO = "query.info"
#: seconds between looks at the registered nodes while waiting for all of them
REGISTRATION_POLL = 0.2
#: seconds between pulls while a pass waits for its replies (``PollingGrid``)
POLL_SECONDS = 0.02


# --------------------------------------------------------------------------- messages
#: the key of a message's packed tensors in its one record (``message_content``)
TENSORS = "pflkit.tensors"
#: the largest packed tensors a message carries as bytes in its one record: Flower's array chunk (5 MB unless
#: ``FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE`` says otherwise), the most an ArrayRecord would move in one object anyway
ONE_RECORD_MAX = FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE


def packed(arrays: dict[str, torch.Tensor]) -> np.ndarray:
    """A job's or reply's tensors as one uint8 array: a JSON header (each tensor's name, dtype and shape; its
    length in the first 8 bytes) and then the tensors' bytes end to end. Lossless: :func:`unpacked` gives the
    same tensors, bit for bit."""
    layout, chunks = [], []
    for name, t in arrays.items():
        t = t.detach().contiguous().cpu()
        layout.append([name, str(t.dtype).removeprefix("torch."), list(t.shape)])
        chunks.append(t.reshape(-1).view(torch.uint8).numpy())
    header = json.dumps(layout).encode()
    length = np.frombuffer(len(header).to_bytes(8, "little"), np.uint8)
    return np.concatenate([length, np.frombuffer(header, np.uint8), *chunks])


def unpacked(flat: np.ndarray) -> dict[str, torch.Tensor]:
    """The tensors :func:`packed` packed (fresh, writable). Bytes that are not such a packing (a header that
    does not parse, names a dtype torch does not have or a bad shape, or tensors whose sizes do not add up to
    the bytes that follow it) raise a ValueError saying which."""
    flat = np.asarray(flat)
    if flat.dtype != np.uint8 or flat.ndim != 1 or flat.size < 8:
        raise ValueError(f"packed tensors are one uint8 array of at least 8 bytes, got {flat.dtype} {flat.shape}")
    size = int.from_bytes(flat[:8].tobytes(), "little")
    if size > flat.size - 8:
        raise ValueError(f"the header claims {size} bytes, the message has {flat.size - 8} after its length")
    out, at = {}, 8 + size
    try:
        layout = json.loads(flat[8:at].tobytes())
        for name, dtype, shape in layout:
            dt = getattr(torch, str(dtype), None)
            if not isinstance(name, str) or not isinstance(dt, torch.dtype) or not isinstance(shape, list) \
                    or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
                raise ValueError(f"bad tensor entry {[name, dtype, shape]!r}")
            n = math.prod(shape) * dt.itemsize
            if at + n > flat.size:
                raise ValueError(f"tensor {name!r} {dtype} {shape} needs {n} bytes, {flat.size - at} are left")
            raw = torch.from_numpy(flat[at:at + n].copy())
            out[name] = (raw.view(dt) if n else torch.empty(0, dtype=dt)).reshape(shape)
            at += n
    except (TypeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"the header is not a list of [name, dtype, shape]: {exc}") from None
    if at != flat.size:
        raise ValueError(f"{flat.size - at} bytes follow the tensors the header lists (size mismatch)")
    return out


def message_content(arrays: dict[str, torch.Tensor], values: dict, name: str, record=ConfigRecord) -> RecordDict:
    """A message's content: its tensors (:func:`packed`) and its plain ``values`` (a job's config, a reply's
    metrics). Flower moves every record, array and array chunk of a message as an object of its own, one
    request each at every hop (ServerApp, SuperLink, SuperNode, ClientApp), and on a small deployment those
    requests are most of a round. So a message whose packed tensors fit in one of Flower's array chunks
    (``ONE_RECORD_MAX``) is one ConfigRecord, the tensors as bytes beside the values (3 objects with the
    message: RecordDict, record, message); a larger one puts them in an ArrayRecord of one array, which Flower
    cuts into chunks, and ``values`` in a ``record`` named ``name`` (5 objects and one per extra chunk)."""
    if TENSORS in values:
        raise ValueError(f"a message's values may not use the key {TENSORS!r} (its packed tensors)")
    flat = packed(arrays)
    if flat.nbytes <= ONE_RECORD_MAX:
        return RecordDict({"message": ConfigRecord({**values, TENSORS: flat.tobytes()})})
    return RecordDict({"arrays": ArrayRecord({"packed": Array(flat)}), name: record(values)})


def tensors_and_values(records: RecordDict, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and the values :func:`message_content` put in a message's content (``records``)."""
    if "message" in records:
        values = dict(records["message"])
        return unpacked(np.frombuffer(values.pop(TENSORS), np.uint8)), values
    return unpacked(records["arrays"]["packed"].numpy()), dict(records[name])


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
        text = specs_json or str(context.run_config["specs"])
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
    """A Grid that forwards to Flower's and polls for replies every ``POLL_SECONDS`` in
    ``send_and_receive`` (the deployment engine's grid polls every 3 s, which would make every pass of
    a small run last 3 s). Same semantics: push, pull until every reply is in or the timeout passes. A reply
    pulled before its node has pushed all its objects is asked for again after ``SERVER_OBJECT_RETRY``, not
    Flower's 1 s, and no later than the timeout (:class:`pflkit.flower.waits.ObjectPull`): a reply whose objects
    never come (its node died between pushing the two) becomes Flower's stand-in error reply, sent from the
    SuperLink's node. Replies from the SuperLink's node (that stand-in, and the SuperLink's own for a node or
    message it no longer has) answer for no client: ``send_and_receive`` stops waiting for them and returns
    them to no one, so every caller sees no reply from that client.

    A pull that ends past the timeout (it waited there for the objects of a reply whose node died between
    pushing the reply and its objects) is followed by one more pull, its objects asked for once: the replies
    that the other nodes sent meanwhile are collected, not lost with the dead node's."""

    def __init__(self, grid: Grid):
        from flwr.superlink.grid import http_grid  # here, not at the top: 0.7 s that a ClientApp does not need

        self.grid = grid
        self.object_pull = quick_object_retries(http_grid, "pull_objects", SERVER_OBJECT_RETRY)  # deployment grid

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
        self.object_pull.deadline = end if timeout is not None else None
        try:
            while waiting:
                started = time.monotonic()
                replies = list(self.pull_messages(waiting))
                got.extend(m for m in replies if m.metadata.src_node_id != SUPERLINK_NODE_ID)
                waiting.difference_update(m.metadata.reply_to_message_id for m in replies)
                if timeout is not None and started >= end:  # the last pull began at or after the timeout
                    break
                if waiting and (timeout is None or time.monotonic() < end):
                    time.sleep(POLL_SECONDS)
        finally:
            self.object_pull.deadline = None
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
        specs = specs_from_json(specs_json or str(context.run_config["specs"]))
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
