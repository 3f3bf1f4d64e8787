"""Files written atomically get the usual mode, 0o666 less the umask (0644 under umask 022), not
mkstemp's private 0600 (the stage report and build/failed copies: tests/integration/test_stage_safety.py)."""
import os
import stat

import pandas as pd
import pytest
import torch

from pflkit import io, plotting


@pytest.fixture(params=[(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def umask(request):
    mask, mode = request.param
    old = os.umask(mask)
    yield mode
    os.umask(old)


def _mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def test_current_umask_is_read_without_changing_it(umask):
    mask = io.current_umask()
    assert io.default_file_mode() == umask == 0o666 & ~mask
    assert io.current_umask() == mask and os.umask(mask) == mask


def test_writers_follow_the_umask(tmp_path, umask):
    written = [io.write_text(tmp_path / "a.txt", "x"), io.write_json(tmp_path / "a.json", {"a": 1}),
               io.write_csv(tmp_path / "a.csv", pd.DataFrame({"a": [1]})),
               io.save_checkpoint(tmp_path / "ck" / "a.pt", {"w": torch.zeros(2)})]
    fig, ax = plotting.plt.subplots()
    written += plotting.save_figure(fig, tmp_path / "fig", lint=False)  # an empty figure: the modes only
    plotting.plt.close(fig)
    assert len(written) == 6
    for path in written:
        assert _mode(path) == umask, path.name


def test_overwriting_gives_the_usual_mode_too(tmp_path, umask):
    path = tmp_path / "a.txt"
    path.write_text("old")
    os.chmod(path, 0o600)
    io.write_text(path, "new")
    assert _mode(path) == umask and path.read_text() == "new"
