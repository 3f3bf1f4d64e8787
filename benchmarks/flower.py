"""pflkit on Flower (issue 19): what a real federated engine costs next to the batched in-process one.

    OMP_NUM_THREADS=1 python benchmarks/flower.py [--clients 10,50,100] [--deploy-clients 10]
                                                  [--rounds 5] [--out benchmarks/results]
    python benchmarks/flower.py --quick --engines in-process --out /tmp/bench   # seconds (the test)

The work is the flower_equivalence stage's (params.yaml, default profile: PERM's Fig. 1 setting, d = 60,
500 samples per client, K = 20 local steps of batch 20, FedAvg and PERM with PERM's alpha update every 5
rounds), for ``--rounds`` rounds with one evaluation at the start and one at the end, on:

* **in-process**: the batched engine, every client in one call (``Algorithm.round``);
* **simulation**: Flower's simulation engine, Ray actors (``pflkit.flower.simulation``, 2 CPUs);
* **deployment**: a SuperLink and one stock ``flower-supernode`` per client as local processes, ``flwr run``
  (``pflkit.flower.deployment``): each SuperNode's SuperExec starts a fresh ClientApp process (imports and all)
  for every message. benchmarks/flower_floor.py sets its rounds beside stock Flower's floor.

Every engine runs in a fresh process (``--child``), started by this script, which samples the resident
memory of that process and all its descendants every 0.25 s (sum of RSS: shared library pages count
once per process, so the sum over-states what the processes share).

Measured per engine, number of clients and method:

* **seconds per round**: the round's training passes (PERM: and its gradient passes for the global step
  and alpha, when due), evaluation apart; in-process, ``Algorithm.round``;
* **start-up**: from the process's launch (Python and imports included) to the first round: for Flower,
  Ray's start or the SuperLink's and SuperNodes', ``flwr run``, and the registration of every node;
* **peak memory** of the whole process tree;
* **bytes per round per client** a round's messages carry, both ways (the Exchange counts them): the
  models' and gradients' tensor bytes, the minibatch rows the server sent (int16; 0 since randomness is per
  client), the rest (step sizes), and Flower's own count of what it serializes (``count_bytes``: npy headers,
  keys, config). The model part is compared with the formula of ``experiments.perm_hetero.cost_table``: 8 P
  bytes per round (an fp32 model of P parameters down, the update up), plus for PERM every ``update_every`` rounds
  (global_steps + 1) gradient passes of 8 P each (the model down, the gradient up), amortized.

Writes ``<out>/flower.json`` and ``<out>/flower.md`` and prints the markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling benchmark modules
from process_tree import run_sampled  # noqa: E402  (one way to measure a process tree's memory)
from speed import machine_info  # noqa: E402  (one description of the machine for every benchmark)

from pflkit.io import write_report  # noqa: E402

ENGINES = ("in-process", "simulation", "deployment")
SAMPLE_SECONDS = 0.25


# --------------------------------------------------------------------------- the work
def config(clients: int, rounds: int, quick: bool):
    from pflkit.config import load_params, stage_values
    from pflkit.experiments.flower import FlowerEquivalenceConfig
    from pflkit.paths import project_root

    values = stage_values(load_params(project_root() / "params.yaml"), "flower_equivalence",
                          "smoke" if quick else "default")
    values.update({"num_clients": clients, "rounds": rounds, "eval_every": rounds, "seeds": [0],
                   "deployment_rounds": rounds})
    return FlowerEquivalenceConfig.build(values)


def formula_bytes(spec, num_parameters: int) -> float:
    """Model bytes per round per client by ``experiments.perm_hetero.cost_table``'s formula for full-width
    models: 8 P (fp32 model down + update up), PERM adding (global_steps + 1) gradient passes of 8 P every
    update_every rounds (cost_table's ``updates * (global_steps * own + alpha_p) * 8 / rounds``)."""
    p = 8.0 * num_parameters
    if spec.method != "PERM":
        return p
    s = spec.settings
    every = s["update_every"]
    period = spec.data["kwargs"]["num_clients"] if every == "epoch" else every
    updates = 0 if period is None else spec.rounds // period
    return p + updates * (s["global_steps"] + 1) * p / spec.rounds


def child(engine: str, clients: int, rounds: int, quick: bool, launched: float, out: Path) -> None:
    """One engine's run in this (fresh) process; writes its measurements to ``out``."""
    from pflkit.data.synthetic import perm_synthetic
    from pflkit.engine import FunctionalModel
    from pflkit.eval import evaluate
    from pflkit.experiments.flower import specs_for
    from pflkit.models import logistic

    torch.set_num_threads(1)
    cfg = config(clients, rounds, quick)
    model = FunctionalModel(lambda: logistic((cfg.dim,), 2), "cpu")
    methods = specs_for(cfg, 0, model)
    specs = [spec for _, spec in methods.values()]
    rows = []
    if engine == "in-process":
        data = perm_synthetic(cfg.num_clients, cfg.samples_per_client, cfg.dim, cfg.test_fraction, seed=0)
        first = None
        for name, (alg, spec) in methods.items():
            state = alg.init(data, spec.seed)
            first = first or time.time()
            times = []
            for _ in range(rounds):
                t = time.perf_counter()
                state = alg.round(state)
                times.append(time.perf_counter() - t)
            t = time.perf_counter()
            acc = evaluate(model, alg.personalized(state), data).summary()["accuracy"]
            rows.append({"method": name, "round_seconds": times, "eval_seconds": time.perf_counter() - t,
                         "accuracy": acc, "traffic": None, "num_parameters": sum(v.numel() for v in state.w.values()),
                         "formula_bytes": None})
        startup = first - launched
    else:
        if engine == "simulation":
            from pflkit.flower.simulation import simulate
            res = simulate(specs, num_cpus=cfg.ray_cpus, object_store_mb=cfg.object_store_mb)
        else:
            from pflkit.flower.deployment import deploy
            res = deploy(specs)
            if res["leftover_pids"]:
                raise RuntimeError(f"processes left behind: {res['leftover_pids']}")
        startup = res["registered_at"] - launched
        for spec, run in zip(specs, res["runs"]):
            hist = run["history"]
            final = [v for r, m, v in zip(hist["round"], hist["metric"], hist["value"])
                     if r == rounds and m == "accuracy"]
            rows.append({"method": spec.name, "round_seconds": list(run["round_seconds"].values()),
                         "eval_seconds": sum(run["eval_seconds"].values()) / len(run["eval_seconds"]),
                         "accuracy": final[0], "traffic": per_client_bytes(run["traffic"], clients, rounds),
                         "num_parameters": run["num_parameters"],
                         "formula_bytes": formula_bytes(spec, run["num_parameters"])})
    out.write_text(json.dumps({"engine": engine, "clients": clients, "rounds": rounds, "startup_seconds": startup,
                               "methods": rows}))


def per_client_bytes(traffic: list[dict], clients: int, rounds: int) -> dict:
    """Bytes per round per client of the training passes (train + PERM's gradient passes; evaluation and
    round 0 apart), both directions, by part."""
    total: dict[str, float] = {}
    for row in traffic:
        if row["round"] == 0 or row["kind"] == "evaluate":
            continue
        for k, v in row.items():
            if k.startswith(("down_", "up_")):
                total[k] = total.get(k, 0) + v
    return {k: v / rounds / clients for k, v in total.items()}


# --------------------------------------------------------------------------- the parent
def measure(engine: str, clients: int, rounds: int, quick: bool, folder: Path) -> dict:
    """Run ``child`` in a fresh process, sampling its process tree's memory; returns its measurements."""
    out = folder / f"{engine}-{clients}.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, __file__, "--child", engine, "--clients", str(clients), "--rounds", str(rounds),
           "--launched", repr(time.time()), "--child-out", str(out)] + (["--quick"] if quick else [])
    run = run_sampled(cmd, interval=SAMPLE_SECONDS, env=env)
    if run["returncode"] != 0:
        raise RuntimeError(f"{engine} with {clients} clients failed (exit {run['returncode']})")
    res = json.loads(out.read_text())
    res["peak_rss_mb"], res["peak_used_mb"] = run["peak_rss_mb"], run["peak_used_mb"]
    return res


