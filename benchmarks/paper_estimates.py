"""Paper-profile runtimes of the stages too slow to run whole on this machine: time one round (and one
evaluation) at the stage's paper setting, multiply out to the stage's rounds, methods or settings, and
seeds, and write benchmarks/results/paper_estimates.{json,md} (scripts/stage_runtimes.py puts them in
README's runtime table, marked as estimates).

    python benchmarks/paper_estimates.py [--stages perm_fig2,charles_fig13] [--threads 1]

How each kind of stage is estimated (the .md repeats it per stage):
* PERM curve stages (perm_fig2, perm_fig4): on seed 0's federation, after one untimed round, per method,
  the wall time of one round (``algorithm.round`` after ``init``) and of one evaluation (personalized
  models + ``evaluate``); estimate = seeds x sum over methods of (rounds x round + (rounds / eval_every
  + 1) x evaluation), less one round per evaluation before the last for pFedMe (whose next round reuses the
  evaluation's local rounds: ``PFedMe.reuses_evaluation``). A PERM variant is timed on a round that also
  estimates alpha, takes the global step and updates alpha (warm-up 0, update every round): an upper bound,
  the stage does those every ``update_every`` rounds and its warm-up rounds are cheaper FedAvg rounds.
* Charles et al. grids (charles_fig12, charles_fig13, charles_fig6): per task, ``run_grid`` over one chunk of
  the stage's settings batched as the stage batches them (``settings_chunk``; all settings when unset), timed
  for 1 and for 3 rounds after one untimed round (without it, on an H200 on 2026-11-27, the first call's
  one-time GPU costs made the 1-round run about as long as the 3-round one: rounds of 0.0 and 0.008 s, not
  kept), with the divergence rule off (a timed setting that diverges stops stepping, and its rounds would cost
  nothing: the paper profile's CIFAR-100 chunk did at round 1 on 2026-11-27): half the difference is a round of
  the chunk, the rest one-time set-up; estimate =
  set-up + rounds x chunks x round. (It replaced one round of ONE setting x the settings count, which
  overstated the real runs 4-6x: batching settings is the point of the grid engine.) Checked against the
  default profile's real runs (build/runtimes.csv) with ``--profile default``. A task timed once is reused by
  the stages that share it (same task, K, evaluation size and chunk).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from pflkit.device import cpu_model  # noqa: E402
from pflkit.io import write_report  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "paper_estimates"
CURVES = ("perm_fig2", "perm_fig4")
GRIDS = ("charles_fig12", "charles_fig13", "charles_fig6")


def cpu_name() -> str:
    model = cpu_model()
    return f"{model} x{os.cpu_count()}" if model else platform.machine()


def timed(fn):
    """(fn(), wall seconds); on a GPU the queued kernels are waited for before and after."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def estimate_curves(cfg, device, skip: tuple[str, ...] = ()) -> dict:
    from pflkit.algorithms.round import run_passes
    from pflkit.engine import FunctionalModel
    from pflkit.eval import evaluate
    from pflkit.experiments import perm as E
    from pflkit.experiments.images import image_federation, load_images
    img = load_images(cfg.dataset)
    factory = cfg.model.factory(img.shape, img.num_classes)
    seed = cfg.seeds[0]
    data = image_federation(cfg, img, seed).with_label_groups(cfg.label_groups).to(device)
    data = data.with_batch_order(cfg.batch_order)
    model = FunctionalModel(factory, device)
    # PERM variants: a plain round (no global step / alpha update in it), and the alpha computation and the
    # global step timed once (the same passes over every client's rows for both variants)
    timing_cfg = cfg.model_copy(update={k: getattr(cfg, k).model_copy(update={"warmup_rounds": 0,
                                                                          "update_every": 10 ** 9})
                                        for k in ("perm", "perm_alpha")})
    per_method, total, shared = {}, 0.0, {}
    evals = cfg.rounds // cfg.eval_every + 1
    warm = E.METHODS[cfg.methods[0]].make(model, timing_cfg)  # one untimed round: one-time costs (allocator, vmap)
    warm.round(warm.init(data, seed))
    fedavg_round = None
    for key in cfg.methods:
        if key in skip:
            per_method[E.METHODS[key].name] = {"skipped": "not timed here (see the note)"}
            continue
        algo = E.METHODS[key].make(model, timing_cfg)
        if key in ("perm", "perm_alpha") and "alpha_s" not in shared:
            state, shared["alpha_s"] = timed(lambda: algo.init(data, seed))  # noqa: B023 (init computes alpha)
            _, shared["global_s"] = timed(lambda: run_passes(algo, algo.global_passes(state, None), data))  # noqa: B023
        else:
            state = algo.init(data, seed)
        state, round_s = timed(lambda: algo.round(state))  # noqa: B023 (called at once)
        _, eval_s = timed(lambda: evaluate(model, algo.personalized(state), data))  # noqa: B023
        if key == "localized_fedavg":
            fedavg_round = round_s
        # pFedMe: the round after an evaluation reuses its local rounds (every evaluation but the last one's)
        reused = evals - 1 if getattr(algo, "reuses_evaluation", lambda n: False)(data.num_clients) else 0
        seconds = (cfg.rounds - reused) * round_s + evals * eval_s
        row = {"round_s": round(round_s, 3), "eval_s": round(eval_s, 3)}
        if reused:
            row["rounds_reused"] = reused
        if key in ("perm", "perm_alpha"):
            p = getattr(cfg, key)
            warmup = p.warmup_rounds
            period = cfg.num_clients if p.update_every == "epoch" else p.update_every
            updates = (cfg.rounds - warmup) // period
            warm_round = fedavg_round if fedavg_round is not None else round_s
            seconds = (warmup * warm_round + (cfg.rounds - warmup) * round_s + (1 + updates) * shared["alpha_s"]
                       + updates * shared["global_s"] + evals * eval_s)
            row.update(alpha_s=round(shared["alpha_s"], 2), global_step_s=round(shared["global_s"], 2),
                       alpha_updates=updates, warmup_rounds=warmup)
        row["seconds_per_seed"] = round(seconds, 1)
        per_method[E.METHODS[key].name] = row
        total += seconds
        extra = f", alpha {row['alpha_s']:.1f} s, global step {row['global_step_s']:.1f} s" if "alpha_s" in row else ""
        print(f"  {key}: round {round_s:.2f} s, evaluation {eval_s:.2f} s{extra}", flush=True)
    timed_methods = [k for k in cfg.methods if k not in skip]
    return {"seconds": total * len(cfg.seeds), "detail": per_method, "skipped": list(skip),
            "how": (f"one round and one evaluation per method timed on seed {seed}'s federation, x {cfg.rounds} "
                    f"rounds, {evals} evaluations, {len(cfg.seeds)} seeds, {len(timed_methods)} methods"
                    + (f" (NOT {', '.join(skip)}: see the note)" if skip else "") + "; PERM: "
                    "warm-up rounds at localized FedAvg's round time, plus the timed alpha computation and global "
                    "step at each update"
                    + ("; pFedMe: the rounds after its evaluations reuse their local rounds"
                       if any(r.get("rounds_reused") for r in per_method.values()) else ""))}


