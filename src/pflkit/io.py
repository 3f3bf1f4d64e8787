"""Outputs written atomically: a file appears complete or not at all (temp file + rename)."""
from __future__ import annotations

import dataclasses
import io as _io
import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:  # only named: the stage runner writes files through this module without loading pandas
    import pandas as pd


def current_umask() -> int:
    """The process umask, read without changing it (Linux: /proc/self/status), else via os.umask."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # set and restore: the only portable way to read it
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """The mode ``open()`` gives a new file: 0o666 less the umask (0644 under the usual umask 022)."""
    return 0o666 & ~current_umask()


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds.
    The file gets the usual mode (0o666 & ~umask), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, default_file_mode())  # after the block: a writer may have replaced the file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def slug(text: str, empty: str = "model") -> str:
    """``text`` as a file name: every run of characters other than letters and digits becomes ``_``
    (``empty`` when nothing is left)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", str(text)).strip("_") or empty


def write_text(path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
    return Path(path)


def write_json(path, obj) -> Path:
    return write_text(path, json.dumps(jsonable(obj), indent=2, sort_keys=True) + "\n")


def write_report(folder, stem: str, data, text: str) -> None:
    """A benchmark's results: ``data`` as ``<folder>/<stem>.json`` and its table ``text`` as ``<stem>.md``."""
    write_json(Path(folder) / f"{stem}.json", data)
    write_text(Path(folder) / f"{stem}.md", text)


def write_csv(path, frame: pd.DataFrame) -> Path:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False, float_format="%.6g")
    return Path(path)


