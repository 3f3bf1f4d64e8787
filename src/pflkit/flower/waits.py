"""Polls that back off while idle: how pflkit's SuperNode and SuperExec wait for work.

Flower 1.42's SuperNode asks its SuperLink for a message, and after a pull that brings none sleeps 3 s; its
SuperExec asks its SuperNode for a task every ``FLWR_SUPEREXEC_TASK_POLL_INTERVAL`` seconds (1 s). A message
that arrives just after a poll waits that long, and a pass waits for the latest of its nodes, so on a small
deployment those waits add up to seconds per round. Polling often instead costs a request per poll at the
SuperLink's HTTP stack: ten nodes polling every 0.05 s kept more than a core of this 2-core machine busy and
made rounds no faster (issue 32).

:class:`Backoff` waits ``FIRST_WAIT`` (a SuperNode: ``NODE_POLL_FIRST``) after activity (a message handled, a task
launched) and ``GROWTH`` times longer after each further idle poll, up to Flower's own wait: a node polls often
right after a pass and rarely while the federation is idle (and before its first message), and a message that
arrives after an idle spell of ``t`` seconds waits at most about ``(GROWTH - 1) t``.

:func:`quick_object_retries` shortens one more of Flower's waits. A message becomes visible to its receiver
before its sender has pushed all its objects (the message first, then each object, one request each), and a
receiver that asks for an object too early waits ``PULL_INITIAL_BACKOFF`` (1 s) before it asks again, then
twice as long each time. A receiver that polls often meets that race at most passes: measured on a 10-node
deployment of this machine (every request of every process timed), the ServerApp waited a second in every
round for a reply's objects, and SuperNodes and ClientApps in some rounds (issue 32). Flower's object pulls
take the first wait as a parameter (``initial_backoff``) that the modules which call them leave at its
default; pflkit passes its own and keeps the doubling, the cap and the limits: ``SERVER_OBJECT_RETRY`` for
the ServerApp (one process), ``NODE_OBJECT_RETRY`` for SuperNodes and ClientApps, many processes asking at
once (with 0.01 s for them too, a 100-node deployment on 2 cores ran PERM's rounds slower than with Flower's
1 s: the extra asks cost the saturated cores more than the waits they saved). The ServerApp's pulls also end
at its pass's deadline (:class:`ObjectPull`): a SuperNode killed after pushing a reply and before pushing its
objects would otherwise hold the ServerApp for more than an hour instead of its pass's timeout.
"""
from __future__ import annotations

import inspect
import threading
import time
import types

#: seconds of the first wait after activity
FIRST_WAIT = 0.01
#: factor by which each further idle wait grows
GROWTH = 1.5
#: the ServerApp's first wait before it asks again for a reply's object that is not there yet (one process)
SERVER_OBJECT_RETRY = FIRST_WAIT
#: a SuperNode's or ClientApp's first wait before it asks again for an object (many processes at once)
NODE_OBJECT_RETRY = 0.1
#: a SuperNode's first wait after a message before it asks its SuperLink for the next (many processes asking one
#: SuperLink): the next comes no sooner than every node's reply, and 0.01 s spent the SuperLink's core on asks
#: (2026-11-29, 10 nodes on 2 cores, two runs each: rounds shorter by about a tenth with 0.05 s)
NODE_POLL_FIRST = 0.05


class Backoff:
    """An idle poll's wait, per thread: ``wait(longest)`` sleeps the current wait (at most ``longest``) and
    grows it; ``reset()`` (on activity) makes the next wait ``FIRST_WAIT`` again. Until its first activity a
    thread waits ``longest``, as Flower does: nodes that are starting, or have never had work, poll at
    Flower's own pace."""

    def __init__(self, first: float = FIRST_WAIT, growth: float = GROWTH):
        if not (first > 0 and growth >= 1):
            raise ValueError(f"first must be > 0 and growth >= 1, got first={first!r}, growth={growth!r}")
        self.first, self.growth = first, growth
        self._local = threading.local()

    def next_wait(self, longest: float) -> float:
        """The wait the next idle poll makes (and grow the one after it)."""
        current = getattr(self._local, "wait", None)
        if current is None:  # no activity yet: idle
            return longest
        self._local.wait = min(current * self.growth, longest)
        return min(current, longest)

    def wait(self, longest: float) -> None:
        time.sleep(self.next_wait(longest))

    def reset(self) -> None:
        self._local.wait = self.first


def time_with_sleep(sleep) -> types.SimpleNamespace:
    """A stand-in for the :mod:`time` module, for one module of Flower's, whose ``sleep`` is ``sleep``;
    everything else is :mod:`time`'s own."""
    shim = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time) if not k.startswith("__")})
    shim.sleep = sleep
    return shim


def replace_time(module, sleep) -> None:
    """Give ``module`` (one of Flower's, which does ``import time``) a ``time`` whose ``sleep`` is ``sleep``."""
    if not isinstance(getattr(module, "time", None), (types.ModuleType, types.SimpleNamespace)):
        raise RuntimeError(f"{module.__name__} no longer imports the time module: pflkit.flower.waits needs "
                           "updating for this Flower version")
    module.time = time_with_sleep(sleep)


class ObjectPull:
    """One of Flower's object pulls (``function``) with pflkit's first wait (``first``, Flower's
    ``initial_backoff``). While ``deadline`` (a :func:`time.monotonic` value) is set, a pull gives up at it
    (Flower's ``max_time``; every object is still asked for once), where Flower would keep asking for up to
    ``PULL_MAX_TRIES_PER_OBJECT`` (500) times, 10 s apart at the cap: more than an hour for a message whose
    sender died between pushing it and pushing its objects."""

    def __init__(self, function, first: float):
        self.function, self.first = function, first
        self.deadline: float | None = None

    def __call__(self, *args, **kwargs):
        kwargs.setdefault("initial_backoff", self.first)
        if self.deadline is not None:
            kwargs["max_time"] = max(self.deadline - time.monotonic(), 0.0)
        return self.function(*args, **kwargs)


def quick_object_retries(module, name: str, first: float) -> ObjectPull:
    """Make ``module.name`` (one of Flower's object pulls, ``pull_objects`` or
    ``pull_and_inflate_object_from_tree``, as a module of Flower's imported it) ask again for a missing object
    after ``first`` seconds instead of Flower's ``PULL_INITIAL_BACKOFF``, and return the :class:`ObjectPull`
    now in its place (set its ``deadline`` to bound the pulls). Doing it twice changes nothing and returns the
    same one."""
    function = getattr(module, name, None)
    if isinstance(function, ObjectPull):
        return function
    if function is None or not {"initial_backoff", "max_time"} <= set(inspect.signature(function).parameters):
        raise RuntimeError(f"{module.__name__}.{name} is no longer an object pull with an initial_backoff and a "
                           "max_time: pflkit.flower.waits needs updating for this Flower version")
    pull = ObjectPull(function, first)
    setattr(module, name, pull)
    return pull