def grid_settings(stage: str, cfg) -> int:
    if stage == "charles_fig12":
        return len(cfg.gammas)
    if stage == "charles_fig13":
        return len(cfg.gammas) * len(cfg.etas)
    runs = {(s, 0.0) for s in cfg.servers} | {("gd", a) for a in cfg.alphas}  # fig6: reused runs counted once
    return len(runs) * len(cfg.gammas) * len(cfg.etas)


def grid_list(stage: str, cfg) -> list:
    """The stage's settings in its order (fig6: each distinct (server, alpha) run over gammas x etas, as
    ``charles_nn.fig6`` builds them: a chunk mixing alphas costs one client update per alpha)."""
    from pflkit.experiments import charles_nn as C
    etas = getattr(cfg, "etas", None) or [cfg.eta]
    if stage != "charles_fig6":
        return [C.Setting(gamma=g, eta=e) for g in cfg.gammas for e in etas]
    runs = dict.fromkeys([(s, 0.0) for s in cfg.servers] + [("gd", a) for a in cfg.alphas])
    return [C.Setting(g, e, server, cfg.momentum if server != "gd" else 0.0, alpha)
            for server, alpha in runs for g in cfg.gammas for e in etas]


def estimate_grid(stage: str, cfg, device, cache: dict) -> dict:
    """Per task: the grid as the stage runs it, in chunks of ``settings_chunk`` settings batched (all of them
    when unset), timed for 1 and for 3 rounds of one chunk: a round of the chunk costs half the difference,
    the rest is one-time set-up (data to the device, models, the round-0 evaluation); estimate = set-up +
    rounds x chunks x that round."""
    import math

    from pflkit.engine import FunctionalModel
    from pflkit.experiments import charles_nn as C
    n = grid_settings(stage, cfg)
    batch = min(cfg.settings_chunk or n, n)
    chunks = math.ceil(n / batch)
    total, detail = 0.0, {}
    for name, t in cfg.tasks.items():
        key = (t.model_dump_json(), cfg.local_steps, t.eval_samples or cfg.eval_samples, cfg.seed, batch)
        if key not in cache:
            task = C.build_task(t, cfg.seed)
            data = task.data.to(device)
            model = FunctionalModel(task.factory, device)
            split = "test" if stage == "charles_fig6" else "train"
            batches = {split: C.eval_batch(data, split, t.eval_samples or cfg.eval_samples, cfg.seed)}
            grid = grid_list(stage, cfg)[:batch]  # the stage's own first chunk (fig6: its alphas and servers)

            def run(rounds, grid=grid, model=model, data=data, batches=batches, split=split, t=t):
                return timed(lambda: C.run_grid(
                    model, data, grid, rounds=rounds, local_steps=cfg.local_steps, batch_size=t.batch_size,
                    clients_per_round=t.clients_per_round, seed=cfg.seed, evaluate=C.make_evaluator(model, batches),
                    watch=f"{split}_loss", settings_chunk=batch, diverge_factor=float("inf")))[1]
            run(1)  # untimed: one-time costs (on a GPU, cuDNN's algorithm search and the allocator's first blocks)
            one, three = run(1), run(3)
            per_round = max((three - one) / 2, 0.0)
            cache[key] = (per_round, max(one - per_round, 0.0))
            print(f"  {name}: {batch} settings batched: round {per_round:.2f} s, set-up {cache[key][1]:.1f} s",
                  flush=True)
        per_round, setup = cache[key]
        seconds = setup + t.rounds * chunks * per_round
        detail[name] = {"chunk_round_s": round(per_round, 3), "setup_s": round(setup, 2), "settings": n,
                        "chunk": batch, "rounds": t.rounds, "seconds": round(seconds, 1)}
        total += seconds
    return {"seconds": total, "detail": detail,
            "how": (f"per task, 1 and 3 rounds of {batch} settings batched (the stage's chunk) timed: set-up + "
                    f"rounds x {chunks} chunks x the round (their difference / 2)")}


