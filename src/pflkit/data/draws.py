"""Randomness per client: in a pass every client draws from its own stream, seeded from the pass's key and
the client's id, so a client computing alone draws exactly what it draws inside the batch.

A pass's :class:`ClientDraws` is one integer key (drawn from the run's generator by the server, or given);
client c's generator is seeded with ``seeds.client_stream(key, c)`` and kept for the whole pass, so the draws
a client step makes one after another (its minibatch rows, then its dropout masks step by step) continue one
stream. A federated client gets the key, not its rows, and draws them itself (``for_client``).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .. import seeds


class ClientDraws:
    """The per-client streams of one pass: ``generator(c)`` is client c's (created on first use, then
    continued). ``ids`` maps the dataset's client numbers to the federation's (a federated client holds
    one client, number 0, whose id is its partition)."""

    #: the key of a pass that draws nothing (its streams refuse to be read)
    NONE = -1

    def __init__(self, key: int, ids: list[int] | None = None):
        self.key, self.ids = int(key), ids
        self._streams: dict[int, torch.Generator] = {}

    @classmethod
    def drawn_from(cls, generator: torch.Generator) -> ClientDraws:
        """A pass's draws keyed by one number from ``generator`` (the run's stream)."""
        return cls(int(torch.randint(0, 2**62, (), generator=generator)))

    def for_client(self, client: int) -> ClientDraws:
        """These draws as a one-client dataset of ``client`` makes them (its only client is number 0)."""
        return ClientDraws(self.key, ids=[int(client)])

    def generator(self, client: int) -> torch.Generator:
        if self.key == self.NONE:
            raise RuntimeError("a pass that declared no draws (no schedule or batch size) asked for random draws")
        c = int(client) if self.ids is None else self.ids[int(client)]
        if c not in self._streams:
            self._streams[c] = torch.Generator().manual_seed(seeds.client_stream(self.key, c))
        return self._streams[c]

    def per_client(self, clients: Tensor, draw) -> Tensor:
        """``draw(generator, c, m)`` -> [m, ...] for every client c of ``clients`` ([M]: the client of each entry),
        m = how many entries it has, assembled as [M, ...] in the entries' order (client c's draw fills its
        entries in their order). One sort groups the entries; the loop over clients only draws."""
        order = torch.argsort(clients, stable=True)
        hosts, counts = torch.unique_consecutive(clients[order], return_counts=True)
        drawn = torch.cat([draw(self.generator(c), c, m) for c, m in zip(hosts.tolist(), counts.tolist())])
        out = torch.empty_like(drawn)
        out[order] = drawn
        return out


class LaneDraws(ClientDraws):
    """The draws of a pass over ``lanes`` copies of the same ``width`` clients, laid out copy-major (entry
    ``lane * width + j`` is client j of copy ``lane``; every draw's entries in row-major order, the models last):
    each copy draws what those ``width`` clients draw alone from ``key`` (one set of streams, drawn once and
    repeated over the copies). A grid of settings (``LocalUpdateGrid``) draws so: every setting's rows and
    dropout masks are what it draws alone, whichever settings share its pass."""

    def __init__(self, key: int, lanes: int, width: int):
        super().__init__(key)
        self.lanes, self.width = int(lanes), int(width)

    def per_client(self, clients: Tensor, draw) -> Tensor:
        if clients.numel() % (self.lanes * self.width):
            raise ValueError(f"a pass of {self.lanes} copies of {self.width} clients got {clients.numel()} entries")
        grid = clients.reshape(-1, self.lanes, self.width)
        if not bool((grid == grid[:, :1]).all()):
            raise ValueError("every copy of a LaneDraws pass must list the same clients in the same order")
        one = super().per_client(grid[:, 0].reshape(-1), draw)  # [rows * width, ...]: what one copy draws
        rest = one.shape[1:]
        one = one.reshape(grid.shape[0], 1, self.width, *rest)
        return one.expand(grid.shape[0], self.lanes, self.width, *rest).reshape(clients.numel(), *rest)


def as_draws(generator: torch.Generator | ClientDraws) -> ClientDraws:
    """``generator`` if it is a pass's draws already, else draws keyed from it."""
    return generator if isinstance(generator, ClientDraws) else ClientDraws.drawn_from(generator)
