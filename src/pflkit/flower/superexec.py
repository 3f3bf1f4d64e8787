"""A SuperExec whose ClientApps start warm, for Flower's process-isolation mode, serving many SuperNodes.

Flower's own SuperExec (``flower-superexec``, what a SuperNode starts in its default ``subprocess`` isolation)
launches a fresh ``flwr-clientapp`` process for every message, and each one imports torch, Flower and pflkit's
ClientApp before it computes anything: seconds per message on a small machine, most of a deployment round.
This SuperExec runs beside SuperNodes started with ``--isolation process`` (Flower's mode for a SuperExec run
outside the SuperNode) and forks each ClientApp instead, from a fork server that imported those modules once
(:mod:`multiprocessing`'s ``forkserver``, with them preloaded). The ClientApp is Flower's ``flwr-clientapp``
entry point, run with the same arguments and token as Flower's executor would pass; only the start-up is gone.

    python -m pflkit.flower.superexec --runtime-api-address 127.0.0.1:9094 [--runtime-api-address ...]
        --insecure [--parent-pid PID ...] [--wake PATH]

The arguments are ``flower-superexec``'s, and so is everything else: its polling loop, plugin and TLS handling
(``flwr.supercore.superexec.run_superexec``). Flower picks a SuperExec's executor with ``get_executor`` (its
executors: subprocess, Kubernetes); this module hands it :class:`ForkExecutor` instead. Tasks other than
ClientApps start as Flower starts them.

One process serves every SuperNode of a machine: ``--runtime-api-address`` may repeat, and Flower's loop runs
once per address, each in a thread of this process, all with one executor and one fork server (a SuperExec
and a fork server per SuperNode cost about 350 MB a node: ``benchmarks/flower_node_memory.py``).
``--parent-pid`` may repeat too (the SuperNodes' PIDs): the process exits when every one of them is gone, as
Flower's SuperExec exits when its one parent is.

Each loop polls its SuperNode for work as :class:`pflkit.flower.waits.Backoff` waits: 0.01 s after it launched
a task, growing while idle up to Flower's poll interval (``FLWR_SUPEREXEC_TASK_POLL_INTERVAL``, 1 s by default).
With ``--wake PATH`` (pflkit's SuperNodes started with the same ``--wake``, and a ``--parent-pid`` for every
address, in the same order) a loop instead waits for its SuperNode's word that it holds a message
(:mod:`pflkit.flower.wake`), polling at Flower's interval meanwhile: a task is asked for once when it comes,
not a dozen times.
"""
from __future__ import annotations

import argparse
import importlib
import multiprocessing
import os
import signal
import sys
import threading
import time
from multiprocessing import forkserver

from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND, TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult, SubprocessExecutor

from .reaper import running
from .wake import Wakes
from .waits import NODE_OBJECT_RETRY, Backoff, quick_object_retries, replace_time

#: the wait of every loop's idle polls (per thread: per SuperNode), Flower's poll interval the longest
BACKOFF = Backoff()
#: imported once by the fork server, so that a forked ClientApp starts with them loaded (httpcore: the HTTP
#: client flwr-clientapp builds imports it on first use, 0.3 s of every ClientApp on this machine;
#: forkserver_warmup: that client's SSL defaults, about 15 ms of every ClientApp)
PRELOAD = ["torch", "flwr.supernode.cli.flwr_clientapp", "pflkit.flower.apps", "httpcore",
           "pflkit.flower.forkserver_warmup"]


def clientapp_argv(spec: ExecutionSpec) -> list[str]:
    """The ``flwr-clientapp`` command line for ``spec``, as Flower's subprocess executor builds it."""
    argv = [TASK_TYPE_TO_COMMAND[spec.task_type], TASK_TYPE_TO_APPIO_API_ADDRESS_ARG[spec.task_type],
            spec.runtime_api_address, "--token", spec.token]
    if spec.insecure:
        argv.append("--insecure")
    elif spec.root_certificates_path is not None:
        argv += ["--root-certificates", spec.root_certificates_path]
    if spec.parent_pid is not None:
        argv += ["--parent-pid", str(spec.parent_pid)]
    if spec.runtime_dependency_install:
        argv.append("--allow-runtime-dependency-installation")
    return argv


def run_clientapp(argv: list[str], quiet: bool) -> None:
    """A forked ClientApp: Flower's ``flwr-clientapp`` entry point with ``argv`` (its output dropped if
    ``quiet``, as Flower's executor drops it), asking again for a message object that its SuperNode does not
    hold yet after ``NODE_OBJECT_RETRY`` (:func:`pflkit.flower.waits.quick_object_retries`), not 1 s."""
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    sys.argv = argv
    from flwr.supernode.cli import flwr_clientapp
    from flwr.supernode.runtime import run_clientapp as clientapp_runtime
    quick_object_retries(clientapp_runtime, "pull_and_inflate_object_from_tree", NODE_OBJECT_RETRY)
    flwr_clientapp()