def main(argv=None) -> int:
    from pflkit.config import load_params, validate_stage
    from pflkit.device import device_name
    from pflkit.engine import resolve_device
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default=",".join(CURVES + GRIDS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", default="paper")
    p.add_argument("--note", default="", help="how the machine was loaded, written under the table")
    p.add_argument("--out", default=str(OUT), help="output path without suffix (default: %(default)s)")
    p.add_argument("--skip", default="", help="stage:method pairs not to time (e.g. one that does not fit in memory "
                   "here), comma-separated; the table says so")
    a = p.parse_args(argv)
    out = Path(a.out)
    torch.set_num_threads(a.threads)
    params = load_params(ROOT / "params.yaml")
    stages = a.stages.split(",")
    unknown = [s for s in stages if s not in CURVES + GRIDS]
    if unknown:
        raise SystemExit(f"--stages: cannot estimate {unknown}; allowed: {', '.join(CURVES + GRIDS)}")
    configs = {s: validate_stage(params, s, a.profile) for s in stages}  # bad input before any work
    previous = json.loads(out.with_suffix(".json").read_text())["stages"] if out.with_suffix(".json").is_file() else []
    done, cache = {(e["stage"], e["profile"], e["device"]): e for e in previous}, {}
    for stage, cfg in configs.items():
        device = resolve_device(cfg.device)
        name = device_name(device)
        print(f"{stage} ({a.profile}, {name}):", flush=True)
        skip = tuple(pair.split(":", 1)[1] for pair in a.skip.split(",") if pair.startswith(f"{stage}:"))
        est = estimate_curves(cfg, device, skip) if stage in CURVES else estimate_grid(stage, cfg, device, cache)
        done[(stage, a.profile, name)] = {
            "stage": stage, "profile": a.profile, "device": name, "threads": a.threads, "cpu": cpu_name(),
            "seconds": round(est["seconds"], 1), "how": est["how"], "detail": est["detail"],
            "complete": not est.get("skipped"), "note": a.note,
            "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        print(f"  estimate {est['seconds'] / 3600:.2f} h", flush=True)
        write(out, done)  # after every stage: a stage that fails later keeps the ones done
    return 0


def write(out: Path, done: dict) -> None:
    rows = sorted(done.values(), key=lambda e: (e["profile"], e["stage"], e["device"]))
    lines = ["| stage | profile | device | estimate | how |", "|---|---|---|---|---|"]
    for e in rows:
        h = e["seconds"] / 3600
        bound = "" if e.get("complete", True) else "more than "
        lines.append(f"| {e['stage']} | {e['profile']} | {e['device']} | "
                     f"{bound}{h:.1f} h ({e['seconds']:,.0f} s) | {e['how']} |")
    for note in dict.fromkeys(e["note"] for e in rows if e.get("note")):
        lines += ["", note]
    lines += ["", "Per method or task: " + "; ".join(
        f"{e['stage']}: " + ", ".join(f"{k} {json.dumps(v)}" for k, v in e["detail"].items()) for e in rows)]
    write_report(out.parent, out.stem, {"stages": rows}, "\n".join(lines) + "\n")
    print(f"wrote {out}.json and .md")


if __name__ == "__main__":
    sys.exit(main())
