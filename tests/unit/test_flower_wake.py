"""A SuperNode's word to pflkit's SuperExec (``pflkit.flower.wake``): the word of one SuperNode (its pid) wakes
the SuperExec's loop for that node and no other, a word sent before the loop waits is kept, a word nobody
listens for is dropped without an error, and both processes are wired to it (the SuperNode's loop says it after
storing a message; the SuperExec's loops wait on it, or back off as before without it)."""
import os
import subprocess
import sys
import threading
import time
import uuid

import pytest

pytest.importorskip("flwr")

from pflkit.flower import superexec, supernode  # noqa: E402
from pflkit.flower.wake import Wakes, notifier  # noqa: E402

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")


def _name():
    return f"@pflkit-wake-test-{uuid.uuid4().hex}"


@linux
def test_a_nodes_word_wakes_its_loop_and_no_other():
    name = _name()
    wakes = Wakes(name)
    try:
        # another process (a SuperNode stand-in) says it holds a message: its pid is the word
        node = subprocess.run([sys.executable, "-c", "import os; from pflkit.flower.wake import notifier; "
                               f"notifier({name!r})(); print(os.getpid())"], capture_output=True, text=True,
                              check=True)
        pid = int(node.stdout)
        assert wakes.wait(pid, 30.0) is True  # kept until this wait, however late the wait comes
        t0 = time.monotonic()
        assert wakes.wait(pid, 0.2) is False  # one word, one wake-up
        assert wakes.wait(pid + 1, 0.2) is False  # another node's loop sleeps on
        assert time.monotonic() - t0 >= 0.35  # both waited their time out (upper bounds left to the machine)

        woke = []
        waiter = threading.Thread(target=lambda: woke.append(wakes.wait(os.getpid(), 30.0)))
        waiter.start()
        notifier(name)()  # this process's word, while its loop waits
        waiter.join(30.0)
        assert woke == [True]
    finally:
        wakes.close()


@linux
def test_a_word_nobody_listens_for_is_dropped_without_an_error():
    notifier(_name())()  # no SuperExec: nothing raised, the SuperExec's poll finds the task
    notifier("/nonexistent/pflkit-wake")()


def test_the_superexec_loops_wait_for_their_nodes_word_or_back_off_without_it(monkeypatch):
    calls = []

    class Recorder:
        def wait(self, pid, seconds):
            calls.append((pid, seconds))

    sleep = superexec.loop_sleep(Recorder())
    seen = {}

    def loop(address):  # what Flower's loop does between asks: sleep its poll interval
        seen[address] = superexec.LOOP.node
        sleep(1.0)

    superexec.serve(loop, ["127.0.0.1:1", "127.0.0.1:2"], [], poll=0.01)  # no parents: no node to wait for
    assert seen == {"127.0.0.1:1": None, "127.0.0.1:2": None}
    assert calls == []  # backed off instead (BACKOFF: Flower's 1 s until the first task)

    parents = [subprocess.Popen(["sleep", "0.3"]) for _ in range(2)]
    superexec.serve(loop, ["127.0.0.1:1", "127.0.0.1:2"], [p.pid for p in parents], poll=0.01)
    for p in parents:
        p.wait()
    assert seen == {"127.0.0.1:1": parents[0].pid, "127.0.0.1:2": parents[1].pid}
    assert sorted(calls) == sorted([(parents[0].pid, 1.0), (parents[1].pid, 1.0)])


def test_the_supernode_speaks_after_storing_a_message_only(monkeypatch):
    from flwr.supernode import start_client_internal

    results = iter([None, 42])  # an empty pull, then a message of run 42
    monkeypatch.setattr(start_client_internal, "_pull_and_store_message", lambda **kw: next(results))
    said = []
    supernode.wake_on_message(lambda: said.append(True))
    assert start_client_internal._pull_and_store_message(state=None) is None and said == []
    assert start_client_internal._pull_and_store_message(state=None) == 42 and said == [True]


def test_the_supernode_takes_its_wake_option_in_either_argparse_form():
    argv = ["--isolation", "process", "--wake", "@w", "--superlink", "x"]
    assert supernode.split_wake(argv) == (["--isolation", "process", "--superlink", "x"], "@w")
    assert supernode.split_wake(["--wake=@v"]) == ([], "@v")
    assert supernode.split_wake(["--insecure"]) == (["--insecure"], None)
    with pytest.raises(SystemExit, match="argument --wake: expected one argument"):
        supernode.split_wake(["--wake"])
