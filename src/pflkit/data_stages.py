"""The data stages (``python -m pflkit data <key>``, declared in ``pflkit.stages.DATA_STAGES``): one dataset
prepared under data/prepared/ (``pflkit.data.prepared``) with params.yaml's values, validated here first."""
from __future__ import annotations

from pathlib import Path

from .config import data_section_problems, source_settings, validate_stage
from .data import prepared
from .paths import project_root
from .stages import DATA_BY_KEY


def prepare(key: str, params: dict, root: Path | None = None) -> list[Path]:
    """Run data stage ``key`` with params.yaml's values; returns the folders written."""
    if key not in DATA_BY_KEY:
        raise ValueError(f"data stage {key!r} does not exist; allowed: {', '.join(DATA_BY_KEY)}")
    problems = data_section_problems(params.get("data") or {})
    if problems:
        raise ValueError("\n".join(problems))
    root = Path(root or project_root()).resolve()
    spec = DATA_BY_KEY[key]
    # where it writes, checked before any work: a symbolic link or a read-only folder is named, nothing is done
    outs = ([root / out for stage, out in zip(spec.params, spec.out_paths) if stage in params]
            if key == "perm_synthetic" else [root / out for out in spec.out_paths])
    problems = [f"{out.relative_to(root)}: {why}" for out in outs if (why := prepared.output_problem(out, root))]
    if problems:
        raise prepared.PrepareWriteError(f"cannot write {'; '.join(problems)} (nothing was prepared)")
    for out in outs:  # what a killed run of this stage left beside its folders goes now, before any work
        prepared.remove_leftovers(out)
    if key == "perm_synthetic":
        written = []
        for stage, out in zip(spec.params, spec.out_paths):
            if stage not in params:  # a project without that stage (a scratch copy): nothing to prepare for it
                continue
            cfg = validate_stage(params, stage)
            written.append(prepared.prepare_synthetic(cfg.synthetic_requests(), root / out))
        return written
    settings = source_settings(params, key)
    if key == "shakespeare":
        return [prepared.prepare_shakespeare(root / spec.out_paths[0], root, source_root=settings.root,
                                             source=settings.source, test_fraction=settings.test_fraction)]
    return [prepared.prepare_images(spec.dataset, root / spec.out_paths[0], root, source_root=settings.root,
                                    allow_download=settings.allow_download)]
