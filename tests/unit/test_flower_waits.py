"""How pflkit's SuperNode and SuperExec wait for work (``pflkit.flower.waits``, ``pflkit.flower.supernode``):
the idle wait starts at ``FIRST_WAIT``, grows by ``GROWTH`` up to Flower's own wait and restarts on activity,
per thread; the SuperNode's empty-pull wait backs off while its local reply waits stay short; and the Flower
code whose waits these replace still waits where and as they expect (a Flower upgrade that moves them fails
here, not as a silently slow deployment)."""
import inspect
import threading
import time
import types

import pytest

from pflkit.flower import supernode, waits


def test_the_idle_wait_grows_to_the_longest_and_restarts_on_activity():
    b = waits.Backoff(first=0.01, growth=2.0)
    assert [b.next_wait(0.05) for _ in range(2)] == [0.05, 0.05]  # before any activity: Flower's own wait
    b.reset()
    assert [b.next_wait(0.05) for _ in range(5)] == [0.01, 0.02, 0.04, 0.05, 0.05]  # exact: powers of two
    b.reset()
    assert b.next_wait(0.05) == 0.01
    assert b.next_wait(0.005) == 0.005  # never over the longest the caller allows
    with pytest.raises(ValueError, match="growth"):
        waits.Backoff(first=0.01, growth=0.5)


def test_each_thread_backs_off_on_its_own():
    b = waits.Backoff(first=0.01, growth=2.0)
    b.reset()
    for _ in range(3):
        b.next_wait(1.0)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(b.next_wait(1.0)))
    thread.start()
    thread.join()
    assert seen == [1.0] and b.next_wait(1.0) == 0.08  # the new thread has seen no activity yet


def test_the_supernodes_empty_pull_wait_backs_off_and_a_reply_wait_is_short(monkeypatch):
    slept = []
    monkeypatch.setattr(waits.time, "sleep", slept.append)
    monkeypatch.setattr(supernode.time, "sleep", slept.append)
    sleep = supernode.node_sleep(waits.Backoff(first=0.01, growth=2.0))
    # an empty pull before any message, a message's reply waits, three empty pulls
    for seconds in (3, 0.5, 0.5, 3, 3, 3):
        sleep(seconds)
    assert slept == [3, waits.FIRST_WAIT, waits.FIRST_WAIT, 0.01, 0.02, 0.04]


def test_replace_time_gives_one_module_its_own_sleep_and_keeps_the_rest_of_time():
    module = types.ModuleType("flowerlike")
    module.time = time
    calls = []
    waits.replace_time(module, calls.append)
    module.time.sleep(3)
    assert calls == [3] and module.time.monotonic is time.monotonic and time.sleep is not calls.append
    with pytest.raises(RuntimeError, match="no longer imports the time module"):
        waits.replace_time(types.ModuleType("moved_on"), calls.append)


def test_flowers_loops_still_wait_where_pflkit_replaces_their_waits():
    pytest.importorskip("flwr")
    from flwr.supercore.superexec import run_superexec
    from flwr.supernode import start_client_internal

    node = inspect.getsource(start_client_internal)
    assert "import time\n" in node
    assert node.count(f"time.sleep({supernode.EMPTY_PULL_WAIT:g})") == 1  # after an empty pull
    assert node.count("time.sleep(0.5)") == 2  # waiting for the reply and its objects: local, kept short
    exec_loop = inspect.getsource(run_superexec)
    assert "import time\n" in exec_loop and exec_loop.count("time.sleep(") == 1
    assert "time.sleep(task_poll_interval)" in exec_loop
