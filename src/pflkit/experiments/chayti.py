"""Chayti et al. (linear speedup in personalized collaborative learning): configs and figure functions
behind notebooks/chayti/. Everything runs on the noisy quadratic users (Sec. 6) with independent runs as
the batch dimension; each figure also returns the exact expected loss from :mod:`pflkit.theory.speedup`.

Curves are summarized over runs per recorded step: mean, standard error, 10% and 90% quantiles.
"Final" loss = the loss at the last step (mean and SE over runs); "tail" loss = each run's loss averaged
over the last ``tail_fraction`` of the steps, then mean and SE over runs (less noisy; runs independent).
The figures are drawn from the written tables by the plot stages (``pflkit.figures.chayti``).
"""
from __future__ import annotations

import time
from typing import Annotated

import numpy as np
import pandas as pd
import torch
from pydantic import AfterValidator, Field, model_validator

from .. import seeds
from ..algorithms.collaborative import BC, WGA, Alone, CollaborativeRun, run, tune_step_size
from ..config import Footprint, PositiveInt, Scale, Positives, Section, Seed, StageConfig, raise_problems
from ..data.quadratic_users import NoisyQuadraticUsers
from ..device import resolve_device
from ..progress import note
from ..report import StageResult, environment
from ..theory import speedup as theory

DATA_LABEL = "noisy quadratic users (1-D)"


