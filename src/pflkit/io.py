"""Outputs written atomically: a file appears complete or not at all (temp file + rename)."""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path, obj) -> Path:
    return write_text(path, json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")


def write_csv(path, frame: pd.DataFrame) -> Path:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")
    return Path(path)


def read_json(path):
    return json.loads(Path(path).read_text())


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


# --------------------------------------------------------------------------- checkpoints
# A checkpoint holds only what ``torch.load(weights_only=True)`` accepts: tensors, str/int/float/
# bool/None and dicts/lists/tuples of them. Nothing else is ever unpickled.

class CheckpointError(ValueError):
    """A checkpoint file cannot be read, or does not fit the state it should restore."""


_SCALARS = (bool, int, float, str, type(None))


def encode_value(value, where: str = "value"):
    """A state value -> a weights_only-loadable structure (tagged so it decodes unambiguously).

    Supported: tensors (saved on CPU, device remembered), ``torch.Generator`` (via ``get_state``),
    dicts with str keys, lists, tuples, and str/int/float/bool/None. Anything else is a TypeError
    naming ``where``."""
    import torch
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, torch.Tensor):
        return {"__kind__": "tensor", "value": value.detach().to("cpu", copy=True), "device": str(value.device)}
    if isinstance(value, torch.Generator):
        return {"__kind__": "generator", "value": value.get_state(), "device": str(value.device)}
    if isinstance(value, dict):
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise TypeError(f"{where}: dict keys must be str to checkpoint, got {bad[:3]!r}")
        return {"__kind__": "dict", "value": {k: encode_value(v, f"{where}[{k!r}]") for k, v in value.items()}}
    if isinstance(value, (list, tuple)):
        return {"__kind__": type(value).__name__,
                "value": [encode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    raise TypeError(f"{where}: cannot checkpoint a {type(value).__name__}; supported: tensors, "
                    "torch.Generator, dicts (str keys), lists, tuples, str/int/float/bool/None")


def decode_value(payload, where: str = "value", generator=None):
    """Inverse of :func:`encode_value`. A generator state is set on ``generator`` when given (so
    objects that share it keep sharing it), else on a new generator of the saved device."""
    import torch
    if isinstance(payload, _SCALARS):
        return payload
    if not isinstance(payload, dict) or "__kind__" not in payload:
        raise CheckpointError(f"{where}: not an encoded value: {type(payload).__name__}")
    kind, value = payload["__kind__"], payload["value"]
    if kind == "tensor":
        return value.to(payload["device"])
    if kind == "generator":
        g = generator if generator is not None else torch.Generator(device=payload["device"])
        g.set_state(value)
        return g
    if kind == "dict":
        return {k: decode_value(v, f"{where}[{k!r}]") for k, v in value.items()}
    if kind in ("list", "tuple"):
        items = [decode_value(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if kind == "list" else tuple(items)
    raise CheckpointError(f"{where}: unknown encoded kind {kind!r}")


def state_to_payload(state, skip: tuple[str, ...] = ("data",)) -> dict:
    """An algorithm state (a dataclass, see ``pflkit.algorithms.base.BaseState``) -> a plain dict.
    Fields in ``skip`` (the FederatedDataset ``data``) are not saved: they are re-attached from the
    template on load."""
    import dataclasses
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        raise TypeError(f"state must be a dataclass instance, got {type(state).__name__}")
    name = type(state).__name__
    return {"class": name,
            "fields": {f.name: encode_value(getattr(state, f.name), f"{name}.{f.name}")
                       for f in dataclasses.fields(state) if f.name not in skip}}


def state_from_payload(template, payload: dict, skip: tuple[str, ...] = ("data",)):
    """Rebuild a state from :func:`state_to_payload`'s dict. ``template`` is a fresh state of the
    same algorithm (``algorithm.init(data, seed)``): skipped fields come from it, and a saved
    generator state is set on the template's generator."""
    import dataclasses

    import torch
    name = type(template).__name__
    if payload.get("class") != name:
        raise CheckpointError(f"checkpoint holds a {payload.get('class')!r} state, expected {name!r}")
    saved = payload["fields"]
    names = [f.name for f in dataclasses.fields(template) if f.name not in skip]
    if sorted(saved) != sorted(names):
        raise CheckpointError(f"checkpoint fields {sorted(saved)} differ from {name}'s {sorted(names)}")
    values = {}
    for f in names:
        current = getattr(template, f)
        values[f] = decode_value(saved[f], f"{name}.{f}",
                                 generator=current if isinstance(current, torch.Generator) else None)
    return dataclasses.replace(template, **values)


def save_checkpoint(path, obj) -> Path:
    """``torch.save`` atomically (temp file + rename): a killed process never leaves half a file."""
    import torch
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)


def load_checkpoint(path):
    """``torch.load(..., weights_only=True)``: tensors and plain containers only, never arbitrary
    pickled objects. Unreadable files raise :class:`CheckpointError` saying how to recover."""
    import torch
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- any failure means the same thing here
        raise CheckpointError(f"cannot read checkpoint {path}: {type(exc).__name__}: {str(exc)[:300]}. "
                              f"Delete it (or its folder) to start that run afresh.") from None
