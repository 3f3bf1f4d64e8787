"""A compute stage's headline numbers: its DVC metrics, ``results/<stage>/headline.json``.

A few numbers per stage (final accuracy or loss per method, the stage's claim margins, the dataset that
ran and whether it is a substitute), picked from the stage's metrics.json by the ``headline`` entries of
its row in the stage table (:class:`pflkit.stages.Headline`), under the stage's name. The stage runner
writes the file after the notebook (:func:`pflkit.notebooks.run_stage`); dvc.yaml declares it under ``metrics:`` with
``cache: false``, so it is kept in git: a fresh clone's ``dvc metrics show`` shows the recorded run, and
``dvc metrics diff`` / ``dvc exp show --only-changed`` compare a new run with it.

    python -m pflkit.headline            rewrite every headline file from the results there are
    python -m pflkit.headline perm_fig1  one stage's

Imports nothing of pflkit but the stage table (the runner imports it, so every stage depends on it).
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from pathlib import Path

from . import stages as stage_table

#: significant digits kept (DVC shows 5)
DIGITS = 6


class HeadlineError(ValueError):
    """metrics.json cannot give a stage's headline: the message names the file and the stage to re-run."""


def _matches(node, key: str) -> list[tuple[str, object]]:
    if not isinstance(node, dict):
        return []
    if any(c in key for c in "*?["):
        return [(k, v) for k, v in node.items() if fnmatch.fnmatchcase(str(k), key)]
    return [(key, node[key])] if key in node else []


def _lookup(node, path: tuple[str, ...]):
    """The value at ``path`` (no glob), or a mapping matched key -> value (a glob; several globs: keys
    joined by '/'); None when nothing is there."""
    found: list[tuple[tuple[str, ...], object]] = [((), node)]
    for key in path:
        found = [((*keys, k) if any(c in key for c in "*?[") else keys, v)
                 for keys, n in found for k, v in _matches(n, key)]
    if not found:
        return None
    if not any(keys for keys, _ in found):
        return found[0][1]
    return {"/".join(keys): value for keys, value in found}


def _clean(value):
    """A number to DIGITS significant digits; bools and strings as they are; None for anything else."""
    if isinstance(value, bool) or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return float(f"{value:.{DIGITS}g}")
    return None


def headline(metrics: dict, entries) -> dict:
    """The flat headline of a stage's ``metrics`` (metrics.json): ``dataset`` and ``substitute`` when
    metrics.json names them, then each entry (:class:`pflkit.stages.Headline`) by its name: a value, a
    mapping of glob matches, or with ``reduce`` their max or min. An entry whose path is not there (a
    method that did not run, an engine not installed) is left out."""
    out: dict = {}
    if isinstance(metrics.get("dataset"), str):
        out["dataset"] = metrics["dataset"]
    if isinstance(metrics.get("is_substitute"), bool):
        out["substitute"] = metrics["is_substitute"]
    for entry in entries:
        value = _lookup(metrics, entry.path)
        if isinstance(value, dict):
            value = {k: _clean(v) for k, v in value.items() if _clean(v) is not None}
            if entry.reduce is not None:
                numbers = [v for v in value.values() if not isinstance(v, str)]
                if entry.reduce not in ("max", "min"):
                    raise ValueError(f"headline {entry.name}: reduce must be 'max' or 'min', not {entry.reduce!r}")
                value = (max if entry.reduce == "max" else min)(numbers) if numbers else None
        else:
            value = _clean(value)
        if value is not None and value != {}:
            out[entry.name] = value
    return out


def write_headline(stage: str, results_dir: Path) -> Path:
    """Write ``results_dir/headline.json`` from ``results_dir/metrics.json`` for compute stage ``stage``
    (the one function that writes a headline file; the stage runner and ``python -m pflkit.headline`` call
    it). :class:`HeadlineError` when metrics.json is missing or not a JSON object."""
    row = stage_table.get(stage)
    if row is None or row.is_plot:
        raise HeadlineError(f"{stage}: not a compute stage; the compute stages are: "
                            + ", ".join(s.name for s in stage_table.compute_stages()))
    source = Path(results_dir) / "metrics.json"
    try:
        metrics = json.loads(source.read_text())
    except (OSError, ValueError) as exc:
        raise HeadlineError(f"{source}: cannot read the stage's metrics ({exc.__class__.__name__}: {exc}); "
                            f"written by stage {stage}: run `dvc repro {stage}`") from None
    if not isinstance(metrics, dict):
        raise HeadlineError(f"{source}: not a JSON object; written by stage {stage}: run `dvc repro {stage}`")
    target = Path(results_dir) / stage_table.HEADLINE_FILE
    # under the stage's name: every metric's name is then unique across the stages, which `dvc exp show` shows
    # without the file's path (perm_fig1.accuracy.PERM, not results/perm_fig1/headline.json:accuracy.PERM)
    target.write_text(json.dumps({stage: headline(metrics, row.headline)}, indent=1, sort_keys=True) + "\n")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pflkit.headline", description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", help="compute stages (default: every one with a metrics.json)")
    parser.add_argument("--results", type=Path, default=Path("results"), help="the results folder (default: results)")
    args = parser.parse_args(argv)
    names = args.stages or [s.name for s in stage_table.compute_stages()]
    written = 0
    for name in names:
        folder = args.results / name
        if not args.stages and not (folder / "metrics.json").is_file():
            print(f"{name}: not run (no {folder / 'metrics.json'})", file=sys.stderr)
            continue
        try:
            print(write_headline(name, folder))
        except HeadlineError as exc:
            print(exc, file=sys.stderr)
            return 1
        written += 1
    print(f"{written} headline file(s) written", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
