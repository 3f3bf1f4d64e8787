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


def _orphaning_parent():
    """A parent (as the SuperLink) that starts a child in a session of its own (as its SuperExec starts
    flwr-serverapp); killed, it leaves that child to init, out of reach of its process tree."""
    proc = subprocess.Popen(["bash", "-c", "setsid sleep 120 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not psutil.Process(proc.pid).children() and time.monotonic() < deadline:
        time.sleep(0.05)
    (child,) = psutil.Process(proc.pid).children()
    return proc, child


def test_a_descendant_recorded_while_its_parent_lived_is_ended_after_the_parent_died(tmp_path):
    parent, child = _orphaning_parent()
    seen = reaper.Descendants(tmp_path / "descendants.json")
    seen.record({"superlink": parent.pid})
    assert [p.pid for p in seen.alive("superlink")] == [child.pid] and seen.alive("supernode-0") == []
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    assert _alive([child.pid]) == [child.pid]  # orphaned: nothing of the tree it was in is left to find it
    assert child.ppid() != parent.pid
    assert reaper.recorded(tmp_path / "descendants.json") == [child.pid]
    assert seen.end("superlink") == [] and _alive([child.pid]) == []
    assert reaper.recorded(tmp_path / "descendants.json") == []  # gone: a reused PID would not match its start


def test_the_owner_killed_also_ends_the_recorded_orphans(tmp_path):
    """The reaper ends the listed trees and what descendants.json recorded (the orphan of a dead parent)."""
    parent, child = _orphaning_parent()
    reaper.Descendants(tmp_path / "descendants.json").record({"superlink": parent.pid})
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    owner, watcher = _start(tmp_path, [parent.pid])
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert watcher.wait(30) == 0
    assert _alive([child.pid]) == []
    assert json.loads((tmp_path / "reaped").read_text()) == {"ended": [parent.pid], "left": []}


def test_a_deployment_says_in_one_line_which_process_died_and_ends_what_it_had_started(tmp_path, capsys):
    """A deployment whose "superlink" (a stand-in: ``_orphaning_parent``'s shell) is killed: its watch prints
    one line naming the process, its pid, the time and the signal, and ends the orphan at once; stop() then
    leaves nothing; a process ended on purpose (``kill_node``) is not reported."""
    import re

    import pytest

    pytest.importorskip("flwr")
    from pflkit.flower.deployment import Deployment

    dep = Deployment(1, tmp_path)
    dep._spawn("superlink", ["bash", "-c", "setsid sleep 120 & wait"])
    dep._spawn("supernode-0", ["sleep", "120"])
    dep._start_watch()
    deadline = time.monotonic() + 10
    while not dep.descendants.alive("superlink") and time.monotonic() < deadline:
        time.sleep(0.05)
    (orphan,) = dep.descendants.alive("superlink")
    os.kill(dep.procs["superlink"].pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while _alive([orphan.pid]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive([orphan.pid]) == []
    dep.kill_node(0)
    time.sleep(0.5)
    pids = dep.pids()
    assert dep.stop() == [] and _alive(pids) == []
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.fullmatch(rf"pflkit deployment: superlink \(pid {dep.procs['superlink'].pid}\) died at "
                        rf"\d\d:\d\d:\d\d \(killed by SIGKILL\); ending the 1 process\(es\) it had started "
                        rf"\(sleep pid {orphan.pid}\)", err[0]), err[0]
    assert dep.deaths["superlink"] == err[0]
