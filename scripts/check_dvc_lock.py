"""dvc.lock records what produced the results: fail when it no longer matches the tree.

    python scripts/check_dvc_lock.py        (make check-lock; .ci/run runs it)

Runs ``dvc status --json`` and reports every stage whose recorded command, dependencies (the notebook
twin, the src/pflkit files it imports) or params differ from the tree, in dvc.yaml and in every profile's
pipeline (pipelines/<profile>/dvc.yaml, with its own dvc.lock). Outputs are not checked, nor dependencies that
are another stage's outputs (a fresh clone has none: they live in DVC's cache). A profile pipeline's stage that
has never run (no entry in its dvc.lock: the paper profile's long stages need a GPU) is allowed and counted.
The fix: re-run the affected stages (``dvc repro``, ``dvc repro pipelines/<profile>/dvc.yaml:<stage>``) and
commit the dvc.lock with the change that caused it.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pipeline_files(root: Path = ROOT) -> list[Path]:
    """dvc.yaml, then each profile pipeline's (pipelines/<profile>/dvc.yaml)."""
    return [root / "dvc.yaml", *sorted((root / "pipelines").glob("*/dvc.yaml"))]


def stage_key(dvc_yaml: Path, stage: str, root: Path = ROOT) -> str:
    """``dvc status``'s name of a stage: bare in dvc.yaml, ``<file>:<stage>`` in another pipeline file."""
    rel = dvc_yaml.relative_to(root).as_posix()
    return stage if rel == "dvc.yaml" else f"{rel}:{stage}"


def never_run(root: Path = ROOT) -> set[str]:
    """Stages of the profile pipelines with no entry in their dvc.lock (``stage_key`` names)."""
    import yaml
    keys = set()
    for dvc_yaml in pipeline_files(root)[1:]:
        lock = dvc_yaml.with_name("dvc.lock")
        locked = set(((yaml.safe_load(lock.read_text()) if lock.exists() else None) or {}).get("stages", {}))
        keys |= {stage_key(dvc_yaml, s, root)
                 for s in (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {}) if s not in locked}
    return keys


def stage_outputs(dvc_yamls: list[Path] | None = None) -> set[str]:
    """Every path a stage declares as an output (outs, metrics, plots), in every pipeline file (each run from
    the project root)."""
    import yaml
    paths = set()
    specs = [spec for f in (dvc_yamls or pipeline_files())
             for spec in ((yaml.safe_load(f.read_text()) or {}).get("stages", {}) or {}).values()]
    for spec in specs:
        for key in ("outs", "metrics", "plots"):
            for entry in spec.get(key, []) or []:
                paths.add(entry if isinstance(entry, str) else next(iter(entry)))
    return paths


def is_produced(path: str, produced: set[str]) -> bool:
    """``path`` is a stage's output, or inside an output folder (models/perm_fig4/alpha.npz in models/perm_fig4)."""
    return any(path == out or path.startswith(out.rstrip("/") + "/") for out in produced)


def stale_stages(status: dict, produced: set[str] = frozenset(), unrun: set[str] = frozenset()) -> dict[str, list[str]]:
    """stage -> what changed (deps, params, command), from ``dvc status --json``. Outputs are ignored,
    and so are dependencies that another stage ``produced`` (in DVC's cache, absent from a fresh
    clone, not code), and the profile pipelines' stages that never ran (``unrun``)."""
    stale = {}
    for stage, entries in status.items():
        if stage in unrun:
            continue
        what = []
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, str):  # "changed checksum", "always changed"
                if entry != "always changed":  # a stage declared so (a profile's ledger) re-runs by design
                    what.append(entry)
                continue
            for kind, changes in entry.items():
                if kind == "changed outs":
                    continue
                if isinstance(changes, dict):
                    what += [f"{kind}: {k} ({v if isinstance(v, str) else ', '.join(f'{p} {s}' for p, s in v.items())})"
                             for k, v in changes.items() if not (kind == "changed deps" and is_produced(k, produced))]
                else:
                    what.append(f"{kind}: {changes}")
        if what:
            stale[stage] = what
    return stale


def main() -> int:
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    out = subprocess.run([dvc, "status", "--json"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"dvc status failed:\n{out.stderr}", file=sys.stderr)
        return 2
    unrun = never_run()
    stale = stale_stages(json.loads(out.stdout or "{}"), stage_outputs(), unrun)
    if stale:
        print("dvc.lock is out of date with the tree: these stages' recorded code or params differ "
              "(run `dvc repro` and commit dvc.lock):", file=sys.stderr)
        for stage, what in stale.items():
            print(f"  {stage}: " + "; ".join(what), file=sys.stderr)
        return 1
    print("dvc.lock matches the tree: every stage's command, code and params are the ones recorded"
          + (f" ({len(unrun)} profile-pipeline stages have never run: {', '.join(sorted(unrun)[:4])}"
             f"{', ...' if len(unrun) > 4 else ''})" if unrun else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
