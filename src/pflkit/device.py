"""Device selection: ``auto`` picks CUDA when a GPU is present, else CPU. A bottom layer: data,
engine and config all use it, and it imports nothing of pflkit. torch is imported when a device is resolved,
not with the module: config reads ``DEVICES``, and a plot notebook that reads its settings through config
needs no torch."""
from __future__ import annotations

import typing
from pathlib import Path

if typing.TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(device: str = "auto") -> torch.device:
    import torch

    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device={name!r} was requested but no CUDA GPU is available; "
                             "use device: auto or cpu")
        return torch.device(name)
    raise ValueError(f"device must be one of {DEVICES} (or cuda:N), got {name!r}")


def device_name(device: torch.device) -> str:
    """A resolved device as a reader names it: the GPU's model (``NVIDIA H200``) or ``cpu``."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def cpu_model() -> str | None:
    """The processor's model as /proc/cpuinfo names it (``Intel(R) Xeon(R) Processor``); None where that file
    is missing or names none (the caller chooses its fallback)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)
