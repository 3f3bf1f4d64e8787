"""Re-export of ``pflkit.device``, where device selection lives (data, engine and config import it
from there); kept for code that still imports it from the engine (experiments/chayti.py)."""
from ..device import DEVICES, resolve_device

__all__ = ["DEVICES", "resolve_device"]