# -- configs -------------------------------------------------------------------------------------------
class QuadraticConfig(StageConfig):
    """Problem and run fields shared by the simulation figures."""
    n_collaborators: int = Field(ge=1)
    sigma: Scale = Field(gt=0)
    zeta: Scale = Field(ge=0)
    x0: Scale
    steps: int = Field(ge=1)
    runs: int = Field(ge=2)
    record_every: int = Field(ge=1)
    tail_fraction: float = Field(gt=0, le=1)
    seed: Seed

    def collaborator_counts(self) -> list[int]:
        return [self.n_collaborators, *getattr(self, "n_values", [])]

    def footprint(self) -> Footprint:
        """Every run's draw for every user at once (float64, a few copies: draws, iterates, gradients) and the
        recorded curves (runs x steps / record_every)."""
        n = max(self.collaborator_counts())
        runs_key = "tuning_runs" if getattr(self, "tuning_runs", 0) > self.runs else "runs"
        runs = getattr(self, runs_key)
        return Footprint(data=runs * (self.steps // self.record_every + 1) * 8 * 4, work=runs * (n + 1) * 8 * 4,
                         data_key="steps" if self.steps > runs else runs_key,
                         work_key=("n_values" if n > self.n_collaborators else "n_collaborators") if n + 1 > runs
                         else runs_key)


class ChaytiFig1Config(StageConfig):
    """Fig. 1: speedup heat map over N and tau, plus a simulated check along a few slices."""
    n_max: int = Field(ge=2)
    tau_min: float = Field(gt=0)
    tau_max: float = Field(gt=0)
    grid_points: int = Field(ge=4)
    check_n: list[PositiveInt] = Field(min_length=1)
    check_tau: Positives
    check_eta: Rate = Field(gt=0, lt=1)
    check_runs: int = Field(ge=2)
    check_burn_in: int = Field(ge=0)
    check_steps: int = Field(ge=1)
    sigma: Scale = Field(gt=0)
    seed: Seed

    def footprint(self) -> Footprint:
        """The heat map (grid_points^2, a few float64 copies), the checks' draws (runs x largest N) and their loss
        curves, recorded every step of burn-in and tail (runs x (check_burn_in + check_steps + 1))."""
        steps = self.check_burn_in + self.check_steps + 1
        draws = Footprint(work=self.check_runs * (max(self.check_n) + 1) * 8 * 4,
                          work_key="check_n" if max(self.check_n) > self.check_runs else "check_runs")
        curves = Footprint(work=self.check_runs * steps * 8, work_key=(
            "check_burn_in" if self.check_burn_in > self.check_steps else "check_steps")
            if steps > self.check_runs else "check_runs")
        return Footprint(data=self.grid_points ** 2 * 8 * 8, data_key="grid_points") + draws + curves

    @model_validator(mode="after")
    def _tau_range(self):
        if not self.tau_min < self.tau_max:
            raise_problems([("tau_min", f"{self.tau_min!r} must be < tau_max ({self.tau_max!r}); "
                                        f"allowed: 0 < tau_min < tau_max")])
        return self


#: the smallest nonzero step size or correction rate: below it 1 - eta * h (or 1 - b) rounds to 1 in float64,
#: so the recursion's stationary point (its loss floor, ``theory.speedup.stationary_loss``) does not exist
RATE_FLOOR = 1e-12


def _resolvable(v: float) -> float:
    if 0 < v < RATE_FLOOR:
        raise ValueError(f"{v!r} is below {RATE_FLOOR:g}: 1 - {v!r} rounds to 1 in float64 and the recursion has no "
                         f"stationary point; allowed: 0 (where 0 is allowed) or a value >= {RATE_FLOOR:g}")
    return v


#: a step size (eta) or correction rate (b) whose floor float64 can compute
Rate = Annotated[float, AfterValidator(_resolvable)]


class Fig2Panel(Section):
    label: str
    x0: Scale
    eta_bc: Rate = Field(gt=0, lt=1)
    b: Rate = Field(ge=0, le=1)


class ChaytiFig2Config(QuadraticConfig):
    """Fig. 2: Alone vs WGA vs BC; eta tuned on ``eta_grid`` for Alone and WGA (separate seed), BC fixed."""
    a_wga: float = Field(ge=0, le=1)
    a_bc: float = Field(ge=0, le=1)
    eta_grid: list[Annotated[Rate, Field(gt=0, lt=1)]] = Field(min_length=1)
    tuning_runs: int = Field(ge=2)
    panels: list[Fig2Panel] = Field(min_length=1)


class SweepConfig(QuadraticConfig):
    eta: Rate = Field(gt=0, lt=1)
    a: float = Field(ge=0, le=1)


class ChaytiFig3Config(SweepConfig):
    """Fig. 3: BC for several zeta (fixed eta, a, b)."""
    b: Rate = Field(ge=0, le=1)
    zetas: list[Scale] = Field(min_length=1)


class ChaytiFig4Config(SweepConfig):
    """Fig. 4: WGA for several zeta (fixed eta, a)."""
    zetas: list[Scale] = Field(min_length=1)


class ChaytiFig5Config(SweepConfig):
    """Fig. 5: BC for several N (fixed eta, a, b)."""
    b: Rate = Field(ge=0, le=1)
    n_values: list[PositiveInt] = Field(min_length=1)



# -- shared helpers ----------------------------------------------------------------------------------
def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def summarize(result: CollaborativeRun, label: str, theory_curve: np.ndarray | None = None) -> pd.DataFrame:
    """Mean, SE and 10/90% quantiles over runs at every recorded step (plus the exact expectation)."""
    losses = result.losses.double()
    q = torch.quantile(losses, torch.tensor([0.1, 0.9], dtype=losses.dtype, device=losses.device), dim=1)
    frame = pd.DataFrame({"step": result.steps.numpy(), "label": label,
                          "mean": losses.mean(1).cpu().numpy(),
                          "se": (losses.std(1) / losses.shape[1] ** 0.5).cpu().numpy(),
                          "q10": q[0].cpu().numpy(), "q90": q[1].cpu().numpy()})
    frame["theory"] = theory_curve if theory_curve is not None else np.nan
    return frame


def final_stats(result: CollaborativeRun, tail_fraction: float) -> dict:
    """Final loss (last step) and tail loss (per-run mean over the last steps), each mean and SE over runs."""
    losses = result.losses.double()
    runs = losses.shape[1]
    k = max(1, int(round(tail_fraction * (losses.shape[0] - 1))))
    tail = losses[-k:].mean(0)
    return {"final": float(losses[-1].mean()), "final_se": float(losses[-1].std() / runs ** 0.5),
            "tail": float(tail.mean()), "tail_se": float(tail.std() / runs ** 0.5), "runs": runs}


def _users(cfg: QuadraticConfig, device, **override) -> NoisyQuadraticUsers:
    values = dict(n_collaborators=cfg.n_collaborators, sigma=cfg.sigma, zeta=cfg.zeta)
    values.update(override)
    return NoisyQuadraticUsers(**values, device=device)


def _metrics(cfg, scale, table, elapsed, device, **extra) -> dict:
    return {"stage": cfg.stage, "data": DATA_LABEL, "scale": scale,
            "final": {str(r["label"]): {k: (float(v) if isinstance(v, (int, float, np.floating)) else v)
                                        for k, v in r.items() if k != "label"} for r in table.to_dict("records")},
            **extra, "runtime_s": round(elapsed, 2), "device": str(device), "environment": environment(),
            "config": cfg.model_dump()}


# -- Fig. 1 ----------------------------------------------------------------------------------------------
def fig1_speedup(cfg: ChaytiFig1Config) -> StageResult:
    """Heat map of S(N, tau) = 1 + N / (1 + N tau) (Sec. 4) and a simulated check of it.

    Check: on the 1-D quadratic with step eta, the stationary losses of Alone and of WGA with weight a are
    eta sigma^2 / (2 (2 - eta)) and that times F(a) = (1-a)^2 + a^2/N + a^2 tau with
    tau = zeta^2 (2 - eta) / (eta sigma^2) (:func:`pflkit.theory.speedup.stationary_loss`): the horizon T
    of the bound is played by 2/eta. So Alone's loss over WGA(a*)'s loss measures S(N, tau) directly. Each
    (N, tau) point sets zeta from tau, starts every run at its method's stationary mean, discards
    ``check_burn_in`` steps and averages the loss over the next ``check_steps``.
    """
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    n_grid = np.unique(np.round(np.logspace(0, np.log10(cfg.n_max), cfg.grid_points)).astype(int))
    tau_grid = np.logspace(np.log10(cfg.tau_min), np.log10(cfg.tau_max), cfg.grid_points)
    heat = theory.wga_speedup(n_grid[:, None], tau_grid[None, :])
    heatmap = pd.DataFrame({"N": np.repeat(n_grid, len(tau_grid)), "tau": np.tile(tau_grid, len(n_grid)),
                            "speedup": heat.reshape(-1)})
    eta, sigma = cfg.check_eta, cfg.sigma
    generator = _generator(device, cfg.seed)
    steps = cfg.check_burn_in + cfg.check_steps
    tail = cfg.check_steps / steps

    def tail_loss(method, users, x0):
        result = run(method, users, users.start(x0, cfg.check_runs), steps=steps, eta=eta,
                     generator=generator, loss=users.loss, record_every=1)
        return final_stats(result, tail)

    rows = []
    alone = tail_loss(Alone(), NoisyQuadraticUsers(1, sigma, 0.0, device=device), 0.0)
    for n in cfg.check_n:
        for tau in cfg.check_tau:
            zeta = float(np.sqrt(tau * eta * sigma ** 2 / (2 - eta)))
            a = float(theory.wga_optimal_weight(n, tau))
            wga = tail_loss(WGA(a), NoisyQuadraticUsers(n, sigma, zeta, device=device), a * zeta)
            measured = alone["tail"] / wga["tail"]
            rel_se = np.hypot(alone["tail_se"] / alone["tail"], wga["tail_se"] / wga["tail"])
            rows.append({"N": n, "tau": tau, "a_star": a, "zeta": zeta,
                         "speedup_theory": float(theory.wga_speedup(n, tau)),
                         "speedup_measured": measured, "speedup_se": measured * rel_se})
            note(f"{cfg.stage}: check N={n}, tau={tau:g} done ({len(rows)}/{len(cfg.check_n) * len(cfg.check_tau)}, "
                 f"{time.perf_counter() - start:.1f} s)")
    check = pd.DataFrame(rows)
    check["z"] = (check["speedup_measured"] - check["speedup_theory"]) / check["speedup_se"]
    elapsed = time.perf_counter() - start
    scale = f"N up to {cfg.n_max}, tau in [{cfg.tau_min:g}, {cfg.tau_max:g}]; check: {cfg.check_runs} runs, eta={eta}"
    table = check[["N", "tau", "a_star", "speedup_theory", "speedup_measured", "speedup_se", "z"]]
    metrics = {"stage": cfg.stage, "data": DATA_LABEL, "scale": scale,
               "check": table.to_dict("records"), "max_abs_z": float(check["z"].abs().max()),
               "linear_regime": {"S(N=1000, tau=1e-4)": float(theory.wga_speedup(1000, 1e-4)),
                                 "S(N=1000, tau=1)": float(theory.wga_speedup(1000, 1.0))},
               "runtime_s": round(elapsed, 2), "device": str(device), "environment": environment(),
               "config": cfg.model_dump()}
    return StageResult(table, metrics, DATA_LABEL, scale, frames={"curves": heatmap},
                       extra={"n_grid": n_grid, "tau_grid": tau_grid, "speedup": heat})


# -- Fig. 2 ----------------------------------------------------------------------------------------------
def fig2_convergence(cfg: ChaytiFig2Config) -> StageResult:
    """Alone, WGA and BC loss curves per panel. Alone's and WGA's eta are tuned on ``eta_grid`` by mean
    final loss over ``tuning_runs`` runs per grid point drawn from seed + 1 (one batched pass per method);
    the reported curves use ``runs`` fresh draws from ``seed``. BC keeps the panel's eta_bc and b (not tuned, as
    in the paper)."""
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    users = _users(cfg, device)
    common = dict(steps=cfg.steps, N=cfg.n_collaborators, sigma=cfg.sigma, zeta=cfg.zeta,
                  record_every=cfg.record_every)
    curves, rows, tuning = [], [], []
    for p, panel in enumerate(cfg.panels):
        note(f"{cfg.stage}: panel {p + 1}/{len(cfg.panels)} ({panel.label}), "
             f"{time.perf_counter() - start:.1f} s elapsed")
        x0 = users.start(panel.x0, cfg.runs)
        tuned = {}
        for name, make in (("Alone", Alone), ("WGA", lambda: WGA(cfg.a_wga))):
            best, table = tune_step_size(make, users, users.start(panel.x0, cfg.tuning_runs), cfg.eta_grid,
                                         steps=cfg.steps, generator=_generator(device, seeds.tuning(cfg.seed, p)),
                                         loss=users.loss)
            tuned[name] = best
            tuning.append(table.assign(panel=panel.label, method=name))
        methods = [("Alone", Alone(), tuned["Alone"], dict(a=0.0)),
                   ("WGA", WGA(cfg.a_wga), tuned["WGA"], dict(a=cfg.a_wga)),
                   ("BC", BC(cfg.a_bc, panel.b), panel.eta_bc, dict(a=cfg.a_bc, b=panel.b))]
        for name, method, eta, kw in methods:
            result = run(method, users, x0, steps=cfg.steps, eta=eta, generator=_generator(device, cfg.seed),
                         loss=users.loss, record_every=cfg.record_every)
            exact = theory.expected_loss(eta=eta, x0=panel.x0, **common, **kw)
            curves.append(summarize(result, name, exact).assign(panel=panel.label))
            floor = theory.stationary_loss(eta=eta, N=cfg.n_collaborators, sigma=cfg.sigma, zeta=cfg.zeta, **kw)
            rows.append({"panel": panel.label, "label": name, "eta": eta, **final_stats(result, cfg.tail_fraction),
                         "theory_final": float(exact[-1]), "theory_floor": floor})
    table = pd.DataFrame(rows)
    claims = {}
    for panel in cfg.panels:
        sub = table[table["panel"] == panel.label].set_index("label")
        bc, others = sub.loc["BC"], sub.drop("BC")
        margins = {m: (r["final"] - bc["final"]) / np.hypot(r["final_se"], bc["final_se"])
                   for m, r in others.iterrows()}
        claims[panel.label] = {"bc_lowest_final": bool(all(z > 0 for z in margins.values())),
                               "margin_in_se": {m: round(float(z), 2) for m, z in margins.items()},
                               "bc_over_alone": float(bc["final"] / sub.loc["Alone", "final"])}
    elapsed = time.perf_counter() - start
    scale = f"N={cfg.n_collaborators}, sigma={cfg.sigma:g}, zeta={cfg.zeta:g}, T={cfg.steps}, {cfg.runs} runs"
    metrics = {"stage": cfg.stage, "data": DATA_LABEL, "scale": scale,
               "final": table.to_dict("records"), "claims": claims,
               "tuning": pd.concat(tuning).to_dict("records"),
               "runtime_s": round(elapsed, 2), "device": str(device), "environment": environment(),
               "config": cfg.model_dump()}
    return StageResult(table, metrics, DATA_LABEL, scale, frames={"curves": pd.concat(curves, ignore_index=True)},
                       extra={"tuning": pd.concat(tuning, ignore_index=True)})


def describe_fig2(metrics: dict) -> str:
    """Per panel: does BC reach the lowest final loss, and each method's tuned step size and final loss."""
    lines = []
    for panel in dict.fromkeys(r["panel"] for r in metrics["final"]):  # in the figure's order
        claim = metrics["claims"][panel]
        rows = [r for r in metrics["final"] if r["panel"] == panel]
        finals = ", ".join(f"{r['label']} (eta {r['eta']:g}) {r['final']:.2e}" for r in rows)
        verdict = "holds" if claim["bc_lowest_final"] else "does NOT hold"
        lines.append(f"{panel}: 'BC reaches the lowest final loss' {verdict} (BC/Alone = "
                     f"{claim['bc_over_alone']:.2f}); final loss: {finals}")
    return "\n".join(lines)


# -- Figs. 3-5 ----------------------------------------------------------------------------------------------
def _sweep(cfg: SweepConfig, values, label_of, users_of, method, kw, floor_fn):
    start = time.perf_counter()
    device = resolve_device(cfg.device)
    curves, rows = [], []
    for i, value in enumerate(values):  # independent draws per curve (seed + i): differences are real noise
        users = users_of(value, device)
        result = run(method, users, users.start(cfg.x0, cfg.runs), steps=cfg.steps, eta=cfg.eta,
                     generator=_generator(device, cfg.seed + i), loss=users.loss, record_every=cfg.record_every)
        n, zeta = users.n_collaborators, float(users.zeta)
        exact = theory.expected_loss(steps=cfg.steps, eta=cfg.eta, N=n, sigma=cfg.sigma, zeta=zeta, x0=cfg.x0,
                                     record_every=cfg.record_every, **kw)
        label = label_of(value)
        curves.append(summarize(result, label, exact))
        floor = theory.stationary_loss(eta=cfg.eta, N=n, sigma=cfg.sigma, zeta=zeta, **kw)
        rows.append({"label": label, "value": value, **final_stats(result, cfg.tail_fraction),
                     "theory_final": float(exact[-1]), "theory_floor": floor, "paper_floor": floor_fn(n, zeta)})
        note(f"{cfg.stage}: {label} done ({i + 1}/{len(values)} curves, {time.perf_counter() - start:.1f} s)")
    return pd.concat(curves, ignore_index=True), pd.DataFrame(rows), time.perf_counter() - start, device


def _steps_to_floor(curves: pd.DataFrame, table: pd.DataFrame, factor: float = 2.0) -> dict:
    """First recorded step after which the mean loss stays below ``factor`` x the exact floor."""
    out = {}
    for label, sub in curves.groupby("label", sort=False):
        floor = float(table.loc[table["label"] == label, "theory_floor"].iloc[0])
        above = sub["mean"].to_numpy() > factor * floor
        idx = np.nonzero(above)[0]
        out[label] = int(sub["step"].iloc[idx[-1] + 1]) if len(idx) and idx[-1] + 1 < len(sub) else \
            (0 if not len(idx) else None)
    return out


def fig3_bc_heterogeneity(cfg: ChaytiFig3Config) -> StageResult:
    """BC for each zeta: the same final level (independent of zeta), reached later for larger zeta."""
    kw = dict(a=cfg.a, b=cfg.b)
    curves, table, elapsed, device = _sweep(
        cfg, cfg.zetas, lambda z: f"zeta={z:g}", lambda z, dev: _users(cfg, dev, zeta=z), BC(cfg.a, cfg.b), kw,
        lambda n, z: float(theory.bc_loss_floor(cfg.a, cfg.b, cfg.sigma)))
    tails = table["tail"].to_numpy()
    ses = table["tail_se"].to_numpy()
    spread = max(abs(tails[i] - tails[j]) / np.hypot(ses[i], ses[j])
                 for i in range(len(tails)) for j in range(i + 1, len(tails))) if len(tails) > 1 else 0.0
    scale = f"N={cfg.n_collaborators}, eta={cfg.eta}, a={cfg.a}, b={cfg.b}, T={cfg.steps}, {cfg.runs} runs"
    metrics = _metrics(cfg, scale, table, elapsed, device,
                       claims={"max_pairwise_tail_difference_in_se": round(float(spread), 2),
                               "same_level_within_4se": bool(spread < 4),
                               "tail_relative_range": float((tails.max() - tails.min()) / tails.mean()),
                               "steps_to_2x_floor": _steps_to_floor(curves, table),
                               "peak_over_initial_loss": {label: float(sub["mean"].max() / sub["mean"].iloc[0])
                                                          for label, sub in curves.groupby("label", sort=False)}})
    return StageResult(table, metrics, DATA_LABEL, scale, frames={"curves": curves})


def fig4_wga_heterogeneity(cfg: ChaytiFig4Config) -> StageResult:
    """WGA for each zeta: the final level grows like a^2 zeta^2 / (2 mu)."""
    kw = dict(a=cfg.a)
    curves, table, elapsed, device = _sweep(
        cfg, cfg.zetas, lambda z: f"zeta={z:g}", lambda z, dev: _users(cfg, dev, zeta=z), WGA(cfg.a), kw,
        lambda n, z: float(theory.wga_loss_floor(cfg.a, z, 1.0)))
    # the zeta^2 law holds where the bias term dominates the noise term (floor within 10% of a^2 zeta^2 / 2)
    big = table[(table["paper_floor"] > 0) & (table["theory_floor"] < 1.1 * table["paper_floor"])]
    slope = float(np.polyfit(np.log(big["value"].to_numpy()), np.log(big["tail"].to_numpy()), 1)[0]) \
        if len(big) > 1 else float("nan")
    scale = f"N={cfg.n_collaborators}, eta={cfg.eta}, a={cfg.a}, T={cfg.steps}, {cfg.runs} runs"
    metrics = _metrics(cfg, scale, table, elapsed, device,
                       claims={"loglog_slope_tail_vs_zeta_bias_dominated": round(slope, 4),
                               "tail_over_paper_floor": {r["label"]: float(r["tail"] / r["paper_floor"])
                                                         for _, r in table.iterrows() if r["paper_floor"] > 0},
                               "bias_dominated_labels": list(big["label"])})
    return StageResult(table, metrics, DATA_LABEL, scale, frames={"curves": curves})


def fig5_bc_collaborators(cfg: ChaytiFig5Config) -> StageResult:
    """BC for each N with fixed a, b: the level improves with N, then saturates (the EMA noise term
    a^2 b sigma^2 (1 + 1/N) / 2 does not shrink below a^2 b sigma^2 / 2)."""
    kw = dict(a=cfg.a, b=cfg.b)
    curves, table, elapsed, device = _sweep(
        cfg, cfg.n_values, lambda n: f"N={n}", lambda n, dev: _users(cfg, dev, n_collaborators=n),
        BC(cfg.a, cfg.b), kw, lambda n, z: float(theory.bc_loss_floor(cfg.a, cfg.b, cfg.sigma)))
    tails = table.set_index("value")["tail"]
    gains = {f"{int(a)}->{int(b)}": float(tails[a] / tails[b]) for a, b in zip(tails.index[:-1], tails.index[1:])}
    scale = f"zeta={cfg.zeta:g}, eta={cfg.eta}, a={cfg.a}, b={cfg.b}, T={cfg.steps}, {cfg.runs} runs"
    metrics = _metrics(cfg, scale, table, elapsed, device, claims={"tail_ratio_between_consecutive_N": gains})
    return StageResult(table, metrics, DATA_LABEL, scale, frames={"curves": curves})


LOSS_COLUMNS = ("final", "final_se", "tail", "tail_se", "theory_final", "theory_floor", "paper_floor")


def display_table(table: pd.DataFrame, index=("label",)) -> pd.DataFrame:
    """The printed metric table: loss columns in units of 1e-3 (so a 3-decimal print keeps small losses)."""
    shown = table.set_index(list(index)).drop(columns=["value", "runs"], errors="ignore")
    return shown.rename(columns={c: f"{c} [1e-3]" for c in LOSS_COLUMNS if c in shown}).assign(
        **{f"{c} [1e-3]": shown[c] * 1e3 for c in LOSS_COLUMNS if c in shown})
