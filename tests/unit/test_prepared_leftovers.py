"""A data stage killed while writing (issue 56): the hidden partial folders it leaves beside data/prepared/<dataset>
(the copy being built, the previous copy moved aside) are removed at the next start, and a writer that still runs
keeps its own. Each row kills a real writer (a subprocess running pflkit.data.prepared.write_folder, SIGKILLed at
one step of the write) or lays out what one leaves, then starts the next write and checks what is left."""
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pflkit import data_stages
from pflkit.data import prepared

NAME = "femnist"
ARRAYS = {"x": np.arange(6, dtype=np.float32).reshape(2, 3), "y": np.array([0, 1])}

#: a writer that kills itself (SIGKILL: no clean-up runs) at the step ``when`` names: "arrays" while writing its
#: first array into the new copy, "swap" after moving the previous copy aside, before renaming the new into place
KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from pflkit.data import prepared
    folder, when = sys.argv[1], sys.argv[2]
    die = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    if when == "arrays":
        prepared._npy_bytes = die
    else:
        real, calls = os.replace, []
        def replace(src, dst):
            calls.append(src)
            if len(calls) == 2:
                die()
            return real(src, dst)
        prepared.os.replace = replace
    prepared.write_folder(prepared.Path(folder), {"x": np.zeros(3)}, {"request": "killed"})
""")


def _kill_a_writer(folder: Path, when: str) -> int:
    run = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(folder), when], capture_output=True, text=True)
    assert run.returncode == -signal.SIGKILL, run.stderr
    return run.returncode


def _hidden(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def _previous(parent: Path) -> Path:
    return prepared.write_folder(parent / NAME, ARRAYS, {"request": "previous"})


@pytest.fixture
def parent(tmp_path) -> Path:
    folder = tmp_path / "data/prepared"
    folder.mkdir(parents=True)
    return folder


def _killed_while_writing_arrays(parent: Path):
    _previous(parent)
    _kill_a_writer(parent / NAME, "arrays")
    assert len(_hidden(parent)) == 1  # the new copy, half built


def _killed_between_the_renames(parent: Path):
    _previous(parent)
    _kill_a_writer(parent / NAME, "swap")
    assert not (parent / NAME).exists() and len(_hidden(parent)) == 2  # the previous copy aside, the new one built


def _killed_on_the_first_write(parent: Path):
    _kill_a_writer(parent / NAME, "arrays")


def _left_by_the_writer_before_pids_were_named(parent: Path):
    _previous(parent)
    (parent / f".{NAME}.k2j4h6g8").mkdir()
    (parent / f".{NAME}.old").mkdir()


def _of_a_writer_still_running(parent: Path):
    (parent / f".{NAME}.{os.getpid()}.abcd1234").mkdir()  # this process: a writer that has not finished
    (parent / f".{NAME}.{os.getppid()}.old").mkdir()


def _of_another_dataset(parent: Path):
    (parent / f".{NAME}2.999999999.abcd1234").mkdir()  # .femnist2's (a dead pid): not femnist's to remove


#: what the kill left -> (hidden folders beside data/prepared/femnist after the next start, the request of the
#: femnist folder just before that start's own write: the previous copy put back, or none)
LEFTOVERS = {
    "killed while writing the arrays": (_killed_while_writing_arrays, [], "previous"),
    "killed between moving the previous copy aside and renaming the new one": (
        _killed_between_the_renames, [], "previous"),
    "killed on the first write (no previous copy)": (_killed_on_the_first_write, [], None),
    "left by a writer before its pid was in the names": (_left_by_the_writer_before_pids_were_named, [], "previous"),
    "of a writer still running": (_of_a_writer_still_running, "kept", None),
    "of another dataset's writer": (_of_another_dataset, "kept", None),
}


@pytest.mark.parametrize("case", LEFTOVERS)
def test_a_killed_writers_partial_folders_are_removed_at_the_next_start(parent, case):
    leave, after, request = LEFTOVERS[case]
    leave(parent)
    kept = _hidden(parent) if after == "kept" else after
    removed = prepared.remove_leftovers(parent / NAME)  # the start of the next write
    assert _hidden(parent) == kept
    assert not kept or not removed
    manifest = parent / NAME / prepared.MANIFEST
    assert (json.loads(manifest.read_text())["request"] if manifest.exists() else None) == request
    prepared.write_folder(parent / NAME, ARRAYS, {"request": "next"})  # the next write itself
    assert _hidden(parent) == kept
    assert json.loads(manifest.read_text())["request"] == "next"


def test_the_next_data_stage_run_removes_them_before_any_work(parent):
    """``python -m pflkit data femnist`` (pflkit.data_stages.prepare): its start removes what a killed run of it
    left, and writes the folder (here: a manifest saying femnist cannot be had offline)."""
    root = parent.parents[1]
    _kill_a_writer(parent / NAME, "arrays")
    assert _hidden(parent)
    written = data_stages.prepare(NAME, {"data": {NAME: {"allow_download": False, "root": "data/raw"}}}, root)
    assert written == [parent / NAME] and _hidden(parent) == []
    assert json.loads((parent / NAME / prepared.MANIFEST).read_text())["available"] is False
