"""pflkit's SuperExec (``pflkit.flower.superexec``): ClientApps forked from a warm fork server get exactly the
command line Flower's own executor would start, other tasks start as Flower starts them, and a forked ClientApp
runs Flower's ``flwr-clientapp`` entry point. The deployment tests (tests/integration/test_flower.py) run every
Flower deployment through it."""
import multiprocessing
import subprocess
import sys
import threading

import pytest

pytest.importorskip("flwr")

from flwr.supercore.constant import TaskType  # noqa: E402
from flwr.supercore.superexec.executor import ExecutionSpec, LaunchResultStatus, SubprocessExecutor  # noqa: E402

from pflkit.flower import superexec  # noqa: E402


def _spec(task_type=TaskType.CLIENT_APP, **over):
    values = {"task_type": task_type, "runtime_api_address": "127.0.0.1:9094", "token": "t0k3n", "insecure": False,
              "root_certificates_path": None, "runtime_dependency_install": False, "parent_pid": None,
              "suppress_output": False, "task_id": 7}
    return ExecutionSpec(**{**values, **over})


def _flower_argv(spec, monkeypatch):
    """The command Flower's subprocess executor starts for ``spec`` (its Popen intercepted)."""
    seen = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kw: seen.append(list(args)))
    SubprocessExecutor().launch(spec)
    monkeypatch.undo()
    return seen[0]


@pytest.mark.parametrize("over", [{}, {"insecure": True}, {"root_certificates_path": "/ca.pem"},
                                  {"parent_pid": 4242, "runtime_dependency_install": True}])
def test_a_forked_clientapp_gets_the_command_line_flowers_executor_would_run(over, monkeypatch):
    spec = _spec(**over)
    assert superexec.clientapp_argv(spec) == _flower_argv(spec, monkeypatch)


class _Recorder:
    def __init__(self):
        self.started = []

    def Process(self, target, args, name):  # noqa: N802 (multiprocessing's name)
        recorder = self

        class P:
            def start(self):
                recorder.started.append((target, args, name))
        return P()


