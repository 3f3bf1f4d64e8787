"""The deployment's watchdog: no Flower process outlives the process that started the federation.

``Deployment.start`` launches ``python -m pflkit.flower.reaper <owner pid> <owner start time> <pids.json>``
in a session of its own before the first Flower process. It checks every ``POLL_SECONDS`` that its owner
(the kernel or script that holds the ``Deployment``) is still the same process; when the owner is gone,
whatever killed it (SIGKILL included, which no handler of the owner can catch; a stage runner killed with
SIGTERM whose kernel then dies), it ends every process listed in ``pids.json`` and all their descendants
(SIGTERM, then SIGKILL after ``GRACE_SECONDS``) and exits. When the owner stops the deployment itself, it
writes ``stopped`` beside ``pids.json`` and the reaper exits without touching anything.

A process whose parent dies is reparented to init, out of reach of ``children()``: the SuperLink killed
leaves the ``flwr-serverapp`` its SuperExec started. So the deployment records every descendant of its
processes while they live (:class:`Descendants`, also written to ``descendants.json`` beside ``pids.json``),
and the reaper ends those recorded ones too (each checked by its start time: a reused PID is left alone).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from ..io import write_text

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


class Descendants:
    """Every process started below some root processes, recorded while it lives: PID -> its start time, its
    name and the root it was found under (``record``), so that one orphaned when its parent died can still be
    found (``alive``) and ended (``end``). With ``path`` the record is also written there as JSON (what the
    reaper reads) whenever it grows."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.seen: dict[int, dict] = {}

    def record(self, roots: dict[str, int]) -> None:
        """Add the living descendants of ``roots`` ({root name: pid}) to the record."""
        import psutil

        grew = False
        for name, pid in roots.items():
            try:
                below = psutil.Process(pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for p in below:
                try:
                    if p.pid not in self.seen or self.seen[p.pid]["created"] != p.create_time():
                        self.seen[p.pid] = {"created": p.create_time(), "name": p.name(), "root": name}
                        grew = True
                except psutil.NoSuchProcess:
                    pass
        if grew and self.path is not None:
            write_text(self.path, json.dumps({str(k): v for k, v in self.seen.items()}))

    def alive(self, root: str | None = None) -> list:
        """The recorded processes (found under ``root``, or any) still running as the same process."""
        return [p for p in (same_process(pid, v["created"]) for pid, v in sorted(self.seen.items())
                            if root is None or v["root"] == root) if p is not None and running(p)]

    def end(self, root: str | None = None, grace: float = GRACE_SECONDS) -> list[int]:
        """End the recorded processes still running (of ``root``, or all) and their descendants; returns the PIDs
        still alive afterwards (none expected)."""
        return end_trees([p.pid for p in self.alive(root)], grace)


def same_process(pid: int, created: float):
    """The psutil.Process ``pid`` if it is still the process that started at ``created`` (its PID not reused),
    else None."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc if abs(proc.create_time() - created) < 1e-3 else None
    except psutil.NoSuchProcess:
        return None


def recorded(path: Path) -> list[int]:
    """The PIDs a deployment's ``descendants.json`` lists that are still running as the processes it recorded."""
    try:
        seen = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    procs = (same_process(int(pid), float(v["created"])) for pid, v in seen.items())
    return [p.pid for p in procs if p is not None and running(p)]


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
    listed process tree and every recorded descendant still running, returns "reaped")."""
    stopped = pids_file.parent / "stopped"
    while True:
        if stopped.exists():
            return "stopped"
        if not owner_alive(owner, started):
            if stopped.exists():
                return "stopped"
            roots = list(json.loads(pids_file.read_text()).values()) if pids_file.exists() else []
            orphans = [p for p in recorded(pids_file.parent / "descendants.json") if p not in roots]
            left = end_trees(roots + orphans)
            (pids_file.parent / "reaped").write_text(json.dumps({"ended": roots, "left": left}))
            return "reaped"
        time.sleep(poll)


if __name__ == "__main__":
    watch(int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3]))
