"""The deployment's watchdog (``pflkit.flower.reaper``, issue 32): when the process that owns a deployment dies
(SIGKILL, which no handler catches), every process tree listed in pids.json ends; when the owner stops the
deployment itself, the watchdog exits and touches nothing. Plain ``sleep`` processes stand in for Flower's."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil

from pflkit.flower import reaper


def _tree(tmp_path, name):
    """A process with a child (as a SuperNode with its ClientApp), in a session of its own."""
    proc = subprocess.Popen(["bash", "-c", "sleep 120 & sleep 120; wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(psutil.Process(proc.pid).children()) < 2 and time.monotonic() < deadline:  # both sleeps started
        time.sleep(0.05)
    return proc, [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]


def _alive(pids):
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _start(tmp_path, roots):
    owner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    (tmp_path / "pids.json").write_text(json.dumps({f"node-{i}": pid for i, pid in enumerate(roots)}))
    watcher = subprocess.Popen([sys.executable, "-m", "pflkit.flower.reaper", str(owner.pid),
                                repr(psutil.Process(owner.pid).create_time()), str(tmp_path / "pids.json")],
                               start_new_session=True)
    return owner, watcher


def test_the_owner_killed_ends_every_listed_tree(tmp_path):
    (a, pids_a), (b, pids_b) = _tree(tmp_path, "a"), _tree(tmp_path, "b")
    owner, watcher = _start(tmp_path, [a.pid, b.pid])
    time.sleep(1.0)
    assert sorted(_alive(pids_a + pids_b)) == sorted(pids_a + pids_b) and len(pids_a) == 3  # bash, 2 sleeps
    assert watcher.poll() is None  # the owner lives: nothing happens
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert watcher.wait(30) == 0
    for p in (a, b):
        p.wait(5)
    assert _alive(pids_a + pids_b) == []  # the children too (collected before their parents ended)
    assert json.loads((tmp_path / "reaped").read_text()) == {"ended": [a.pid, b.pid], "left": []}


def test_a_deployment_its_owner_stopped_is_left_alone(tmp_path):
    a, pids_a = _tree(tmp_path, "a")
    owner, watcher = _start(tmp_path, [a.pid])
    (tmp_path / "stopped").write_text("")
    assert watcher.wait(10) == 0
    owner.kill()
    owner.wait()
    time.sleep(1.0)
    assert sorted(_alive(pids_a)) == sorted(pids_a) and not (tmp_path / "reaped").exists()
    reaper.end_trees([a.pid])
    a.wait(5)
    assert _alive(pids_a) == []


def test_a_reused_pid_is_not_its_owner():
    me = psutil.Process()
    assert reaper.owner_alive(me.pid, me.create_time())
    assert not reaper.owner_alive(me.pid, me.create_time() - 10.0)  # same PID, another start time
