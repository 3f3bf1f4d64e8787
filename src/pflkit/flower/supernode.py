"""Flower's SuperNode, its polls backing off while idle instead of its fixed waits.

Flower 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) sleeps 3 s after every pull from the
SuperLink that brings no message, and waits for its ClientApp's reply in steps of 0.5 s; both are literals in
its code, with no option or environment variable. On a deployment whose clients compute in tenths of a
second they add up to seconds per round: a pass waits for the latest of its nodes (issue 32).

    python -m pflkit.flower.supernode [--wake PATH] <flower-supernode's arguments>

runs Flower's own ``flower-supernode`` entry point, unchanged, except for the sleeps of that one module: the wait
after an empty pull is :class:`pflkit.flower.waits.Backoff`'s (from ``NODE_POLL_FIRST`` after a message, growing
while idle, up to Flower's 3 s), and the waits for the reply and its objects, which look at the node's own memory,
last at most ``FIRST_WAIT``; a reply wait counts as activity. A message's objects that are not at the SuperLink
yet are asked for again after ``NODE_OBJECT_RETRY`` (:func:`pflkit.flower.waits.quick_object_retries`), not 1 s.
With ``--wake PATH`` (pflkit's option, the rest are Flower's) it also tells pflkit's SuperExec listening at PATH
when it has stored a new message (:mod:`pflkit.flower.wake`). Pulls, pushes, retries, TLS and node authentication
are Flower's.
"""
from __future__ import annotations

import argparse
import sys
import time

from .waits import FIRST_WAIT, NODE_OBJECT_RETRY, NODE_POLL_FIRST, Backoff, quick_object_retries, replace_time

#: Flower's wait after a pull that brought no message, in seconds (``start_client_internal``'s literal)
EMPTY_PULL_WAIT = 3.0


def node_sleep(backoff: Backoff):
    """The SuperNode loop's ``time.sleep``: Flower's empty-pull wait backs off, its other (local) waits are
    short and restart the backoff."""
    def sleep(seconds: float) -> None:
        if seconds >= EMPTY_PULL_WAIT:
            backoff.wait(seconds)
        else:  # waiting for the ClientApp's reply: a message is being handled
            backoff.reset()
            time.sleep(min(seconds, FIRST_WAIT))
    return sleep


def shorten_waits() -> None:
    """Give Flower's SuperNode loop pflkit's waits: its sleeps, and its retries of a message's objects."""
    from flwr.supernode import start_client_internal

    replace_time(start_client_internal, node_sleep(Backoff(first=NODE_POLL_FIRST)))
    quick_object_retries(start_client_internal, "pull_objects", NODE_OBJECT_RETRY)


def wake_on_message(notify) -> None:
    """Call ``notify`` (:func:`pflkit.flower.wake.notifier`) each time Flower's SuperNode loop has pulled a message
    and stored it with its objects, its task created: the SuperExec asks for that task at once."""
    from flwr.supernode import start_client_internal

    pull_and_store = getattr(start_client_internal, "_pull_and_store_message", None)
    if pull_and_store is None:
        raise RuntimeError("flwr.supernode.start_client_internal has no _pull_and_store_message: "
                           "pflkit.flower.supernode's --wake needs updating for this Flower version")

    def pulled(*args, **kwargs):
        run_id = pull_and_store(*args, **kwargs)
        if run_id is not None:
            notify()
        return run_id
    start_client_internal._pull_and_store_message = pulled


def split_wake(argv: list[str]) -> tuple[list[str], str | None]:
    """``argv`` without pflkit's ``--wake PATH`` (or ``--wake=PATH``), and PATH (None without one)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--wake")
    try:
        known, rest = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise SystemExit(f"pflkit.flower.supernode: {exc}") from None
    return rest, known.wake


def main() -> None:
    from flwr.supernode.cli import flower_supernode

    from .wake import notifier

    rest, wake = split_wake(sys.argv[1:])
    shorten_waits()
    if wake is not None:
        wake_on_message(notifier(wake))
    sys.argv = ["flower-supernode", *rest]
    sys.exit(flower_supernode())


if __name__ == "__main__":
    main()
