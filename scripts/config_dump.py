"""Every stage's validated config under every profile, as JSON: to show that a refactor of the config classes or
of params.yaml changes no value a stage runs with (issue 27).

    python scripts/config_dump.py > before.json          (on the old tree)
    python scripts/config_dump.py --compare before.json  (on the new one: exit 1 on any changed value)

One entry per (profile, stage): ``config.validate_stage(params, stage, profile, machine=False).model_dump()``
for every stage ``config._validated_stages`` lists (each compute stage, one plot stage), under the default
profile and every profile params.yaml defines. ``--compare`` reports every value that differs, every entry or
key that went away, and every key that is new (a setting that was a class constant or a literal in code: listed,
and the exit status is 0 only when every line is such a new key).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def dump(params_file: str | Path = ROOT / "params.yaml") -> dict[str, dict]:
    """{"<profile>/<stage>": the stage's validated values} for every stage and profile."""
    from pflkit.config import _validated_stages, load_params, profile_names, validate_stage
    params = load_params(params_file)
    return {f"{profile}/{stage}": validate_stage(params, stage, profile, machine=False).model_dump(mode="json")
            for profile in profile_names(params) for stage in _validated_stages(params)}


def differences(old: dict, new: dict, path: str = "") -> list[str]:
    """Every changed, missing or new value between two dumps (nested mappings compared key by key)."""
    out = []
    for key in sorted(set(old) | set(new), key=str):
        where = f"{path}{key}"
        if key not in new:
            out.append(f"removed  {where} (was {old[key]!r})")
        elif key not in old:
            out.append(f"new      {where} = {new[key]!r}")
        elif isinstance(old[key], dict) and isinstance(new[key], dict):
            out += differences(old[key], new[key], f"{where}.")
        elif old[key] != new[key] or type(old[key]) is not type(new[key]):
            out.append(f"changed  {where}: {old[key]!r} -> {new[key]!r}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default=str(ROOT / "params.yaml"))
    parser.add_argument("--compare", metavar="BEFORE_JSON", help="compare with an earlier dump")
    args = parser.parse_args(argv)
    now = dump(args.params)
    if not args.compare:
        json.dump(now, sys.stdout, indent=1, sort_keys=True)
        print()
        return 0
    lines = differences(json.loads(Path(args.compare).read_text()), now)
    print("\n".join(lines) if lines else f"identical: {len(now)} validated configs (profile/stage)")
    return 1 if any(not line.startswith("new ") for line in lines) else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    sys.exit(main())
