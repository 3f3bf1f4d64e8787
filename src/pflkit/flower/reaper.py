"""The deployment's watchdog: no Flower process outlives the process that started the federation.

``Deployment.start`` launches ``python -m pflkit.flower.reaper <owner pid> <owner start time> <pids.json>``
in a session of its own before the first Flower process. It checks every ``POLL_SECONDS`` that its owner
(the kernel or script that holds the ``Deployment``) is still the same process; when the owner is gone,
whatever killed it (SIGKILL included, which no handler of the owner can catch; a stage runner killed with
SIGTERM whose kernel then dies), it ends every process listed in ``pids.json`` and all their descendants
(SIGTERM, then SIGKILL after ``GRACE_SECONDS``) and exits. When the owner stops the deployment itself, it
writes ``stopped`` beside ``pids.json`` and the reaper exits without touching anything.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

POLL_SECONDS = 0.5
GRACE_SECONDS = 5.0


def owner_alive(pid: int, started: float) -> bool:
    """Whether process ``pid`` is alive and is the one that started at ``started`` (not a reused PID)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return abs(proc.create_time() - started) < 1e-3 and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def end_trees(roots: list[int], grace: float = GRACE_SECONDS) -> list[int]:
    """SIGTERM every process of the trees rooted at ``roots`` (collected first, so children are not lost when
    a parent dies), SIGKILL what is left after ``grace`` s; returns the PIDs still alive (none expected)."""
    import psutil

    procs = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for p in [root, *root.children(recursive=True)]:
                procs[p.pid] = p
        except psutil.NoSuchProcess:
            pass
    alive = list(procs.values())
    for sig_name, wait in (("terminate", grace), ("kill", 2.0)):
        for p in alive:
            try:
                getattr(p, sig_name)()
            except psutil.NoSuchProcess:
                pass
        deadline = time.monotonic() + wait
        while alive and time.monotonic() < deadline:  # zombies count as ended (psutil.wait_procs waits on them)
            time.sleep(0.1)
            alive = [p for p in alive if running(p)]
        alive = [p for p in alive if running(p)]
    return [p.pid for p in alive]


def running(proc) -> bool:
    """Whether ``proc`` (a psutil.Process or a PID) is alive, still the same process (its PID not reused) and
    not a zombie (an ended process its parent has not collected yet counts as ended)."""
    import psutil

    try:
        proc = psutil.Process(proc) if isinstance(proc, int) else proc
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def watch(owner: int, started: float, pids_file: Path, poll: float = POLL_SECONDS) -> str:
    """Wait until the deployment is stopped by its owner (returns "stopped") or the owner is gone (ends every
    listed process tree, returns "reaped")."""
    stopped = pids_file.parent / "stopped"
    while True:
        if stopped.exists():
            return "stopped"
        if not owner_alive(owner, started):
            if stopped.exists():
                return "stopped"
            roots = list(json.loads(pids_file.read_text()).values()) if pids_file.exists() else []
            left = end_trees(roots)
            (pids_file.parent / "reaped").write_text(json.dumps({"ended": roots, "left": left}))
            return "reaped"
        time.sleep(poll)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]))
