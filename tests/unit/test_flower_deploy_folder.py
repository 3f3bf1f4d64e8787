"""``deploy`` names its working folder and removes the one it made after a run that succeeded, unless asked
to keep it; after a failure the folder (its logs) stays and is named (issue 30). The deployment itself is a
stand-in here (tests/integration/test_flower.py runs real ones)."""
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from pflkit.flower import deployment  # noqa: E402


class FakeDeployment:
    made: list[Path] = []

    def __init__(self, num_nodes, workdir, threads=1, insecure=False):
        self.workdir = Path(workdir) if workdir else Path(deployment.tempfile.mkdtemp(prefix="pflkit-flower-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "superlink.log").write_text("log")
        self.leftover, self.started_seconds, self.fail = [], 0.1, False
        FakeDeployment.made.append(self.workdir)

    def hold_data(self, whole, key):
        self.held = (whole.num_clients, key)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def run(self, specs, on_round=None):
        if FakeDeployment.fail:
            raise RuntimeError("the ServerApp failed")
        return {"runs": []}


class Spec:
    def federation(self):
        return type("F", (), {"num_clients": 3})()

    def federation_key(self):
        return "the federation"


@pytest.fixture
def fake(monkeypatch):
    FakeDeployment.made, FakeDeployment.fail = [], False
    monkeypatch.setattr(deployment, "Deployment", FakeDeployment)
    monkeypatch.setattr(deployment, "RunSpec", Spec)
    return FakeDeployment


def test_its_own_folder_is_named_and_removed_after_success(fake, capsys):
    out = deployment.deploy([Spec()])
    folder = fake.made[0]
    assert out["leftover_pids"] == [] and not folder.exists()
    assert f"working folder {folder} " in capsys.readouterr().out


def test_keep_keeps_it(fake, capsys):
    deployment.deploy([Spec()], keep=True)
    folder = fake.made[0]
    assert (folder / "superlink.log").read_text() == "log"
    assert "kept" in capsys.readouterr().out
    deployment.shutil.rmtree(folder)


def test_a_failed_run_keeps_its_logs_and_names_them(fake, capsys):
    fake.fail = True
    with pytest.raises(RuntimeError, match="the ServerApp failed"):
        deployment.deploy([Spec()])
    folder = fake.made[0]
    assert (folder / "superlink.log").exists()
    assert f"its logs are in {folder}" in capsys.readouterr().out
    deployment.shutil.rmtree(folder)


def test_a_folder_given_by_the_caller_is_never_removed(fake, tmp_path):
    deployment.deploy([Spec()], workdir=tmp_path / "dep")
    assert (tmp_path / "dep" / "superlink.log").exists()
