"""``python -m pflkit reproduce --profile <name>``: every stage under a params.yaml profile.

``dvc repro`` runs the default profile (the sections as written) and caches its outputs. A profile with a
pipeline of its own (``pflkit.stages.PIPELINE_PROFILES``: ``paper``, the papers' own settings) is run by
DVC too: ``dvc repro pipelines/<profile>/dvc.yaml`` (or its chosen stages), cached per stage, its outputs
under build/<profile>/, then its ledger stage. Any other profile runs the same notebooks with that
profile's values, in pipeline order, outside DVC, writing under build/<profile>/ (``stages.profile_path``),
so it never touches what DVC produced; then its claims ledger (``scripts/claims.py --profiles
default,<profile> --out build/<profile>``). Either way every stage is validated before the first one
starts. Each stage's wall time goes to build/runtimes.csv (``notebooks.record_runtime``), from which
``scripts/stage_runtimes.py`` writes README's runtime table.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import stages as table
from .config import DEFAULT_PROFILE, ConfigError, load_params, validate_stage
from .notebooks import StageError, run_stage
from .paths import project_root


def chosen_stages(stages: list[str] | None) -> list[str]:
    """``stages`` (default: every stage of the stage table), or a ConfigError naming the unknown ones."""
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
    if profile == DEFAULT_PROFILE:
        raise ConfigError("profile: the default profile is what `dvc repro` runs (and caches); "
                          "name another profile of params.yaml, e.g. paper")
    root = project_root()
    names = [s.name for s in table.STAGES]
    chosen = chosen_stages(stages)
    validate_stages(load_params(root / params_file), chosen, profile)
    if profile in table.PIPELINE_PROFILES:
        return repro_pipeline(profile, stages, root, params_file)
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
              "--out", f"build/{profile}", "--params", str(root / params_file)]
    return subprocess.call(ledger, cwd=root)


def repro_pipeline(profile: str, stages: list[str] | None, root, params_file: str = "params.yaml") -> int:
    """``dvc repro`` of ``profile``'s own pipeline: the chosen stages (and what they need that changed), or all
    of it; then its ledger stage, which reads whatever results exist (it depends on none of them, so DVC would
    not order it last). DVC reads params.yaml: another ``params_file`` cannot be used here."""
    if params_file != "params.yaml":
        raise ConfigError(f"params_file: the {profile} profile runs as a DVC pipeline, which reads params.yaml "
                          f"(got {params_file})")
    file = table.pipeline_file(profile)
    dvc = shutil.which("dvc") or str(Path(sys.executable).with_name("dvc"))
    for targets in ([f"{file}:{name}" for name in stages] if stages else [file], [f"{file}:claims"]):
        print("dvc repro " + " ".join(targets), file=sys.stderr, flush=True)
        code = subprocess.call([dvc, "repro", *targets], cwd=root)
        if code != 0:
            return code
    return 0
