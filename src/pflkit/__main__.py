"""Command line: ``python -m pflkit {data,stage,reproduce,validate,tune,notebooks} ...``."""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path, PurePosixPath

from . import stages as stage_table  # imports nothing else: unknown names are refused at once
from .paths import project_root


EXAMPLES = {
    "data": "python -m pflkit data fashion_mnist",
    "stage": "python -m pflkit stage perm_fig1                  (the notebook is the stage table's)\n"
             "  python -m pflkit stage perm_fig1 --profile smoke  (outputs under build/smoke/)",
    "reproduce": "python -m pflkit reproduce --profile smoke --stages perm_fig1,perm_fig1_plot\n"
                 "  python -m pflkit reproduce --profile paper --canary --short   (minutes: every stage cut short)",
    "validate": "python -m pflkit validate",
    "tune": "python -m pflkit tune perm_fig1 --grid 0.1,0.5,1.0 --profile smoke",
    "notebooks": "python -m pflkit notebooks check",
}


def unknown_stage(name: str, known) -> str | None:
    """None when ``name`` is a stage of ``known``; else the message, with the closest names."""
    known = sorted(known)
    if name in known:
        return None
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else f"stages: {', '.join(known)}"
    return f"unknown stage {name!r}; {hint}"


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per entry of ``COMMANDS``."""
    parser = argparse.ArgumentParser(prog="pflkit", description=__doc__,
                                     epilog="examples:\n  " + "\n  ".join(EXAMPLES.values()),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, help: str):
        return sub.add_parser(name, help=help, description=help, epilog=f"example:\n  {EXAMPLES[name]}",
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    p = add("data", help="prepare one dataset under data/prepared/ (what dvc.yaml's data stages call)")
    p.add_argument("key", help="a data stage key: fashion_mnist, mnist, cifar10, emnist, femnist, cifar100, "
                               "shakespeare, perm_synthetic")
    p.add_argument("--params", default="params.yaml")

    p = add("stage", help="run one notebook stage at params.yaml scale (what dvc.yaml calls)")
    p.add_argument("stage", help="a notebook stage of pflkit.stages (dvc.yaml's names)")
    p.add_argument("notebook", nargs="?", default=None,
                   help="its notebook (default: the one the stage table names; dvc.yaml passes it)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", default="default", help="params.yaml profile (default: the sections as written, "
                                                          "what dvc.yaml runs; another writes under build/<profile>/)")

    p = add("reproduce", help="run every stage (in pipeline order) under a params.yaml profile, outputs "
                                         "under build/<profile>/, then its claims ledger; `dvc repro` runs the "
                                         "default profile; the paper profile is `dvc repro "
                                         "pipelines/paper/dvc.yaml` (cached per stage)")
    p.add_argument("--profile", required=True)
    p.add_argument("--stages", default=None, help="comma-separated stage names (default: all)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--canary", action="store_true",
                   help="run every stage cut short (first rounds, one seed, every method, each grid's extremes) "
                        "and fail on divergence, memory above budget or any error; outputs under "
                        "build/canary/<profile>/ (pflkit.canary); works for the default profile too")
    p.add_argument("--canary-rounds", type=int, default=None,
                   help="with --canary: rounds of every stage (default: 25 for curve stages, at least past a PERM "
                        "warm-up and its first alpha update; 3 per Charles et al. grid task)")
    p.add_argument("--short", action="store_true",
                   help="with --canary: the short form (1 round unless --canary-rounds, no plot stages): minutes")
    p.add_argument("--max-clients", type=int, default=None,
                   help="with --canary: at most this many clients in a PERM image federation (default: the "
                        "profile's own; fewer clients can hide a divergence)")

    p = add("validate", help="check every section of params.yaml, and that every stage of dvc.yaml "
                                        "has a valid section; run nothing")
    p.add_argument("params", nargs="?", default="params.yaml")
    p.add_argument("--dvc", default=None, help="the dvc.yaml whose stages need sections "
                                               "(default: dvc.yaml beside the params file, if there is one)")

    p = add("tune", help="learning-rate sweep of every method of a curve stage (same round budget)")
    p.add_argument("stage")
    p.add_argument("--grid", default="0.01,0.02,0.05,0.1,0.2,0.5,1.0")
    p.add_argument("--methods", default=None, help="comma-separated method keys (default: the stage's)")
    p.add_argument("--seeds", default="0")
    p.add_argument("--rounds", type=int, default=None,
                   help="tune over the stage's first ROUNDS rounds (a tuning window; default: its whole budget)")
    p.add_argument("--jobs", type=int, default=1,
                   help="cells (method x lr) run in this many worker processes, e.g. several on one GPU")
    p.add_argument("--out", default=None,
                   help="the table's CSV (default: results/tuning/<stage>.csv; another profile's: "
                        "build/<profile>/tuning/<stage>.csv)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", default="default", help="params.yaml profile of the stage's values "
                                                          "(default: the section as written; smoke: a quick try)")

    p = add("notebooks", help="notebook twins: refresh (py -> executed ipynb) or check")
    p.add_argument("action", choices=["refresh", "check"])
    p.add_argument("paths", nargs="*", help="py:percent twins to refresh (default: all)")

    return parser


def refused_name(args) -> int | None:
    """The exit status when ``args`` names a stage the command does not know (said on stderr), else None."""
    named = {"stage": [args.stage] if args.command == "stage" else [],
             "tune": [args.stage] if args.command == "tune" else [],
             "reproduce": (args.stages.split(",") if args.stages else []) if args.command == "reproduce" else []}
    known = {"tune": stage_table.tunable()}.get(args.command, [s.name for s in stage_table.STAGES])
    for name in named.get(args.command, []):
        if args.command == "tune" and stage_table.get(name) is not None and name not in known:
            print(f"tune: cannot tune stage {name!r} (it has no learning-rate sweep); stages it can tune: "
                  f"{', '.join(known)}", file=sys.stderr)
            return 1
        why = unknown_stage(name, known)
        if why:
            print(f"{args.command}: {why}", file=sys.stderr)
            return 2
    return None


def run_data(args) -> int:
    from .config import load_params
    from .data.prepared import PrepareWriteError, describe
    from .data_stages import prepare
    try:
        for folder in prepare(args.key, load_params(args.params)):
            print(describe(folder))
    except (ValueError, PrepareWriteError) as exc:
        print(f"data {args.key}: {exc}", file=sys.stderr)
        return 1
    return 0


def run_stage_command(args) -> int:
    from papermill.exceptions import PapermillExecutionError

    from .notebooks import StageError, run_stage
    notebook = args.notebook or str(PurePosixPath(stage_table.get(args.stage).notebook).with_suffix(".ipynb"))
    try:
        report = run_stage(args.stage, notebook, args.params, args.profile)
    except StageError as exc:  # a path and a reason: no traceback
        print(exc, file=sys.stderr)
        return 1
    except PapermillExecutionError as exc:  # a cell raised: its error in one line (the run said where
        # the executed notebook, with the whole traceback, is kept)
        from .config import clip_line
        print(clip_line(f"stage {args.stage} failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}"),
              file=sys.stderr)
        return 1
    print(f"{args.stage}: wrote {report}")
    return 0


def run_reproduce(args) -> int:
    from .config import ConfigError
    if args.canary:
        from .canary import MAX_CLIENTS, run_canary
        if args.max_clients is not None and args.max_clients < 1:
            raise ConfigError(f"max-clients: must be an integer >= 1, got {args.max_clients}")
        return run_canary(args.profile, args.stages.split(",") if args.stages else None, args.params,
                          rounds=args.canary_rounds, short=args.short,
                          max_clients=args.max_clients if args.max_clients else MAX_CLIENTS)
    extra = [f"--{k.replace('_', '-')}" for k in ("canary_rounds", "short", "max_clients")
             if getattr(args, k) not in (None, False)]
    if extra:
        raise ConfigError(f"{', '.join(extra)}: only with --canary")
    from .reproduce import reproduce
    return reproduce(args.profile, args.stages.split(",") if args.stages else None, args.params)


def run_tune(args) -> int:
    from .config import ConfigError, load_params, validate_stage
    from .io import write_csv
    if args.jobs < 1:
        raise ConfigError(f"--jobs must be at least 1, got {args.jobs}")
    entry = stage_table.get(args.stage)
    cfg = validate_stage(load_params(args.params), args.stage, args.profile)
    lr_sweep = stage_table.resolve(entry.tune)  # the stage's sweep, e.g. pflkit.experiments.perm:lr_sweep
    table = lr_sweep(cfg, [float(x) for x in args.grid.split(",")],
                     methods=args.methods.split(",") if args.methods else None,
                     seeds=[int(x) for x in args.seeds.split(",")], rounds=args.rounds, jobs=args.jobs,
                     show_progress=True)
    folder = "results/tuning" if args.profile == "default" else f"build/{args.profile}/tuning"
    out = write_csv(args.out or f"{folder}/{args.stage}.csv", table)
    print(table.round(4).to_string(index=False))
    print(f"wrote {out}")
    return 0


def run_validate(args) -> int:
    from .config import load_dvc_stages, load_params, validate_all
    params = load_params(args.params)
    dvc = Path(args.dvc) if args.dvc else Path(args.params).parent / "dvc.yaml"
    stages = load_dvc_stages(dvc) if args.dvc or dvc.exists() else None
    problems = validate_all(params, stages)
    if problems:
        print(f"invalid configuration in {args.params}:", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return 1
    if stages is None:
        print(f"{args.params}: every section is valid (no dvc.yaml beside it: not checked that every "
              "stage has a section; pass --dvc)")
    else:
        print(f"{args.params}: every section is valid, and every stage of {dvc} has one")
    return 0


def run_notebooks(args) -> int:
    from .notebooks import check_twins, refresh
    if args.action == "check":
        problems = check_twins()
        print("\n".join(problems) or "every notebook matches its py:percent twin")
        return 1 if problems else 0
    paths = args.paths or sorted(str(p) for p in (project_root() / "notebooks").rglob("*.py"))
    for path in paths:
        print(f"refreshed {refresh(Path(path))}")
    return 0


#: subcommand -> what runs it (each imports what it needs, so ``--help`` and a refused name cost no torch)
COMMANDS = {"data": run_data, "stage": run_stage_command, "reproduce": run_reproduce, "tune": run_tune,
            "validate": run_validate, "notebooks": run_notebooks}


def hide_slow_optional_modules() -> None:
    """Make ``rfc3987_syntax`` unimportable in this process. jsonschema (under nbformat and papermill) imports it
    when installed (jupyter-events' ``jsonschema[format-nongpl]`` installs it) for its "iri" string format, and
    its import builds 39 Earley parsers, a second of every stage command (docs/benchmarks.md), for a format that
    no notebook schema uses. jsonschema skips a format whose checker cannot be imported."""
    sys.modules.setdefault("rfc3987_syntax", None)


def main(argv: list[str] | None = None) -> int:
    hide_slow_optional_modules()
    args = build_parser().parse_args(argv)
    refused = refused_name(args)
    if refused is not None:
        return refused
    from .config import ConfigError
    try:
        return COMMANDS[args.command](args)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
