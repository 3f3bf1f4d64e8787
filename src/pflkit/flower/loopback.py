"""A federated run in one process, no Flower: the server's passes handed to ``FederatedClient`` objects
directly. The same server and client code as on Flower, minus the transport: what the tests use to
check the protocol against the batched engine where Flower is not installed."""
from __future__ import annotations

import pandas as pd

from ..algorithms.round import drive
from .client import FederatedClient, Job, Reply
from .server import FederatedServer, evaluation_due
from .spec import RunSpec


def run_rounds(server: FederatedServer, exchange) -> pd.DataFrame:
    """The whole run: ``start`` passes, evaluation at round 0, then every round and its due evaluations."""
    spec = server.spec
    drive(server.start(), exchange)
    drive(server.evaluate(), exchange)
    for r in range(1, spec.rounds + 1):
        drive(server.round(), exchange)
        if evaluation_due(spec, r):
            drive(server.evaluate(), exchange)
    return server.history()


def run_loopback(spec: RunSpec, *, participation: list[dict] | None = None,
                 fail_from: dict[int, int] | None = None) -> tuple[pd.DataFrame, FederatedServer]:
    """``spec`` with every client an object in this process: (history, the server with its final state).

    Failures, replayed or made up: ``participation`` (a run's record, ``FederatedServer.participation``) makes
    every client that did not answer pass i of that run silent in pass i here; ``fail_from`` {client: pass}
    makes a client silent from that pass on. The server then goes on (or stops) as with a real failure."""
    federation = spec.federation()
    clients = [FederatedClient(spec, j, federation) for j in range(federation.num_clients)]
    server = FederatedServer(spec, [c.info() for c in clients])

    def answers(c: int) -> bool:
        i = server.passes
        if participation is not None and c not in participation[i]["answered"]:
            return False
        return fail_from is None or i < fail_from.get(c, i + 1)

    def exchange(jobs: dict[int, Job]) -> dict[int, Reply]:
        return {c: clients[c].run(job) for c, job in jobs.items() if answers(c)}

    return run_rounds(server, exchange), server
