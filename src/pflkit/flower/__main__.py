"""``python -m pflkit.flower {simulate,deploy}``: the flower_equivalence stage's methods in-process and on one
of Flower's engines, side by side (needs ``pip install -e '.[flower]'``; ``pflkit.experiments.flower.command``).

A command of its own, apart from ``python -m pflkit``: every pipeline stage runs ``python -m pflkit stage``,
whose code DVC tracks, and none of them should depend on the Flower experiment's."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pflkit.flower", description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=["simulate", "deploy"], help="simulate: Flower's simulation engine (Ray); "
                        "deploy: a SuperLink and one SuperNode per client as local processes")
    parser.add_argument("--profile", default="default", help="params.yaml profile of the flower_equivalence "
                        "section (default: as written; smoke: 3 clients, 2 rounds)")
    parser.add_argument("--clients", type=int, default=None, help="number of clients (default: the section's)")
    parser.add_argument("--rounds", type=int, default=None, help="communication rounds (default: the section's)")
    parser.add_argument("--methods", default=None, help="comma-separated method keys (default: the section's)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--keep", action="store_true", help="deploy: keep the working folder it names (logs, "
                        "Flower's home, the app; by default removed after a run that succeeds)")
    parser.add_argument("--insecure", action="store_true", help="deploy: no TLS and no SuperNode authentication, "
                        "so any local process can join the federation and receive the model: LOCAL EXPERIMENTS ONLY "
                        "(default: TLS with certificates made for the run, only registered SuperNodes may join)")
    args = parser.parse_args(argv)
    from ..config import ConfigError
    from ..experiments.flower import command
    try:
        return command(args.engine, args.profile, args.params, clients=args.clients, rounds=args.rounds,
                       methods=args.methods.split(",") if args.methods else None, keep=args.keep,
                       insecure=args.insecure)
    except ConfigError as exc:
        print(f"invalid configuration:\n{exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
