"""What `dvc repro` would do, per pipeline, in a few lines: the status a user reads after a run or a pull.

    python scripts/pipeline_status.py          (make status)
    python scripts/pipeline_status.py --check  exit 1 when a stage would re-run because its code or params changed

Plain ``dvc status`` reports every stage of every pipeline file whose outputs are not in this workspace as a
change: on a fresh clone, or after ``make reproduce``, that is each output of the paper pipeline
(pipelines/paper/dvc.yaml) that ran on another machine (hundreds of "not in cache" lines), and after a partial run
every stage that did not run. This reads the same ``dvc status --json`` and sorts each stage into one of:

* up to date: nothing would re-run;
* changed: its command, code or params differ from what dvc.lock recorded, or an output differs from it
  (``dvc repro`` re-runs it);
* not run here: dvc.lock records a run (here or on another machine) whose outputs are not in this workspace
  (``dvc pull`` brings them from the team's remote, ``dvc repro <stage>`` makes them);
* never run: no run recorded (a paper stage that needs a GPU).

One line per pipeline and kind, stage names shortened past a few. Exit 0 (``--check``: 1 when any stage is
"changed").
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_dvc_lock import (ROOT, is_produced, never_run, pipeline_files, stage_key,  # noqa: E402
                            stage_outputs, stale_stages)

KINDS = ("up to date", "changed", "not run here", "never run")
SHOWN = 6  # stage names per line before "..."


def classify(status: dict, stages: list[str], produced: set[str], unrun: set[str]) -> dict[str, str]:
    """stage -> one of ``KINDS``, from ``dvc status --json`` (``status``) over ``stages`` (every stage key)."""
    stale = stale_stages(status, produced, unrun)
    kinds = {}
    for stage in stages:
        if stage in unrun:
            kinds[stage] = "never run"
        elif stage in stale:
            kinds[stage] = "changed"
        elif not [e for e in _entries(status.get(stage, [])) if e != "always changed"]:
            kinds[stage] = "up to date"  # a stage declared always changed (a profile's ledger) is so by design
        else:
            kinds[stage] = "changed" if _outputs_differ(status[stage], produced) else "not run here"
    return kinds


def _outputs_differ(entries, produced: set[str]) -> bool:
    """An output (or a dependency another stage produced) present but different from dvc.lock's record: a change,
    unlike an output that is simply absent here (deleted, not in cache)."""
    for entry in _entries(entries):
        if isinstance(entry, str):
            continue
        for kind, changes in entry.items():
            if kind == "changed outs" and isinstance(changes, dict):
                if any(v not in ("deleted", "not in cache") for v in changes.values()):
                    return True
            elif kind == "changed deps" and isinstance(changes, dict):
                if any(is_produced(k, produced) and v not in ("deleted", "not in cache") for k, v in changes.items()):
                    return True
    return False


def _entries(entries) -> list:
    return entries if isinstance(entries, list) else [entries]


def summary(kinds: dict[str, str], files: dict[str, str]) -> list[str]:
    """The lines to print: per pipeline file (``files``: stage -> its file), a count per kind with the names."""
    lines = []
    for file in dict.fromkeys(files.values()):
        mine = {s: k for s, k in kinds.items() if files[s] == file}
        counts = ", ".join(f"{sum(k == kind for k in mine.values())} {kind}" for kind in KINDS
                           if any(k == kind for k in mine.values()))
        lines.append(f"{file}: {len(mine)} stages: {counts}")
        for kind, hint in (("changed", "`dvc repro` re-runs them"),
                           ("not run here", "outputs recorded in dvc.lock, not in this workspace: `dvc pull` or "
                                        "`dvc repro`"),
                           ("never run", "no run recorded")):
            names = [s.split(":")[-1] for s, k in mine.items() if k == kind]
            if names:
                shown = ", ".join(names[:SHOWN]) + (f", ... ({len(names) - SHOWN} more)" if len(names) > SHOWN else "")
                lines.append(f"  {kind} ({hint}): {shown}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 when a stage's code or params changed")
    a = p.parse_args(argv)
    import yaml
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    out = subprocess.run([dvc, "status", "--json"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"dvc status failed:\n{out.stderr}", file=sys.stderr)
        return 2
    files = {}
    for f in pipeline_files():
        rel = f.relative_to(ROOT).as_posix()
        for s in (yaml.safe_load(f.read_text()) or {}).get("stages", {}):
            files[stage_key(f, s)] = rel
    kinds = classify(json.loads(out.stdout or "{}"), list(files), stage_outputs(), never_run())
    print("\n".join(summary(kinds, files)))
    return 1 if a.check and "changed" in kinds.values() else 0


if __name__ == "__main__":
    sys.exit(main())
