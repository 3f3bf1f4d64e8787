"""Flower's simulation engine on a busy machine: Ray's start-up is retried, and a start that keeps failing is
a pflkit error naming the fix (issue 30), not a Ray traceback. Ray itself is replaced by a stand-in whose
``init`` fails as Ray's does when its node misses the 30 s window (the message is Ray's own)."""
import pytest

ray = pytest.importorskip("ray")

from pflkit.flower import simulation  # noqa: E402

RAY_TIMEOUT = (
    "The current node timed out during startup. This could happen because some of the raylet failed to startup")


@pytest.fixture
def fake_ray(monkeypatch):
    calls = {"init": [], "shutdown": 0, "fail": 0}

    def init(**kwargs):
        calls["init"].append(kwargs)
        if len(calls["init"]) <= calls["fail"]:
            raise Exception(RAY_TIMEOUT)

    def shutdown():
        calls["shutdown"] += 1

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", shutdown)
    return calls


def test_a_start_that_fails_once_is_retried(fake_ray):
    fake_ray["fail"] = 1
    simulation.start_ray({"num_cpus": 1})
    assert len(fake_ray["init"]) == 2 and fake_ray["shutdown"] == 1
    assert fake_ray["init"][-1]["num_cpus"] == 1
    assert "PYTHONPATH" in fake_ray["init"][-1]["runtime_env"]["env_vars"]  # the workers import this tree


def test_a_start_that_keeps_failing_names_the_fix(fake_ray):
    fake_ray["fail"] = 99
    with pytest.raises(simulation.RayStartError) as info:
        simulation.start_ray({"num_cpus": 1}, attempts=3)
    message = str(info.value)
    assert len(fake_ray["init"]) == 3 and fake_ray["shutdown"] == 3
    assert "3 tries" in message and "timed out during startup" in message
    assert "Load average" in message and "python -m pflkit.flower deploy" in message
    assert "flower_equivalence.engines" in message


def test_a_running_ray_is_used_as_it_is(monkeypatch, fake_ray):
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    simulation.start_ray({"num_cpus": 1})
    assert fake_ray["init"] == []