def test_clientapps_are_forked_and_other_tasks_start_as_flower_starts_them(monkeypatch):
    executor = object.__new__(superexec.ForkExecutor)  # no fork server: the context is a recorder
    executor.context, executor.lock = _Recorder(), threading.Lock()
    result = executor.launch(_spec(suppress_output=True))
    assert result.status == LaunchResultStatus.ACCEPTED
    (target, args, name), = executor.context.started
    assert target is superexec.run_clientapp and name == "clientapp-7"
    assert args == (["flwr-clientapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "t0k3n"], True)
    popened = []
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kw: popened.append(list(args)))
    assert executor.launch(_spec(TaskType.SERVER_APP)).status == LaunchResultStatus.ACCEPTED
    assert popened == [["flwr-serverapp", "--runtime-api-address", "127.0.0.1:9094", "--token", "t0k3n"]]
    assert len(executor.context.started) == 1


def _fake_clientapp(path):
    """Stands in for flwr-clientapp in the fork test: writes its argv."""
    import sys
    with open(path, "w") as f:
        f.write(" ".join(sys.argv))


def test_the_fork_server_runs_the_clientapp_entry_point_with_its_argv(tmp_path, monkeypatch):
    """A real fork server (preloading a small module, not torch): the child runs ``run_clientapp``, which sets
    sys.argv and calls ``flwr_clientapp`` (here replaced in the child by a function that records its argv)."""
    out = tmp_path / "argv.txt"
    executor = superexec.ForkExecutor(preload=["json"])
    process = executor.context.Process(target=_run_patched, args=(["flwr-clientapp", "--token", "x"], str(out)))
    process.start()
    process.join(60)
    assert process.exitcode == 0
    assert out.read_text() == "flwr-clientapp --token x"
    assert multiprocessing.active_children() == []


def _run_patched(argv, path):
    import flwr.supernode.cli as cli
    cli.flwr_clientapp = lambda: _fake_clientapp(path)
    superexec.run_clientapp(argv, quiet=False)


def test_a_deployment_refuses_an_unknown_clientapps_mode_by_name(tmp_path):
    from pflkit.flower.deployment import Deployment
    with pytest.raises(ValueError, match=r"clientapps must be one of forked, per-message, got 'warm'"):
        Deployment(1, tmp_path, clientapps="warm")
    assert Deployment(1, tmp_path, insecure=True).clientapps == "forked"  # the default: nothing started yet


def test_the_command_line_may_name_many_supernodes_in_either_argparse_form():
    rest, addresses, pids, wake = superexec.split_argv([
        "--insecure", "--runtime-api-address", "127.0.0.1:1", "--parent-pid", "11",
        "--runtime-api-address=127.0.0.1:2", "--parent-pid=12", "--health-server-address", "x"])
    assert rest == ["--insecure", "--health-server-address", "x"]
    assert addresses == ["127.0.0.1:1", "127.0.0.1:2"] and pids == [11, 12] and wake is None
    assert superexec.split_argv(["--wake", "@w", "--runtime-api-address=a"]) == ([], ["a"], [], "@w")
    assert superexec.split_argv(["--wake=/tmp/w"])[3] == "/tmp/w"
    with pytest.raises(SystemExit, match="argument --parent-pid: expected one argument"):
        superexec.split_argv(["--runtime-api-address", "a", "--parent-pid"])


def test_one_process_runs_flowers_loop_once_per_supernode_until_every_parent_is_gone():
    """``serve`` starts the loop once per address, in threads, and returns when the last parent process has
    exited, not before (two sleeping processes stand in for the SuperNodes)."""
    import time

    seen, release = [], threading.Event()

    def loop(address):
        seen.append(address)
        release.wait()  # a loop runs until the process ends

    parents = [subprocess.Popen(["sleep", str(s)]) for s in (0.5, 1.5)]
    t0 = time.monotonic()
    superexec.serve(loop, ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], [p.pid for p in parents], poll=0.05)
    waited = time.monotonic() - t0
    for p in parents:
        p.wait()
    release.set()
    assert sorted(seen) == ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    assert waited >= 1.4  # the second parent lived 1.5 s (upper bounds are left to machine speed)


def test_one_process_for_many_supernodes_ends_when_every_loop_has_ended(capsys):
    """Without parents, ``serve`` returns once every loop thread has returned (a loop that failed ends its
    thread, saying so; the others go on)."""
    ended = []

    def loop(address):
        if address.endswith(":1"):
            raise RuntimeError("SuperNode gone")
        ended.append(address)

    superexec.serve(loop, ["127.0.0.1:1", "127.0.0.1:2"], [], poll=0.01)
    assert ended == ["127.0.0.1:2"]
    assert "the loop for 127.0.0.1:1 ended: RuntimeError('SuperNode gone')" in capsys.readouterr().err


def test_a_launch_restarts_its_loops_backoff(monkeypatch):
    superexec.BACKOFF.reset()
    for _ in range(4):
        superexec.BACKOFF.next_wait(1.0)
    executor = superexec.ForkExecutor.__new__(superexec.ForkExecutor)  # no fork server needed: not a ClientApp
    monkeypatch.setattr(SubprocessExecutor, "launch", lambda self, spec: "flower's launch")
    assert executor.launch(_spec(TaskType.SERVER_APP)) == "flower's launch"
    assert superexec.BACKOFF.next_wait(1.0) == superexec.BACKOFF.first


def test_every_module_the_fork_server_preloads_imports():
    """The fork server skips a preload module that fails to import without a word (multiprocessing.forkserver),
    so each is imported here in a fresh interpreter: the ClientApps' own modules, and
    ``pflkit.flower.forkserver_warmup``, whose import builds one HTTP client so that forked ClientApps find
    OpenSSL's default certificate paths loaded."""
    assert "pflkit.flower.forkserver_warmup" in superexec.PRELOAD
    code = "import importlib, sys; [importlib.import_module(m) for m in sys.argv[1:]]"
    subprocess.run([sys.executable, "-c", code, *superexec.PRELOAD], check=True, timeout=300)