def jsonable(obj):
    """``obj`` as plain JSON values: keys as str, tuples as lists, 0-d arrays/tensors as numbers, NaN as None."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item) and getattr(obj, "ndim", 1) == 0:
        return obj.item()
    if isinstance(obj, float) and obj != obj:
        return None
    return obj


# --------------------------------------------------------------------------- checkpoints
# A checkpoint holds only what ``torch.load(weights_only=True)`` accepts: tensors, str/int/float/
# bool/None and dicts/lists/tuples of them. Nothing else is ever unpickled.

class CheckpointError(ValueError):
    """A checkpoint file cannot be read, or does not fit the state it should restore. ``reason``:
    what is wrong, without the file's name or advice (for callers that word their own message)."""

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        self.reason = message if reason is None else reason


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
    template on load; nor are fields ``__init__`` does not take (``init=False``: what a state only caches, e.g.
    pFedMe's kept local round), which a rebuilt state starts without."""
    if not dataclasses.is_dataclass(state) or isinstance(state, type):
        raise TypeError(f"state must be a dataclass instance, got {type(state).__name__}")
    name = type(state).__name__
    return {"class": name,
            "fields": {f.name: encode_value(getattr(state, f.name), f"{name}.{f.name}")
                       for f in dataclasses.fields(state) if f.init and f.name not in skip}}


def state_from_payload(template, payload: dict, skip: tuple[str, ...] = ("data",)):
    """Rebuild a state from :func:`state_to_payload`'s dict. ``template`` is a fresh state of the
    same algorithm (``algorithm.init(data, seed)``): skipped fields come from it, and a saved
    generator state is set on the template's generator.

    Every saved value is checked against the template's before anything is used: tensors must have
    the template's shape and dtype, dicts the same keys, lists/tuples the same length, scalars the
    same kind (a template value of None, e.g. PERM's alpha before personalization starts, accepts
    any saved value). A mismatch raises :class:`CheckpointError` naming the field path, e.g.
    ``PERMState.w['0.weight']``; the template (and its generator) is then left untouched."""
    import torch
    name = type(template).__name__
    if not isinstance(payload, dict) or not isinstance(payload.get("fields"), dict):
        raise CheckpointError(f"checkpoint state is not a state payload (got {type(payload).__name__})")
    if payload.get("class") != name:
        raise CheckpointError(f"checkpoint holds a {payload.get('class')!r} state, expected {name!r}")
    saved = payload["fields"]
    names = [f.name for f in dataclasses.fields(template) if f.init and f.name not in skip]
    if sorted(saved) != sorted(names):
        raise CheckpointError(f"checkpoint fields {sorted(saved)} differ from {name}'s {sorted(names)}")
    values = {f: _decode_like(saved[f], getattr(template, f), f"{name}.{f}") for f in names}
    for f in names:  # only now, with every field valid: share the template's generator
        current = getattr(template, f)
        if isinstance(current, torch.Generator):
            current.set_state(values[f].get_state())
            values[f] = current
    return dataclasses.replace(template, **values)


def _describe_tensor(t) -> str:
    return f"shape {list(t.shape)} dtype {str(t.dtype).replace('torch.', '')}"


def _decode_like(payload, template, where: str):
    """Decode ``payload`` (see :func:`encode_value`) checked against ``template``, the fresh state's
    value at the same place; tensors land on the template's device. Any mismatch, or any failure to
    decode, is a :class:`CheckpointError` naming ``where``."""
    import torch
    if template is None:  # not yet set in a fresh state: anything encodable may have been saved
        try:
            return decode_value(payload, where)
        except CheckpointError:
            raise
        except Exception as exc:  # noqa: BLE001 -- e.g. a tensor saved on a device this machine lacks
            raise CheckpointError(f"{where}: cannot decode the saved value ({type(exc).__name__}: "
                                  f"{shorten(str(exc))})") from None
    if isinstance(template, _SCALARS):
        if not isinstance(payload, _SCALARS):
            raise CheckpointError(f"{where}: saved {_kind_of(payload)}, expected a {type(template).__name__}")
        if not _same_scalar_kind(payload, template):
            raise CheckpointError(f"{where}: saved {type(payload).__name__} {payload!r}, expected a "
                                  f"{type(template).__name__}")
        return payload
    kind = _kind_of(payload)
    if isinstance(template, torch.Tensor):
        value = payload.get("value") if kind == "tensor" else None
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{where}: saved {kind}, expected a tensor ({_describe_tensor(template)})")
        if value.shape != template.shape or value.dtype != template.dtype:
            raise CheckpointError(f"{where}: saved tensor has {_describe_tensor(value)}, this run's state "
                                  f"needs {_describe_tensor(template)}")
        return value.to(template.device)
    if isinstance(template, torch.Generator):
        value = payload.get("value") if kind == "generator" else None
        if not isinstance(value, torch.Tensor):
            raise CheckpointError(f"{where}: saved {kind}, expected a random generator state")
        g = torch.Generator(device=template.device)
        try:
            g.set_state(value)
        except Exception as exc:  # noqa: BLE001 -- wrong size / dtype of the state bytes
            raise CheckpointError(f"{where}: not a valid {template.device} generator state "
                                  f"({type(exc).__name__}: {shorten(str(exc))})") from None
        return g
    if isinstance(template, dict):
        value = payload.get("value") if kind == "dict" else None
        if not isinstance(value, dict):
            raise CheckpointError(f"{where}: saved {kind}, expected a dict with keys {sorted(template)}")
        missing, extra = sorted(set(template) - set(value)), sorted(set(value) - set(template))
        if missing or extra:
            raise CheckpointError(f"{where}: saved dict keys differ from this run's state: "
                                  f"missing {missing}, unexpected {extra}")
        return {k: _decode_like(value[k], template[k], f"{where}[{k!r}]") for k in template}
    if isinstance(template, (list, tuple)):
        want = type(template).__name__
        value = payload.get("value") if kind == want else None
        if not isinstance(value, list):
            raise CheckpointError(f"{where}: saved {kind}, expected a {want} of {len(template)}")
        if len(value) != len(template):
            raise CheckpointError(f"{where}: saved {want} has {len(value)} items, this run's state has "
                                  f"{len(template)}")
        items = [_decode_like(v, t, f"{where}[{i}]") for i, (v, t) in enumerate(zip(value, template))]
        return items if isinstance(template, list) else tuple(items)
    raise CheckpointError(f"{where}: this run's state holds a {type(template).__name__}, which checkpoints "
                          "do not support")


def _kind_of(payload) -> str:
    if isinstance(payload, _SCALARS):
        return f"a {type(payload).__name__}"
    if isinstance(payload, dict) and isinstance(payload.get("__kind__"), str):
        return payload["__kind__"]
    return f"an unencoded {type(payload).__name__}"


def _same_scalar_kind(value, template) -> bool:
    if isinstance(template, bool) or isinstance(value, bool):
        return type(value) is type(template)
    if isinstance(template, float):
        return isinstance(value, (int, float))
    return type(value) is type(template)


def shorten(text: str, limit: int = 300) -> str:
    """``text`` if at most ``limit`` characters, else cut after the last whole sentence (or failing
    that, word) that fits, with an ellipsis: never mid-word."""
    text = " ".join(str(text).split())
    if len(text) <= limit:
        return text
    head = text[:limit + 1]  # the cut may fall on the space after the last fitting sentence / word
    sentence = head.rfind(". ")
    if sentence >= limit // 2:
        return head[:sentence + 1] + " ..."
    word = head.rfind(" ")
    return (head[:word] if word > 0 else head[:limit]).rstrip(",;:") + " ..."


def save_checkpoint(path, obj) -> Path:
    """``torch.save`` atomically (temp file + rename): a killed process never leaves half a file. The archive is
    built in memory first, so its bytes do not depend on the (temporary) file's name: the same ``obj`` gives the
    same file (a saved model keeps its DVC hash)."""
    import torch
    buf = _io.BytesIO()
    torch.save(obj, buf)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buf.getvalue())
    return Path(path)


def _load_failure(text: str) -> str:
    """torch's weights-only refusal is mostly advice to load unsafely: keep only what it found."""
    if "WeightsUnpickler error:" in text:
        found = text.split("WeightsUnpickler error:", 1)[1].split("Check the documentation", 1)[0]
        return f"not a plain tensors-and-containers file ({' '.join(found.split()).rstrip('.')})"
    return text


def load_checkpoint(path):
    """``torch.load(..., weights_only=True)``: tensors and plain containers only, never arbitrary
    pickled objects. Unreadable files raise :class:`CheckpointError` saying how to recover."""
    import torch
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- any failure means the same thing here
        reason = f"{type(exc).__name__}: {shorten(_load_failure(str(exc)))}"
        end = "" if reason.endswith(".") else "."
        raise CheckpointError(f"cannot read checkpoint {path}: {reason}{end} Delete it (or its folder) to "
                              "start that run afresh.", reason=reason) from None