def keep_other_engines(earlier: dict, res: dict, engines: list[str]) -> dict:
    """``res`` (a run of ``engines``) with the rows of the other engines from ``earlier``, in ``ENGINES`` order,
    each row stamped with the load averages of the run that measured it (the table says which rows are which)."""
    if earlier.get("rounds") != res["rounds"] or earlier.get("work") != res["work"]:
        raise SystemExit("--keep: the earlier flower.json ran other work or rounds; run every engine instead")
    runs = [measured(r, res) for r in res["runs"]]
    runs += [measured(r, earlier) for r in earlier["runs"] if r["engine"] not in engines]
    return {**res, "runs": sorted(runs, key=lambda r: (ENGINES.index(r["engine"]), r["clients"]))}


def measured(run: dict, source: dict) -> dict:
    """``run`` with the load averages (start, end) of ``source``, the results it came from, unless it has them."""
    if "load_average" in run:
        return run
    return {**run, "load_average": [source["machine"]["load_average"][0], source["load_average_end"][0]]}


def load_averages(res: dict) -> str:
    """The load averages at the start and end of the run, or of each run whose rows the results keep."""
    groups: dict[tuple, list[str]] = {}
    for r in res["runs"]:
        key = tuple(measured(r, res)["load_average"])
        groups.setdefault(key, [])
        if r["engine"] not in groups[key]:
            groups[key].append(r["engine"])
    text = [f"{a:.2f} at start, {b:.2f} at end" for a, b in groups]
    if len(groups) == 1:
        return f"load average {text[0]}"
    return "load average " + "; ".join(f"{t} for the {', '.join(e)} rows (one run)"
                                       for t, e in zip(text, groups.values()))


