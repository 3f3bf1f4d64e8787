"""A SuperExec whose ClientApps start warm, for Flower's process-isolation mode.

Flower's own SuperExec (``flower-superexec``, what a SuperNode starts in its default ``subprocess`` isolation)
launches a fresh ``flwr-clientapp`` process for every message, and each one imports torch, Flower and pflkit's
ClientApp before it computes anything: seconds per message on a small machine, most of a deployment round.
This SuperExec runs beside a SuperNode started with ``--isolation process`` (Flower's mode for a SuperExec run
outside the SuperNode) and forks each ClientApp instead, from a fork server that imported those modules once
(:mod:`multiprocessing`'s ``forkserver``, with them preloaded). The ClientApp is Flower's ``flwr-clientapp``
entry point, run with the same arguments and token as Flower's executor would pass; only the start-up is gone.

    python -m pflkit.flower.superexec --runtime-api-address 127.0.0.1:9094 --insecure [--parent-pid PID]

The arguments are ``flower-superexec``'s, and so is everything else: its polling loop, plugin and TLS handling
(``flwr.supercore.superexec.run_superexec``). Flower picks a SuperExec's executor with ``get_executor`` (its
executors: subprocess, Kubernetes); this module hands it :class:`ForkExecutor` instead. Tasks other than
ClientApps start as Flower starts them.
"""
from __future__ import annotations

import importlib
import multiprocessing
import os
import sys
from multiprocessing import forkserver

from flwr.supercore.constant import TASK_TYPE_TO_APPIO_API_ADDRESS_ARG, TASK_TYPE_TO_COMMAND, TaskType
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResult, SubprocessExecutor

#: imported once by the fork server, so that a forked ClientApp starts with them loaded
PRELOAD = ["torch", "flwr.supernode.cli.flwr_clientapp", "pflkit.flower.apps"]


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
    ``quiet``, as Flower's executor drops it)."""
    if quiet:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    sys.argv = argv
    from flwr.supernode.cli import flwr_clientapp
    flwr_clientapp()


class ForkExecutor(SubprocessExecutor):
    """Flower's subprocess executor, except that ClientApps are forked from a warm fork server."""

    def __init__(self, preload: list[str] = PRELOAD):
        self.context = multiprocessing.get_context("forkserver")
        self.context.set_forkserver_preload(preload)
        forkserver.ensure_running()  # import torch & co. now, not at the first message

    def launch(self, spec: ExecutionSpec) -> LaunchResult:
        if spec.task_type != TaskType.CLIENT_APP:
            return super().launch(spec)
        multiprocessing.active_children()  # reap the ClientApps that have finished
        try:
            self.context.Process(target=run_clientapp, args=(clientapp_argv(spec), spec.suppress_output),
                                 name=f"clientapp-{spec.task_id}").start()
        except OSError as exc:
            return LaunchResult.failed(f"could not fork a ClientApp: {exc}")
        return LaunchResult.accepted()

    def reconcile(self) -> None:
        multiprocessing.active_children()


def main() -> None:
    """``flower-superexec`` with :class:`ForkExecutor` as its executor."""
    executor = ForkExecutor()
    superexec = importlib.import_module("flwr.supercore.superexec.run_superexec")
    superexec.get_executor = lambda *args, **kwargs: executor  # Flower's seam for a SuperExec's executor
    from flwr.supercore.cli.flower_superexec import flower_superexec
    sys.argv = ["flower-superexec", *sys.argv[1:]]
    flower_superexec()


if __name__ == "__main__":
    main()
