"""A grid stage's cells on a multi-node Ray cluster (issue 54): Ray's own ``ray.cluster_utils.Cluster``, a head
that takes no task and two one-CPU worker nodes, every node on the loopback. The stage is charles_fig12 at the
smoke profile (8 cells: 4 gammas x 2 tasks), run by a driver process (``cells_driver.py``) as its notebook runs
it. Results are compared exactly (bytes, ``torch.equal``): a cell draws its own streams, so where and beside
which cells it runs changes nothing.

- on Ray, the stage's outputs and every cell's result equal the local executor's;
- a worker node removed mid-stage: the stage completes, the lost cells re-run on the node left, no cell is lost;
- a driver killed mid-stage, re-run: only the cells the store lacked run (counted in run.json);
- one value added to the grid: only its cells run;
- no Ray process is left when the cluster is shut down.

The push / fresh clone / pull round trip of the cell store: tests/integration/test_cells_share.py."""
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402

from cells_driver import cells_of, computed, launch  # noqa: E402

STAGE = "charles_fig12"
LOOPBACK = "127.0.0.1"
# the group of the tests that start Ray or Flower's servers (tests/conftest.py): never two at once
pytestmark = pytest.mark.xdist_group("flower")


def _ray_processes(port: int) -> set[int]:
    """The processes of the Ray cluster whose GCS listens on ``port`` (every Ray process of a cluster is given
    its GCS address, or the port)."""
    marks = (f"{LOOPBACK}:{port}", f"--gcs_server_port={port}", f"--gcs-address={LOOPBACK}:{port}")
    found = set()
    for p in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
        except psutil.Error:
            continue
        if any(m in line for m in marks):
            found.add(p.pid)
    return found


@pytest.fixture(scope="module")
def cluster():
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK,
                                                      "include_dashboard": False})
    workers = [c.add_node(num_cpus=1, node_ip_address=LOOPBACK) for _ in range(2)]
    c.wait_for_nodes()
    c.workers = workers
    port = int(c.address.rpartition(":")[2])
    assert _ray_processes(port), "the check below finds the cluster's processes"
    yield c
    c.shutdown()
    deadline = time.time() + 30
    while _ray_processes(port) and time.time() < deadline:
        time.sleep(0.5)
    left = _ray_processes(port)
    assert not left, f"Ray processes left after the cluster's shutdown: {sorted(left)}"


def _driver(out: Path, store: Path, executor: str, overrides: dict | None = None, **kw) -> subprocess.Popen:
    return launch(out, store, executor, overrides, **kw)


def _run(out: Path, store: Path, executor: str, overrides: dict | None = None) -> dict:
    proc = _driver(out, store, executor, overrides)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return cells_of(stdout)


def _stored(store: Path) -> int:
    folder = store / STAGE
    return len([p for p in folder.glob("*.json") if p.name != "plan.json"]) if folder.is_dir() else 0


def _cell_results(store: Path) -> dict:
    """key -> (history, diverged, tensors) of every stored cell (the record's seconds and device aside)."""
    out = {}
    for path in sorted((store / STAGE).glob("*.json")):
        if path.name == "plan.json":
            continue
        record = json.loads(path.read_text())["record"]
        tensors = torch.load(store / "tensors" / STAGE / f"{path.stem}.pt", weights_only=True)["tensors"]
        out[path.stem] = (record["history"], record["diverged"], tensors)
    return out


def _same_cells(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert a[key][:2] == b[key][:2], key
        assert a[key][2].keys() == b[key][2].keys() and all(torch.equal(a[key][2][k], b[key][2][k]) for k in a[key][2])


OUTPUTS = ("history.csv", "diverged.csv", "metrics.json", "models/femnist.pt", "models/cifar100.pt",
           "models/index.json")


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The local executor's run: its stage outputs (bytes), its cells, and the results folder it wrote (emptied:
    the models name their folder, so the Ray run writes to the same one)."""
    base = tmp_path_factory.mktemp("local")
    cells = _run(base / "out", base / "store", "local")
    assert cells["executor"] == "local" and computed(cells) == 8
    outputs = {name: (base / "out" / "results" / name).read_bytes() for name in OUTPUTS}
    shutil.rmtree(base / "out")
    return outputs, _cell_results(base / "store"), base / "out"


def test_on_ray_the_stage_and_every_cell_equal_the_local_run(cluster, local, tmp_path):
    outputs, results, out = local
    store = tmp_path / "store"
    cells = _run(out, store, f"ray:{cluster.address}")
    assert cells["executor"] == f"ray:{cluster.address}" and computed(cells) == 8
    assert len(cells["ran_on"]) >= 2  # the cells spread over the workers (one process per node here)
    for name in OUTPUTS:
        assert (out / "results" / name).read_bytes() == outputs[name], name
    _same_cells(_cell_results(store), results)


def _wait_for(store: Path, n: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while _stored(store) < n:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.time() < deadline, f"{n} cells not stored in {timeout} s"
        time.sleep(0.05)


SLOW = {"rounds": 6}  # cells of about a second each here: a stage long enough to act on mid-way


def test_a_worker_node_removed_mid_stage_loses_no_cell(cluster, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    reference = tmp_path / "ref"
    _run(reference / "out", reference / "store", "local", SLOW)
    proc = _driver(out, store, f"ray:{cluster.address}", SLOW)
    _wait_for(store, 2, proc)
    victim = cluster.workers.pop()
    cluster.remove_node(victim)  # its worker dies with the node: Ray re-runs its task on the node left
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert _stored(store) == 8
    _same_cells(_cell_results(store), _cell_results(reference / "store"))
    history = (out / "results" / "history.csv").read_bytes()
    assert history == (reference / "out" / "results" / "history.csv").read_bytes()
    cluster.workers.append(cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK))  # back to two for the others
    cluster.wait_for_nodes()


def test_a_killed_driver_rerun_computes_only_the_unfinished_cells(cluster, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    proc = _driver(out, store, f"ray:{cluster.address}", SLOW, start_new_session=True)
    _wait_for(store, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    kept = _stored(store)
    assert 3 <= kept < 8 and not (out / "results" / "metrics.json").exists()
    assert not list(store.rglob("*.tmp*"))  # a cell is written beside its place and renamed in
    cells = _run(out, store, f"ray:{cluster.address}", SLOW)
    assert (computed(cells), _stored(store)) == (8 - kept, 8)


def test_one_value_added_to_the_grid_runs_only_its_cells(cluster, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    first = _run(out, store, f"ray:{cluster.address}", {"gammas": [0.0, 0.1]})
    assert computed(first) == 4
    grown = _run(out, store, f"ray:{cluster.address}", {"gammas": [0.0, 0.1, 0.5]})
    assert computed(grown) == 2 and _stored(store) == 6
    again = _run(out, store, f"ray:{cluster.address}", {"gammas": [0.0, 0.1, 0.5]})
    assert computed(again) == 0
    shutil.rmtree(out)
