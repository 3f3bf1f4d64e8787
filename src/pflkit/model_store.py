"""Trained models as pipeline outputs: ``models/<stage>/``, one file per method x seed (or per run).

A file holds an algorithm's final state (``io.state_to_payload``: the global and/or personalized models,
PERM's alpha, a method's own buffers, the random generator) with what produced it: the stage, method, seed,
round, the digest of the federation it trained on, the stage's config (JSON) and, where the stage records
them, the metrics it reported for this run. The format is a ``torch.save`` file read back with
``torch.load(weights_only=True)`` (``io.load_checkpoint``: tensors and plain containers, never pickled
objects), written atomically and byte-identically for the same state, so an unchanged result keeps its DVC
hash. ``models/<stage>/index.json`` lists the files.

:func:`restore` puts a saved state back into an algorithm (``state_from_payload`` against a fresh
``algorithm.init(data, seed)``, so shapes, dtypes and keys are checked); evaluating the restored models
gives the stage's recorded numbers exactly (tests/integration/test_saved_models.py, for every training
stage's smoke configuration).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from .data.federated import data_digest
from .io import (CheckpointError, load_checkpoint, save_checkpoint, state_from_payload, state_to_payload,
                 write_json)
from .io import decode_value, encode_value, slug
from .paths import resolve

FORMAT = "pflkit-model-1"
INDEX = "index.json"


def models_dir_of(results_dir: str, stage: str) -> str:
    """Where a run whose results go to ``results_dir`` keeps its models: models/<stage> beside the pipeline's
    results/<stage>; <results_dir>/models for any other run (a profile's build/<profile>/<stage>), so a
    smoke or paper-profile run never touches the DVC output."""
    return f"models/{stage}" if results_dir == f"results/{stage}" else f"{results_dir}/models"


def models_dir(cfg, folder: str | Path | None = None) -> Path:
    """``folder`` when given, else the stage config's models folder (``models_dir_of``); resolved in the project."""
    return resolve(models_dir_of(cfg.results_dir, cfg.stage) if folder is None else folder)


def file_name(method: str, seed: int) -> str:
    return f"{slug(method)}__seed{seed}.pt"


def save_state(folder: str | Path, stage: str, method: str, seed: int, state, *, config: Mapping | None = None,
               data_digest: str | None = None, metrics: Mapping | None = None, extra: Mapping | None = None) -> Path:
    """Save one run's final ``state`` (an algorithm state dataclass) as ``<folder>/<method>__seed<s>.pt``."""
    payload = {"format": FORMAT, "stage": stage, "method": method, "seed": int(seed),
               "round": int(getattr(state, "round", 0)), "data_digest": data_digest,
               "config": json.dumps(config or {}, sort_keys=True, default=str),
               "metrics": dict(metrics or {}), "state": state_to_payload(state), "extra": dict(extra or {})}
    return save_checkpoint(Path(folder) / file_name(method, seed), payload)


def save_tensors(folder: str | Path, stage: str, name: str, tensors: Mapping[str, Any], *,
                 config: Mapping | None = None, metrics: Mapping | None = None) -> Path:
    """Save named tensors that are not an algorithm state (a FedAvg model and the alpha computed at it, a
    grid of settings' models) as ``<folder>/<name>.pt``."""
    payload = {"format": FORMAT, "stage": stage, "name": name, "config": json.dumps(config or {}, sort_keys=True,
                                                                                   default=str),
               "metrics": dict(metrics or {}), "tensors": encode_value(dict(tensors), name)}
    return save_checkpoint(Path(folder) / f"{slug(name)}.pt", payload)


def save_stage_tensors(cfg, named: Mapping[str, tuple[Mapping[str, Any], Mapping | None]],
                       folder: str | Path | None = None) -> list[Path]:
    """A stage's named tensors, ``{name: (tensors, metrics)}``, each saved with :func:`save_tensors` and the
    stage's config in its models folder (``models_dir``), then its ``index.json``; returns the files."""
    folder, config = models_dir(cfg, folder), cfg.model_dump()
    written = [save_tensors(folder, cfg.stage, name, tensors, config=config, metrics=metrics)
               for name, (tensors, metrics) in named.items()]
    write_index(folder, cfg.stage, config)
    return written


def write_index(folder: str | Path, stage: str, config: Mapping | None = None) -> Path:
    """``index.json``: every saved file of the folder with its method/name, seed and round."""
    folder = Path(folder)
    entries = []
    for path in sorted(folder.glob("*.pt")):
        saved = load(path)
        entries.append({k: saved[k] for k in ("method", "name", "seed", "round", "data_digest") if k in saved}
                       | {"file": path.name})
    return write_json(folder / INDEX, {"format": FORMAT, "stage": stage, "files": entries,
                                       "config": json.loads(json.dumps(config or {}, default=str))})


def load(path: str | Path) -> dict:
    """A saved file's payload (weights-only load); CheckpointError when it is not one of ours."""
    saved = load_checkpoint(path)
    if not isinstance(saved, dict) or saved.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a pflkit model file (format {FORMAT})")
    return saved


def tensors(path: str | Path) -> dict:
    """The named tensors of a :func:`save_tensors` file."""
    return decode_value(load(path)["tensors"])


def restore(algorithm, data, saved: Mapping) -> Any:
    """The saved state put back into ``algorithm`` for ``data`` (the same federation: its digest is checked
    when the file recorded one)."""
    if saved.get("data_digest"):
        if data_digest(data) != saved["data_digest"]:
            raise CheckpointError(f"{saved.get('method')} seed {saved.get('seed')}: the data differs from the "
                                  "federation the model was trained on")
    template = algorithm.init(data, saved["seed"])
    return state_from_payload(template, saved["state"])


def saved_runs(folder: str | Path) -> dict[tuple[str, int], dict]:
    """Every :func:`save_state` file of a folder: (method, seed) -> payload."""
    out = {}
    for path in sorted(Path(folder).glob("*.pt")):
        saved = load(path)
        if "method" in saved:
            out[(saved["method"], saved["seed"])] = saved
    return out