class ForkExecutor(SubprocessExecutor):
    """Flower's subprocess executor, except that ClientApps are forked from a warm fork server."""

    def __init__(self, preload: list[str] = PRELOAD):
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(preload)
        self.lock = threading.Lock()  # one executor for the loops of many SuperNodes, each in a thread
        forkserver.ensure_running()  # import torch & co. now, not at the first message

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        BACKOFF.reset()  # this SuperNode's loop (this thread) found work: poll often again
        if spec.task_type != TaskType.CLIENT_APP:
            return super().launch(spec)
        with self.lock:
            multiprocessing.active_children()  # reap the ClientApps that have finished
            try:
                self.context.Process(target=run_clientapp, args=(clientapp_argv(spec), spec.suppress_output),
                                     name=f"clientapp-{spec.task_id}").start()
            except OSError as exc:
                return LaunchResult.failed(f"could not fork a ClientApp: {exc}")
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        with self.lock:
            multiprocessing.active_children()


#: the loop's thread: which SuperNode (its pid) it serves, for its waits
LOOP = threading.local()


def loop_sleep(wakes: Wakes | None):
    """The loop's ``time.sleep``: with ``wakes``, the wait for its SuperNode's word that it holds a message
    (Flower's poll interval the longest); else :data:`BACKOFF`'s wait."""
    def sleep(seconds: float) -> None:
        node = getattr(LOOP, "node", None)
        if wakes is None or node is None:
            BACKOFF.wait(seconds)
        else:
            wakes.wait(node, seconds)
    return sleep


def serve(run_superexec, addresses: list[str], parent_pids: list[int], poll: float = 0.2) -> None:
    """Run ``run_superexec`` (Flower's loop, with its arguments from the command line) once per address, each
    in a daemon thread, until every parent in ``parent_pids`` is gone (or, with none, every loop has ended).
    With as many parents as addresses, the loop for ``addresses[j]`` serves the SuperNode ``parent_pids[j]``."""
    nodes = dict(zip(addresses, parent_pids)) if len(parent_pids) == len(addresses) else {}

    def loop(address: str) -> None:
        LOOP.node = nodes.get(address)
        try:
            run_superexec(address)
        except Exception as exc:  # one SuperNode's loop ends; the others go on
            print(f"pflkit.flower.superexec: the loop for {address} ended: {exc!r}", file=sys.stderr, flush=True)

    threads = [threading.Thread(target=loop, args=(a,), name=f"superexec {a}", daemon=True) for a in addresses]
    for thread in threads:
        thread.start()
    while any(t.is_alive() for t in threads) and (not parent_pids or any(running(p) for p in parent_pids)):
        time.sleep(poll)


def split_argv(argv: list[str]) -> tuple[list[str], list[str], list[int], str | None]:
    """``flower-superexec``'s arguments without the repeated ``--runtime-api-address`` and ``--parent-pid`` and
    pflkit's ``--wake`` (``--name value`` or ``--name=value``), and the values of those three."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--runtime-api-address", action="append", default=[])
    parser.add_argument("--parent-pid", action="append", type=int, default=[])
    parser.add_argument("--wake")
    try:
        known, rest = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        raise SystemExit(f"pflkit.flower.superexec: {exc}") from None
    return rest, known.runtime_api_address, known.parent_pid, known.wake


def main(argv: list[str] | None = None) -> None:
    """``flower-superexec`` with :class:`ForkExecutor` as its executor, for one or many SuperNodes."""
    rest, addresses, pids, wake = split_argv(sys.argv[1:] if argv is None else argv)
    if not addresses:
        raise SystemExit("pflkit.flower.superexec: --runtime-api-address is required")
    if wake is not None and len(pids) != len(addresses):
        raise SystemExit("pflkit.flower.superexec: --wake needs a --parent-pid (the SuperNode) for every "
                         f"--runtime-api-address; got {len(pids)} for {len(addresses)}")
    executor = ForkExecutor()
    run_module = importlib.import_module("flwr.supercore.superexec.run_superexec")
    run_module.get_executor = lambda *args, **kwargs: executor  # Flower's seam for a SuperExec's executor
    wakes = None
    if wake is not None:
        try:
            wakes = Wakes(wake)
        except OSError as exc:  # the loops poll as they do without --wake
            print(f"pflkit.flower.superexec: --wake {wake}: cannot listen ({exc}); polling instead",
                  file=sys.stderr, flush=True)
    replace_time(run_module, loop_sleep(wakes))  # its poll interval (FLWR_SUPEREXEC_TASK_POLL_INTERVAL) the longest
    cli = importlib.import_module("flwr.supercore.cli.flower_superexec")
    run_superexec = cli.run_superexec  # what flower_superexec calls once its arguments are parsed

    def run_all(**kwargs) -> None:
        serve(lambda address: run_superexec(**{**kwargs, "runtime_api_address": address}), addresses, pids)

    run_module.register_signal_handlers = lambda **kwargs: None  # Flower's handlers need the main thread: the
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # loops are daemon threads, they end with this one
    cli.run_superexec = run_all
    sys.argv = ["flower-superexec", "--runtime-api-address", addresses[0], *rest]  # the rest parsed by Flower
    cli.flower_superexec()


if __name__ == "__main__":
    main()
