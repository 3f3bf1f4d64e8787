"""pflkit.device: the processor's model as runtimes and benchmarks record it."""
from pathlib import Path

from pflkit import device


def _cpuinfo(monkeypatch, tmp_path, text):
    """``device`` reading ``text`` as /proc/cpuinfo (None: a machine without that file)."""
    fake = tmp_path / "cpuinfo"
    if text is None:
        fake.unlink(missing_ok=True)
    else:
        fake.write_text(text)
    monkeypatch.setattr(device, "Path", lambda p: fake if p == "/proc/cpuinfo" else Path(p))


def test_cpu_model_is_the_first_model_name_of_proc_cpuinfo(monkeypatch, tmp_path):
    _cpuinfo(monkeypatch, tmp_path, "processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n\n"
                                    "processor\t: 1\nmodel name\t: Other CPU\n")
    assert device.cpu_model() == "Some CPU @ 2.0GHz"


def test_cpu_model_is_none_without_a_model_name_or_without_the_file(monkeypatch, tmp_path):
    _cpuinfo(monkeypatch, tmp_path, "processor\t: 0\nCPU part\t: 0xd0c\n")  # e.g. Arm: no model name line
    assert device.cpu_model() is None
    _cpuinfo(monkeypatch, tmp_path, None)
    assert device.cpu_model() is None
