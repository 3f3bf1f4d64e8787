"""``python -m pflkit reproduce --profile <name>``: every stage under a params.yaml profile, outside DVC.

``dvc repro`` runs the default profile (the sections as written) and caches its outputs. Another profile
(``paper``: the papers' own settings) runs the same notebooks with that profile's values, in pipeline
order, writing under build/<profile>/ (``notebooks.profile_path``), so it never touches what DVC
produced; then its claims ledger (``scripts/claims.py --profiles default,<profile> --out
build/<profile>``). Every stage is validated before the first one starts. Each stage's wall time goes
to build/runtimes.csv (``notebooks.record_runtime``), from which ``scripts/stage_runtimes.py`` writes
README's runtime table.
"""
from __future__ import annotations

import subprocess
import sys
import time

from .config import DEFAULT_PROFILE, ConfigError, load_params, validate_stage
from .paths import project_root


def chosen_stages(stages: list[str] | None) -> list[str]:
    """``stages`` (default: every stage of the stage table), or a ConfigError naming the unknown ones."""
    from . import stages as table

    names = [s.name for s in table.STAGES]
    chosen = stages or names
    unknown = [s for s in chosen if s not in names]
    if unknown:
        raise ConfigError(f"stages: unknown {unknown}; allowed: {', '.join(names)}")
    return chosen


def validate_stages(params, names: list[str], profile: str) -> dict:
    """{stage: its config} under ``profile``, or one ConfigError listing every stage's problems (bad input fails
    before any work)."""
    configs, problems = {}, []
    for name in names:
        try:
            configs[name] = validate_stage(params, name, profile)
        except (ConfigError, ValueError) as exc:
            problems.append(f"{name}: {exc}")
    if problems:
        raise ConfigError("\n".join(problems))
    return configs


def reproduce(profile: str, stages: list[str] | None = None, params_file: str = "params.yaml") -> int:
    from . import stages as table
    from .notebooks import StageError, run_stage

    if profile == DEFAULT_PROFILE:
        raise ConfigError("profile: the default profile is what `dvc repro` runs (and caches); "
                          "name another profile of params.yaml, e.g. paper")
    root = project_root()
    names = [s.name for s in table.STAGES]
    chosen = chosen_stages(stages)
    validate_stages(load_params(root / params_file), chosen, profile)
    start = time.monotonic()
    for i, name in enumerate(n for n in names if n in chosen):
        print(f"[{i + 1}/{len(chosen)}] {name} (profile {profile})", file=sys.stderr, flush=True)
        try:
            run_stage(name, table.get(name).ipynb, params_file, profile)
        except StageError as exc:
            print(exc, file=sys.stderr)
            return 1
    print(f"profile {profile}: {len(chosen)} stages in {time.monotonic() - start:.0f} s", file=sys.stderr)
    ledger = [sys.executable, str(root / "scripts" / "claims.py"), "--profiles", f"{DEFAULT_PROFILE},{profile}",
              "--out", f"build/{profile}"]
    return subprocess.call(ledger, cwd=root)