def markdown(res: dict) -> str:
    m = res["machine"]
    base = {(r["clients"], x["method"]): sum(x["round_seconds"]) / len(x["round_seconds"])
            for r in res["runs"] if r["engine"] == "in-process" for x in r["methods"]}
    lines = [f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, 1 thread per process; "
             f"{load_averages(res)}. Work: {res['work']}.", "",
             "| engine | clients | method | s / round | x in-process | s / evaluation | start-up s | peak memory MB "
             "| machine memory MB | accuracy |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        for x in r["methods"]:
            per = sum(x["round_seconds"]) / len(x["round_seconds"])
            ratio = per / base[(r["clients"], x["method"])] if (r["clients"], x["method"]) in base else float("nan")
            lines.append(f"| {r['engine']} | {r['clients']} | {x['method']} | {per:.3f} | {ratio:,.0f}x | "
                         f"{x['eval_seconds']:.3f} | {r['startup_seconds']:.1f} | {r['peak_rss_mb']:,.0f} | "
                         f"{r['peak_used_mb']:,.0f} | {x['accuracy']:.4f} |")
    lines += ["", "Per round per client, training passes both ways (bytes; evaluation apart). Model: the fp32 models "
              "and gradients; draws: the minibatch rows the server sent (int16) while clients replayed the batched "
              "engine's draws (0 since randomness is per client: a key per pass travels in the config); other: "
              "PERM's step sizes; Flower: what Flower counts it serializes "
              "(count_bytes). Formula: cost_table's 8 P (+ PERM's gradient passes, amortized).", "",
              "| engine | clients | method | P | model | formula | model / formula | draws | other | Flower |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["runs"]:
        for x in r["methods"]:
            t = x["traffic"]
            if not t:
                continue
            model = t["down_model"] + t["up_model"]
            lines.append(f"| {r['engine']} | {r['clients']} | {x['method']} | {x['num_parameters']} | {model:,.0f} | "
                         f"{x['formula_bytes']:,.0f} | {model / x['formula_bytes']:.2f} | "
                         f"{t.get('down_draws', 0) + t.get('up_draws', 0):,.0f} | "
                         f"{t['down_other'] + t['up_other']:,.0f} | "
                         f"{t['down_flower'] + t['up_flower']:,.0f} |")
    lines += ["", "Seconds per round: the training passes (PERM: with its gradient passes when due), mean over the "
              "rounds; in-process: Algorithm.round over every client at once. Start-up: from the process's launch "
              "(imports included) to the first round (Flower: Ray or the SuperLink and SuperNodes, `flwr run`, every "
              "node registered). Peak memory: the sum of the resident memory of the process and all its descendants "
              "(SuperLink, SuperNodes, ClientApps, Ray), sampled every 0.25 s: it counts shared pages once per "
              "process; machine memory: the peak growth of the machine's memory in use (total less available) over "
              "the run, which counts shared pages once (the machine ran nothing else). Accuracy: final personalized, "
              "the same on every engine (issue 19's check)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", default="10,50,100", help="clients for in-process and simulation")
    parser.add_argument("--deploy-clients", default="10",
                        help="clients for the deployment engine (a torch import per message: 100 take hours)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engines", default=",".join(ENGINES))
    parser.add_argument("--quick", action="store_true", help="the smoke profile's sizes, 3 clients, 2 rounds")
    parser.add_argument("--keep", action="store_true",
                        help="keep the rows of the engines not in --engines from <out>/flower.json (an earlier run)")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--child", choices=ENGINES, default=None)
    parser.add_argument("--launched", type=float, default=None)
    parser.add_argument("--child-out", default=None)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, int(args.clients), args.rounds, args.quick, args.launched, Path(args.child_out))
        return None
    engines = args.engines.split(",")
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        parser.error(f"--engines must be from {ENGINES}, got {bad}")
    clients = [3] if args.quick else [int(c) for c in args.clients.split(",")]
    deploy_clients = {e: [3] if args.quick else [int(c) for c in value.split(",")]
                      for e, value in (("deployment", args.deploy_clients),)}
    rounds = 2 if args.quick else args.rounds
    res = {"machine": machine_info(torch.device("cpu")), "rounds": rounds, "runs": []}
    cfg = config(clients[0], rounds, args.quick)
    res["work"] = (f"perm-synthetic, {cfg.samples_per_client} samples per client, d={cfg.dim}, logistic regression, "
                   f"K={cfg.local_steps} local steps of batch {cfg.batch_size}, {rounds} rounds, PERM's update every "
                   f"{cfg.perm.update_every} rounds")
    with tempfile.TemporaryDirectory(prefix="pflkit-flower-bench-") as tmp:
        for engine in engines:
            for n in deploy_clients.get(engine, clients):
                print(f"{engine}, {n} clients ...", flush=True)
                res["runs"].append(measure(engine, n, rounds, args.quick, Path(tmp)))
    res["load_average_end"] = list(os.getloadavg())
    out = Path(args.out)
    if args.keep and (out / "flower.json").exists():
        res = keep_other_engines(json.loads((out / "flower.json").read_text()), res, engines)
    text = markdown(res)
    write_report(out, "flower", res, text)
    print(text)
    return res


if __name__ == "__main__":
    main()
