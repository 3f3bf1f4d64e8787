"""What README's commands cost on this machine: wall time, peak memory of the whole process tree, and for
the set-up the size of what it installs (issue 30: "set-up time and size measured", "README gives each
Flower command's time and memory").

    python benchmarks/commands.py [--only setup,flower_simulate] [--out benchmarks/results]

Each command runs as README shows it, from this checkout, one after the other (run it on a quiet machine):

* ``setup``: ``make setup`` into a new virtual environment (``VENV=<temp>/.venv``) with pip's cache off, so
  every package is downloaded as on a fresh machine; size: the environment's folder;
* ``flower_extra``: then ``make flower`` into that environment (Flower and Ray); size: what it adds;
* ``test`` / ``test_fast``: ``make test`` (README's test command: lint, notebooks, unit and integration tests,
  both cores) / ``make test-fast`` (lint and the fast unit tests), in this checkout's .venv;
* ``flower_simulate`` / ``flower_deploy``: ``python -m pflkit.flower simulate|deploy --profile smoke``;
* ``dvc_status``: a no-op ``dvc status`` (run it when the pipeline is up to date; DVC parses params.yaml once
  per stage with params, with ruamel.yaml's C parser from the dev extra).

Writes ``<out>/commands.json`` and ``<out>/commands.md`` (README's block) and prints the table; with
``--only``, the other commands' rows already in ``commands.json`` are kept.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark modules
from process_tree import run_sampled  # noqa: E402  (one way to measure a process tree's memory)
from speed import machine_info  # noqa: E402  (one description of the machine for every benchmark)

from pflkit.io import write_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {  # key: (what README shows, the command run here; {venv} is the fresh environment)
    "setup": ("make setup", ["make", "setup", "VENV={venv}"]),
    "flower_extra": ("make flower", ["make", "flower", "VENV={venv}"]),
    "test": ("make test", ["make", "test"]),
    "test_fast": ("make test-fast", ["make", "test-fast"]),
    "flower_simulate": ("python -m pflkit.flower simulate --profile smoke",
                        [sys.executable, "-m", "pflkit.flower", "simulate", "--profile", "smoke"]),
    "flower_deploy": ("python -m pflkit.flower deploy --profile smoke",
                      [sys.executable, "-m", "pflkit.flower", "deploy", "--profile", "smoke"]),
    "dvc_status": ("dvc status (nothing to do)", [str(Path(sys.executable).parent / "dvc"), "status"]),
}


def folder_mb(path: Path) -> float:
    """Disk use of ``path`` (``du``: blocks actually used, hard links once)."""
    out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0]) / 1024


def measure(keys: list[str], venv: Path) -> list[dict]:
    rows, size_before = [], 0.0
    env = {**os.environ, "PIP_NO_CACHE_DIR": "1", "OMP_NUM_THREADS": "1"}
    for key in keys:
        shown, cmd = COMMANDS[key]
        print(f"{shown} ...", flush=True)
        run = run_sampled([c.format(venv=venv) for c in cmd], cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
        if run["returncode"] != 0:
            raise RuntimeError(f"{shown} failed (exit {run['returncode']})")
        row = {"key": key, "command": shown, **run}
        if key in ("setup", "flower_extra"):
            size = folder_mb(venv)
            row["installed_mb"] = size - size_before
            size_before = size
        rows.append(row)
    return rows


def markdown(res: dict) -> str:
    def cpu(row: dict) -> str:  # the machine a row was measured on (older files: the file's one machine)
        return row.get("cpu") or res["machine"].get("cpu", "this machine")

    cpus = list(dict.fromkeys(cpu(r) for r in res["rows"]))
    where = cpus[0] if len(cpus) == 1 else "the machine each row names (rows re-measured with --only)"
    lines = [f"Measured on {where}, {os.cpu_count()} cores, by `python benchmarks/commands.py` "
             f"(load average at the end: {res['load_average_end'][0]:.1f}).", "",
             "| command | wall time | peak memory (process tree) | disk |" + (" machine |" if len(cpus) > 1 else ""),
             "|---|---:|---:|---:|" + ("---|" if len(cpus) > 1 else "")]
    for r in res["rows"]:
        disk = f"{r['installed_mb'] / 1024:.1f} GB" if "installed_mb" in r else ""
        wall = f"{r['wall_seconds']:.1f} s" if r["wall_seconds"] < 60 else f"{r['wall_seconds'] / 60:.1f} min"
        machine = f" {cpu(r)} |" if len(cpus) > 1 else ""
        lines.append(f"| `{r['command']}` | {wall} | {r['peak_rss_mb'] / 1024:.1f} GB | {disk} |{machine}")
    lines += ["", "Set-up downloads every package (pip's cache off), as on a fresh machine; `make flower` after "
              "`make setup` adds Flower and Ray. Peak memory: the sum of the resident memory of the command and all "
              "its descendants, sampled every 0.25 s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default=",".join(COMMANDS), help=f"comma-separated, from {list(COMMANDS)}")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args(argv)
    keys = args.only.split(",")
    bad = [k for k in keys if k not in COMMANDS]
    if bad:
        parser.error(f"--only must name commands from {list(COMMANDS)}, got {bad}")
    if "flower_extra" in keys and "setup" not in keys:
        parser.error("--only flower_extra needs setup before it (it installs into the fresh environment)")
    import torch

    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="pflkit-commands-") as tmp:
        rows = measure(keys, Path(tmp) / ".venv")
    machine = machine_info(torch.device("cpu"))
    previous = json.loads((out / "commands.json").read_text()) if (out / "commands.json").exists() else {"rows": []}
    old = [{"cpu": previous.get("machine", {}).get("cpu"), **r} for r in previous["rows"]]  # each row keeps its machine
    measured = {r["key"]: {**r, "cpu": machine.get("cpu")} for r in rows}
    rows = [measured.pop(r["key"], r) for r in old if r["key"] in COMMANDS] + list(measured.values())
    res = {"machine": machine, "rows": rows, "load_average_end": list(os.getloadavg())}
    text = markdown(res)
    write_report(out, "commands", res, text)
    print(text)
    return res


if __name__ == "__main__":
    main()
