"""Command line: ``python -m pflkit {data,stage,reproduce,validate,tune,notebooks} ...``."""
from __future__ import annotations

import argparse
import difflib
import math
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


class OptionError(ValueError):
    """A command-line option with a value it does not allow: ``main`` reports it as argparse reports its own
    (``pflkit <command>: error: argument <option>: <message>``, exit status 2)."""

    def __init__(self, option: str, message: str):
        super().__init__(f"argument {option}: {message}")
        self.option = option


def positive_int(text: str) -> int:
    """An integer >= 1 (argparse ``type=``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(text).strip() != str(text):
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _items(text: str, what: str) -> list[str]:
    items = str(text).split(",")
    if not str(text) or any(not item.strip() for item in items):
        raise argparse.ArgumentTypeError(f"must be comma-separated {what} with no empty entry, got {text!r}")
    return [item.strip() for item in items]


def step_sizes(text: str) -> list[float]:
    """Comma-separated learning rates, each a finite number > 0, none twice (argparse ``type=``)."""
    values = []
    for item in _items(text, "learning rates (numbers > 0)"):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{item!r} is not a learning rate; allowed: comma-separated finite "
                                             f"numbers > 0, e.g. 0.1,0.5,1.0 (got {text!r})")
        values.append(value)
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"a learning rate is listed twice in {text!r}; allowed: distinct numbers > 0")
    return values


def seed_list(text: str) -> list[int]:
    """Comma-separated seeds, each an integer >= 0, none twice (argparse ``type=``)."""
    values = []
    for item in _items(text, "seeds (integers >= 0)"):
        if not item.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not a seed; allowed: comma-separated integers >= 0, "
                                             f"e.g. 0,1,2 (got {text!r})")
        values.append(int(item))
    if len(set(values)) < len(values):
        raise argparse.ArgumentTypeError(f"a seed is listed twice in {text!r}; allowed: distinct integers >= 0")
    return values


def name_list(text: str) -> list[str]:
    """Comma-separated names with no empty entry (argparse ``type=``; what they may be is the command's check)."""
    return _items(text, "names")


def notebook_twin(text: str) -> str:
    """An existing py:percent twin (a .py file) (argparse ``type=``)."""
    path = Path(text)
    if path.suffix != ".py" or not path.is_file():
        raise argparse.ArgumentTypeError(f"no notebook twin {text!r}; allowed: the py:percent twins (.py) under "
                                         "notebooks/, e.g. notebooks/perm/fig1_synthetic.py (default: all)")
    return text


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser: one subcommand per entry of ``COMMANDS``."""
    parser = argparse.ArgumentParser(prog="pflkit", description=__doc__,
                                     epilog="examples:\n  " + "\n  ".join(EXAMPLES.values()),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = {}  # subcommand -> its parser, whose error() reports an OptionError

    def add(name: str, help: str):
        parser.commands[name] = sub.add_parser(name, help=help, description=help,
                                               epilog=f"example:\n  {EXAMPLES[name]}",
                                               formatter_class=argparse.RawDescriptionHelpFormatter)
        return parser.commands[name]

    p = add("data", help="prepare one dataset under data/prepared/ (what dvc.yaml's data stages call)")
    p.add_argument("key", choices=list(stage_table.DATA_BY_KEY), help="a data stage key: "
                   + ", ".join(stage_table.DATA_BY_KEY))
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
    p.add_argument("--canary-rounds", type=positive_int, default=None,
                   help="with --canary: rounds of every stage (default: 25 for curve stages, at least past a PERM "
                        "warm-up and its first alpha update; 3 per Charles et al. grid task)")
    p.add_argument("--short", action="store_true",
                   help="with --canary: the short form (1 round unless --canary-rounds, no plot stages): minutes")
    p.add_argument("--max-clients", type=positive_int, default=None,
                   help="with --canary: at most this many clients in a PERM image federation (default: the "
                        "profile's own; fewer clients can hide a divergence)")

    p = add("validate", help="check every section of params.yaml, and that every stage of dvc.yaml "
                                        "has a valid section; run nothing")
    p.add_argument("params", nargs="?", default="params.yaml")
    p.add_argument("--dvc", default=None, help="the dvc.yaml whose stages need sections "
                                               "(default: dvc.yaml beside the params file, if there is one)")

    p = add("tune", help="learning-rate sweep of every method of a curve stage (same round budget)")
    p.add_argument("stage")
    p.add_argument("--grid", type=step_sizes, default="0.01,0.02,0.05,0.1,0.2,0.5,1.0",
                   help="comma-separated learning rates > 0 (default: %(default)s)")
    p.add_argument("--methods", type=name_list, default=None,
                   help="comma-separated method keys (default: the stage's)")
    p.add_argument("--seeds", type=seed_list, default="0", help="comma-separated seeds >= 0 (default: 0)")
    p.add_argument("--rounds", type=positive_int, default=None,
                   help="tune over the stage's first ROUNDS rounds (a tuning window; default: its whole budget)")
    p.add_argument("--jobs", type=positive_int, default=1,
                   help="cells (method x lr) run in this many worker processes, e.g. several on one GPU")
    p.add_argument("--out", default=None,
                   help="the table's CSV (default: results/tuning/<stage>.csv; another profile's: "
                        "build/<profile>/tuning/<stage>.csv)")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", default="default", help="params.yaml profile of the stage's values "
                                                          "(default: the section as written; smoke: a quick try)")

    p = add("notebooks", help="notebook twins: refresh (py -> executed ipynb) or check")
    p.add_argument("action", choices=["refresh", "check"])
    p.add_argument("paths", nargs="*", type=notebook_twin, help="py:percent twins to refresh (default: all)")

    return parser


def refused_name(args) -> int | None:
    """The exit status (2, as argparse's) when ``args`` names a stage the command does not know or cannot run
    (said on stderr, naming the argument), else None. Needs nothing but the stage table: no config, no torch."""
    named = {"stage": [args.stage] if args.command == "stage" else [],
             "tune": [args.stage] if args.command == "tune" else [],
             "reproduce": (args.stages.split(",") if args.stages else []) if args.command == "reproduce" else []}
    option = "--stages" if args.command == "reproduce" else "stage"
    known = {"tune": stage_table.tunable()}.get(args.command, [s.name for s in stage_table.STAGES])
    for name in named.get(args.command, []):
        if args.command == "tune" and stage_table.get(name) is not None and name not in known:
            why = (f"cannot tune stage {name!r} (it has no learning-rate sweep); stages it can tune: "
                   f"{', '.join(known)}")
        else:
            why = unknown_stage(name, known)
        if why:
            print(f"pflkit {args.command}: error: argument {option}: {why}", file=sys.stderr)
            return 2
    return None


def check_options(args) -> None:
    """The option values that depend on the files they name, checked before any work (an :class:`OptionError`
    naming the option and what it allows): the parameters file (and validate's dvc.yaml) exists, ``--profile``
    is one params.yaml defines (reproduce: not the default one, which ``dvc repro`` runs, unless ``--canary``),
    the canary's options come with ``--canary``."""
    from .config import load_params, profile_names
    params_option = "params" if args.command == "validate" else "--params"
    params_file = getattr(args, "params", None)
    if params_file is not None and not Path(params_file).is_file():
        raise OptionError(params_option, f"no such parameters file {params_file!r}; allowed: an existing params.yaml "
                                         "(default: params.yaml)")
    if getattr(args, "dvc", None) is not None and not Path(args.dvc).is_file():
        raise OptionError("--dvc", f"no such file {args.dvc!r}; allowed: an existing dvc.yaml")
    profile = getattr(args, "profile", None)
    if profile is not None:
        known = profile_names(load_params(params_file))
        if profile not in known:
            raise OptionError("--profile", f"unknown profile {profile!r}; {params_file} defines "
                                           f"{', '.join(known)}")
        if args.command == "reproduce" and not args.canary and profile == known[0]:
            raise OptionError("--profile", f"the {profile} profile is what `dvc repro` runs (and caches); allowed: "
                                           f"{', '.join(known[1:])} (or --canary)")
    if args.command == "reproduce" and not args.canary:
        extra = [f"--{k.replace('_', '-')}" for k in ("canary_rounds", "short", "max_clients")
                 if getattr(args, k) not in (None, False)]
        if extra:
            raise OptionError(extra[0], "only with --canary")


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
    if args.canary:
        from .canary import MAX_CLIENTS, run_canary
        return run_canary(args.profile, args.stages.split(",") if args.stages else None, args.params,
                          rounds=args.canary_rounds, short=args.short,
                          max_clients=args.max_clients if args.max_clients else MAX_CLIENTS)
    from .reproduce import reproduce
    return reproduce(args.profile, args.stages.split(",") if args.stages else None, args.params)


def run_tune(args) -> int:
    from .config import ConfigError, load_params, validate_stage
    from .io import write_csv
    folder = "results/tuning" if args.profile == "default" else f"build/{args.profile}/tuning"
    out = Path(args.out or f"{folder}/{args.stage}.csv")
    if out.is_dir() or any(p.exists() and not p.is_dir() for p in out.parents):
        raise OptionError("--out", f"{args.out!r} is a folder or lies under a file; allowed: a CSV file's path "
                                   f"(default: {folder}/{args.stage}.csv)")
    entry = stage_table.get(args.stage)
    cfg = validate_stage(load_params(args.params), args.stage, args.profile)
    dump = cfg.model_dump()
    # each option's values under the stage's own rules, before any work (the sweep gives each method its lr)
    for option, update in (("--methods", {"methods": args.methods, "lr": {**{m: args.grid[0] for m in args.methods
                                                                             or ()}, **dump.get("lr", {})}}),
                           ("--seeds", {"seeds": args.seeds}), ("--rounds", {"rounds": args.rounds})):
        if update[next(iter(update))] is not None:
            try:
                type(cfg).build({**dump, **update})
            except ConfigError as exc:  # the lines about the option's own key first (the rest follow from it)
                lines = str(exc).split("\n")
                own = [line for line in lines if f".{option[2:]}:" in line]
                raise OptionError(option, " ".join(own or lines)) from None
    lr_sweep = stage_table.resolve(entry.tune)  # the stage's sweep, e.g. pflkit.experiments.perm:lr_sweep
    table = lr_sweep(cfg, args.grid, methods=args.methods, seeds=args.seeds, rounds=args.rounds, jobs=args.jobs,
                     show_progress=True)
    out = write_csv(out, table)
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
    parser = build_parser()
    args = parser.parse_args(argv)
    refused = refused_name(args)
    if refused is not None:
        return refused
    from .config import ConfigError
    try:
        check_options(args)
        return COMMANDS[args.command](args)
    except OptionError as exc:  # exits 2, as argparse's own errors
        parser.commands[args.command].error(str(exc))
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
