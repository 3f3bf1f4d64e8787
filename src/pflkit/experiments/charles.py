"""Charles & Konecny experiments: Pareto frontiers (Figs. 1-5, 7-10) and the theory checks notebook.

One config per stage (params.yaml section ``charles_fig<N>`` / ``charles_theory``) and one function
per figure returning a ``StageResult``: the long frame of (rho, Delta) points to plot, a small
summary table (the nbval reference) and metrics.json content. All numbers come from
``pflkit.theory.surrogate`` (analytic frontiers from the kappa bounds (11)/(13), simulated MAML
frontiers from random matrices, App. D.1) and, for the theory checks, from running LocalUpdate.
The figures are drawn from the written tables by the plot stages (``pflkit.figures.charles``).
"""
from __future__ import annotations

import math
import time
from typing import Annotated, Literal

import numpy as np
import pandas as pd
import torch
from pydantic import Field, model_validator

from ..algorithms.local_update import MAML, QuadraticLocalUpdate, ServerOpt, maml_theta
from ..algorithms.server_opt import MOMENTUM_KINDS, SERVER_LABELS
from ..config import CONDITION_MAX, Footprint, NonNegatives, Positives, Seed, StageConfig, raise_problems
from ..data.quadratic_clients import QuadraticModel, quadratic_clients
from ..report import StageResult, environment, table_records
from ..theory import surrogate as S

ServerName = Literal[MOMENTUM_KINDS]  # the server optimizers the surrogate covers (server_opt's)
ANALYTIC = "quadratic clients, analytic (eqs. 11/13, Table 2, 17)"
SIMULATED = "random A = b1 B^T B + b2 I, simulated (App. D.1)"


# ------------------------------------------------------------------------------------ helpers
def k_grid(k_min: float, k_max: float, num: int) -> torch.Tensor:
    """Integers log-spaced in [k_min, k_max] (duplicates removed), float64."""
    ks = torch.logspace(math.log10(k_min), math.log10(k_max), num, dtype=torch.float64).round()
    return torch.unique(ks)


def delta_at_rho(curve: pd.DataFrame, rho: float) -> float:
    """Delta of a monotone frontier at convergence rate ``rho`` (linear interpolation; NaN outside)."""
    c = curve.sort_values("rho")
    if len(c) < 2 or not c["rho"].min() <= rho <= c["rho"].max():
        return float("nan")
    return float(np.interp(rho, c["rho"].to_numpy(), c["delta"].to_numpy()))


def distance_to_frontier(points: pd.DataFrame, curve: pd.DataFrame) -> float:
    """Largest |Delta - Delta_curve(rho)| over ``points`` whose rho lies in the curve's range."""
    c = curve.sort_values("rho")
    r = points["rho"].to_numpy()
    inside = (r >= c["rho"].min()) & (r <= c["rho"].max())
    if not inside.any():
        return float("nan")
    gap = np.abs(points["delta"].to_numpy()[inside] - np.interp(r[inside], c["rho"], c["delta"]))
    return float(gap.max())


def asymmetry(curve: pd.DataFrame, num: int = 200) -> float:
    """max |Delta(rho) - rho(Delta = rho)|: 0 when the frontier is symmetric about rho = Delta
    (the heavy-ball conjecture of Sec. 5)."""
    c = curve.sort_values("rho")
    lo = max(c["rho"].min(), c["delta"].min())
    hi = min(c["rho"].max(), c["delta"].max())
    if not hi > lo:
        return float("nan")
    t = np.linspace(lo, hi, num)
    f = np.interp(t, c["rho"], c["delta"])
    d = c.sort_values("delta")
    finv = np.interp(t, d["delta"], d["rho"])
    return float(np.abs(f - finv).max())


def summarize(frame: pd.DataFrame, by: list[str], rho_ref: float = 0.5) -> pd.DataFrame:
    rows = []
    for key, part in frame.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(by, key)), "points": len(part), "rho_min": part["rho"].min(),
                     "rho_max": part["rho"].max(), "delta_min": part["delta"].min(),
                     "delta_max": part["delta"].max(), f"delta_at_rho_{rho_ref}": delta_at_rho(part, rho_ref)})
    return pd.DataFrame(rows).set_index(by)


def _result(cfg, frame, table, label, scale, start, **extra_metrics) -> StageResult:
    metrics = {"stage": cfg.stage, "data": label, "scale": scale, "summary": table_records(table),
               **extra_metrics, "runtime_s": round(time.perf_counter() - start, 3),
               "environment": environment(), "config": cfg.model_dump()}
    return StageResult(table, metrics, label, scale, frames={"frame": frame})


def label_server(frame: pd.DataFrame) -> pd.DataFrame:
    frame = frame.copy()
    frame["ServerOpt"] = frame["server_opt"].map(SERVER_LABELS)
    return frame


# ------------------------------------------------------------------------------------ configs
class FrontierConfig(StageConfig):
    """Shared by every frontier stage: mu and the K grid (integers log-spaced in [k_min, k_max])."""
    mu: float = Field(gt=0)
    k_min: float = Field(ge=1)
    k_max: float = Field(ge=1)
    num_k: int = Field(ge=2)

    @model_validator(mode="after")
    def _k_range(self):
        problems = []
        if self.k_max < self.k_min:
            problems.append(("k_min", f"{self.k_min!r} must be <= k_max ({self.k_max!r}); "
                                      f"allowed: 1 <= k_min <= k_max"))
        # the curvature range: every client's Hessian has eigenvalues in [mu, L], so mu < L
        key, Ls = ("L_values", self.L_values) if hasattr(self, "L_values") else ("L", [getattr(self, "L", math.inf)])
        if not self.mu < min(Ls):
            problems.append(("mu", f"{self.mu!r} must be < every L of {key} ({Ls if key == 'L_values' else Ls[0]!r}); "
                                   f"allowed: 0 < mu < {min(Ls):g}"))
        raise_problems(problems)
        return self

    def ks(self) -> torch.Tensor:
        return k_grid(self.k_min, self.k_max, self.num_k)

    def footprint(self) -> Footprint:
        """The frontier frames: a row per K (and per gamma, Fig. 1) and setting, a few dozen float64 columns;
        the simulated figures draw a d x d matrix per K."""
        num_gamma, dims = getattr(self, "num_gamma", 0), max(getattr(self, "dims", [1]))
        return Footprint(data=(self.num_k + num_gamma) * 8 * 64, work=self.num_k * dims * dims * 8 * 2,
                         data_key="num_gamma" if num_gamma > self.num_k else "num_k",
                         work_key="dims" if dims ** 2 >= self.num_k else "num_k")


class CharlesFig1Config(FrontierConfig):
    """Fig. 1: Theta_{1:K}, alpha = 0, GD; left gamma fixed and K varies, right K fixed and gamma varies."""
    L_values: Positives
    gamma_fixed: float = Field(gt=0)
    K_fixed: int = Field(ge=1)
    num_gamma: int = Field(ge=2)

    @model_validator(mode="after")
    def _gamma(self):
        bad = [L for L in self.L_values if not self.gamma_fixed < 1 / L]
        if bad:
            raise_problems([("gamma_fixed", f"{self.gamma_fixed!r} must be < 1/L for every L of L_values; fails for "
                                            f"L={bad}; allowed: 0 < gamma_fixed < {1 / max(self.L_values):g}")])
        return self


class CharlesFig2Config(FrontierConfig):
    """Fig. 2: Theta_{1:K}, alpha = 0, gamma = gamma_factor / L, three ServerOpts, several L."""
    L_values: Positives
    gamma_factor: float = Field(gt=0, lt=1)
    server_opts: list[ServerName] = Field(min_length=1)


class CharlesFig3Config(FrontierConfig):
    """Fig. 3: Theta_{1:K}, L fixed, gamma = gamma_factor / (L + alpha), several alpha, GD."""
    L: float = Field(gt=0)
    alphas: NonNegatives
    gamma_factor: float = Field(gt=0, lt=1)


class CharlesFig4Config(FrontierConfig):
    """Fig. 4: Theta_{1:K} with gamma_sum vs Theta_K with gamma = gamma_last_factor / (L K), three ServerOpts."""
    L: float = Field(gt=0)
    gamma_sum: float = Field(gt=0)
    gamma_last_factor: float = Field(gt=0, lt=1)
    server_opts: list[ServerName] = Field(min_length=1)


class CharlesFig9Config(FrontierConfig):
    """Fig. 9: proximal MAML-style frontiers, Theta_K, tiny gamma, several alpha (eq. 13), GD."""
    L: float = Field(gt=0)
    gamma: float = Field(gt=0)
    alphas: NonNegatives

    @model_validator(mode="after")
    def _gamma(self):
        limit = 1 / (self.L + max(self.alphas))
        if not self.gamma < limit:
            raise_problems([("gamma", f"{self.gamma!r} must be < 1/(L+alpha) for every alpha (Lemma 1); "
                                      f"allowed: 0 < gamma < {limit:g}")])
        return self


class SimulatedConfig(FrontierConfig):
    """Figs. 5, 7, 8, 10: simulated Theta_K frontiers (fresh random A per K) vs the Theta_{1:K} frontier."""
    L_values: Positives
    dims: list[Annotated[int, Field(ge=2)]] = Field(min_length=1)
    gamma: float = Field(gt=0)
    alphas: NonNegatives
    server_opts: list[ServerName] = Field(min_length=1)
    seed: Seed

    @model_validator(mode="after")
    def _gamma(self):
        problems = []
        bad = [(L, a) for L in self.L_values for a in self.alphas if not self.gamma < 1 / (L + a)]
        if bad:
            limit = 1 / (max(self.L_values) + max(self.alphas))
            problems.append(("gamma", f"{self.gamma!r} must be < 1/(L+alpha) (Lemma 1); fails for (L, alpha)={bad}; "
                                      f"allowed: 0 < gamma < {limit:g}"))
        raise_problems(problems)
        return self


class CharlesFig5Config(SimulatedConfig):
    """Fig. 5: L = 10, d in {5, 100}, GD."""


class CharlesFig7Config(SimulatedConfig):
    """Fig. 7: L in {2, 5, 10, 100}."""


class CharlesFig8Config(SimulatedConfig):
    """Fig. 8: L = 10, ServerOpt GD / Nesterov / heavy-ball."""


class CharlesFig10Config(SimulatedConfig):
    """Fig. 10: L = 10, alpha in {0, 0.5, 1, 10}."""


class CharlesTheoryConfig(StageConfig):
    """Numerical checks of Theorems 1-2, Lemmas 3-5, Table 2 and the central claim."""
    num_clients: int = Field(ge=1)
    dim: int = Field(ge=2)
    mu: float = Field(gt=0)
    L: float = Field(gt=0)
    C: float = Field(gt=0)
    examples_per_client: int = Field(ge=1)
    example_noise: float = Field(ge=0)
    batch_size: int = Field(ge=1)
    monte_carlo_runs: int = Field(ge=10)
    rounds: int = Field(ge=10)
    table2_L: float = Field(gt=0)  # L of the shared-basis clients for the Table 2 contraction check
    seed: Seed

    def footprint(self) -> Footprint:
        """Each client's d x d matrices (its A and one per example, float64, a few copies) and the Monte Carlo
        draws (runs x clients x d)."""
        def largest(*keys):
            return max(keys, key=lambda k: getattr(self, k))
        return Footprint(data=self.num_clients * self.dim ** 2 * (self.examples_per_client + 4) * 8 * 2,
                         work=self.monte_carlo_runs * self.num_clients * (self.dim * 4 + self.batch_size) * 8,
                         data_key=largest("num_clients", "dim", "examples_per_client"),
                         work_key=largest("monte_carlo_runs", "num_clients", "dim", "batch_size"))

    @model_validator(mode="after")
    def _mu_L(self):
        problems = []
        if not self.mu < self.L:
            problems.append(("mu", f"{self.mu!r} must be < L ({self.L!r}); allowed: 0 < mu < L"))
        for key in ("L", "table2_L"):
            L = getattr(self, key)
            if not (self.mu if key == "table2_L" else -math.inf) <= L <= CONDITION_MAX * self.mu:
                problems.append((key, f"{L!r} must lie in [mu, {CONDITION_MAX:g} x mu] = [{self.mu!r}, "
                                      f"{CONDITION_MAX * self.mu:g}]: the clients' curvatures span [mu, {key}] and "
                                      f"their systems are solved in float64 (condition number at most "
                                      f"{CONDITION_MAX:g})"))
        raise_problems(problems)
        return self


# ------------------------------------------------------------------------------- figures 1-4, 9
def fig1(cfg: CharlesFig1Config) -> StageResult:
    """Fig. 1: (rho, Delta) for Theta_{1:K}, alpha = 0, GD: gamma fixed / K varies, and K fixed / gamma varies."""
    start = time.perf_counter()
    frames = []
    for L in cfg.L_values:
        left = S.frontier(cfg.mu, L, alpha=0.0, gamma=cfg.gamma_fixed, K=cfg.ks(), theta="sum")
        left["panel"] = f"gamma = {cfg.gamma_fixed:g}, K varies"
        frac = torch.cat([torch.logspace(-5, -1, cfg.num_gamma // 2, dtype=torch.float64),
                          torch.linspace(0.1, 1, cfg.num_gamma - cfg.num_gamma // 2 + 1, dtype=torch.float64)[1:-1]])
        right = S.frontier(cfg.mu, L, alpha=0.0, gamma=frac / L, K=cfg.K_fixed, theta="sum")
        right["panel"] = f"K = {cfg.K_fixed}, gamma varies in (0, 1/L)"
        for f in (left, right):
            f["L"] = L
            frames.append(f)
    frame = pd.concat(frames, ignore_index=True)
    table = summarize(frame, ["panel", "L"])
    scale = f"mu={cfg.mu:g}, L in {cfg.L_values}, {len(cfg.ks())} K values in [{cfg.k_min:g}, {cfg.k_max:g}]"
    return _result(cfg, frame, table, ANALYTIC, scale, start)


def fig2(cfg: CharlesFig2Config) -> StageResult:
    """Fig. 2: Theta_{1:K}, gamma = 1/(2L), ServerOpt GD / Nesterov / heavy-ball, several L."""
    start = time.perf_counter()
    frame = pd.concat([S.frontier(cfg.mu, L, alpha=0.0, gamma=cfg.gamma_factor / L, K=cfg.ks(), theta="sum",
                                  server_opt=cfg.server_opts).assign(L=L) for L in cfg.L_values], ignore_index=True)
    frame = label_server(frame)
    table = summarize(frame, ["L", "ServerOpt"])
    table["asymmetry"] = [asymmetry(part) for _, part in frame.groupby(["L", "ServerOpt"], sort=False)]
    hb = table.xs("heavy-ball", level="ServerOpt")["asymmetry"] if "heavy_ball" in cfg.server_opts else None
    scale = f"mu={cfg.mu:g}, gamma={cfg.gamma_factor:g}/L, {len(cfg.ks())} K values in [{cfg.k_min:g}, {cfg.k_max:g}]"
    return _result(cfg, frame, table, ANALYTIC, scale, start,
                   heavy_ball_max_asymmetry=None if hb is None else float(hb.max()))


def fig3(cfg: CharlesFig3Config) -> StageResult:
    """Fig. 3: Theta_{1:K}, gamma = 1/(2(L+alpha)), alpha varies, GD: each alpha > 0 frontier lies on alpha = 0's."""
    start = time.perf_counter()
    frame = pd.concat([S.frontier(cfg.mu, cfg.L, alpha=a, gamma=cfg.gamma_factor / (cfg.L + a), K=cfg.ks(),
                                  theta="sum") for a in cfg.alphas], ignore_index=True)
    table = summarize(frame, ["alpha"])
    # reference: the alpha = 0 frontier traced over the whole (gamma, K) range (its dense envelope)
    base = S.frontier(cfg.mu, cfg.L, alpha=0.0, gamma=cfg.gamma_factor / cfg.L,
                      K=k_grid(1, 1e9, 4000), theta="sum")
    table["distance_to_alpha0_frontier"] = [distance_to_frontier(part, base)
                                            for _, part in frame.groupby("alpha", sort=False)]
    scale = f"mu={cfg.mu:g}, L={cfg.L:g}, {len(cfg.ks())} K values in [{cfg.k_min:g}, {cfg.k_max:g}]"
    return _result(cfg, frame, table, ANALYTIC, scale, start)


def fig4(cfg: CharlesFig4Config) -> StageResult:
    """Fig. 4: FedAvg (Theta_{1:K}, gamma fixed) vs MAML-style (Theta_K, gamma = 1/(2LK)), three ServerOpts."""
    start = time.perf_counter()
    ks = cfg.ks()
    fedavg = S.frontier(cfg.mu, cfg.L, alpha=0.0, gamma=cfg.gamma_sum, K=ks, theta="sum", server_opt=cfg.server_opts)
    maml = S.frontier(cfg.mu, cfg.L, alpha=0.0, gamma=cfg.gamma_last_factor / (cfg.L * ks), K=ks, theta="last",
                      server_opt=cfg.server_opts)
    fedavg["method"], maml["method"] = "FedAvg (Theta_1:K)", "MAML (Theta_K)"
    frame = label_server(pd.concat([fedavg, maml], ignore_index=True))
    table = summarize(frame, ["ServerOpt", "method"])
    dist = {}
    for opt in cfg.server_opts:
        f = frame[frame.server_opt == opt]
        dist[SERVER_LABELS[opt]] = distance_to_frontier(f[f.theta == "last"], f[f.theta == "sum"])
    table["maml_distance_to_fedavg"] = [dist[o] if m.startswith("MAML") else float("nan")
                                        for o, m in table.index]
    scale = f"mu={cfg.mu:g}, L={cfg.L:g}, {len(ks)} K values in [{cfg.k_min:g}, {cfg.k_max:g}]"
    return _result(cfg, frame, table, ANALYTIC, scale, start)


def fig9(cfg: CharlesFig9Config) -> StageResult:
    """Fig. 9: Theta_K with gamma = 1e-7 and several alpha (Lemma 4 range gamma < 1/(KL + alpha)), GD."""
    start = time.perf_counter()
    frame = pd.concat([S.frontier(cfg.mu, cfg.L, alpha=a, gamma=cfg.gamma, K=cfg.ks(), theta="last")
                       for a in cfg.alphas], ignore_index=True)
    table = summarize(frame, ["alpha"])
    base = frame[frame.alpha == 0.0] if (frame.alpha == 0.0).any() else None
    if base is not None:
        table["distance_to_alpha0_frontier"] = [distance_to_frontier(p, base)
                                                for _, p in frame.groupby("alpha", sort=False)]
    scale = (f"mu={cfg.mu:g}, L={cfg.L:g}, gamma={cfg.gamma:g}, "
             f"{len(cfg.ks())} K values in [{cfg.k_min:g}, {cfg.k_max:g}]")
    return _result(cfg, frame, table, ANALYTIC, scale, start)


# ------------------------------------------------------------------- simulated MAML (5, 7, 8, 10)
def simulated(cfg: SimulatedConfig) -> StageResult:
    """Simulated Theta_K (MAML) frontiers for each (L, alpha, d, ServerOpt) plus the analytic
    Theta_{1:K} (FedAvg) frontier with the same gamma; reports the d-max MAML curve's cusp (its
    smallest rho) against the alpha = 0 FedAvg curve's Delta-axis intercept (one-shot averaging,
    K -> inf); ``fedavg_end_delta`` is the drawn FedAvg curve's Delta at the largest K (smaller when alpha > 0)."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed)
    ks = cfg.ks()
    frames, cusps = [], []
    for L in cfg.L_values:
        for a in cfg.alphas:
            fa = S.frontier(cfg.mu, L, alpha=a, gamma=cfg.gamma, K=ks, theta="sum", server_opt=cfg.server_opts)
            fa["method"], fa["d"] = "FedAvg (Theta_1:K)", 0
            frames.append(fa.assign(L=L))
            for d in cfg.dims:
                sim = S.simulated_maml_frontier(cfg.mu, L, d, alpha=a, gamma=cfg.gamma, K=ks, generator=gen,
                                                server_opt=cfg.server_opts)
                sim["method"] = f"MAML (Theta_K), d={d}"
                frames.append(sim.assign(L=L))
            big = frames[-1]
            for opt in cfg.server_opts:
                part = big[big.server_opt == opt]
                cusp = part.loc[part["rho"].idxmin()]
                fa_opt = fa[fa.server_opt == opt]
                intercept = float(fa_opt.loc[fa_opt["K"].idxmax(), "delta"])
                one_shot = S.one_shot_delta(cfg.mu, L)  # the alpha = 0 FedAvg frontier's Delta-axis intercept
                cusps.append({"L": L, "alpha": a, "ServerOpt": SERVER_LABELS[opt], "d": max(cfg.dims),
                              "cusp_K": float(cusp["K"]), "cusp_rho": float(cusp["rho"]),
                              "cusp_delta": float(cusp["delta"]), "fedavg_end_delta": intercept,
                              "one_shot_delta": one_shot, "abs_difference": abs(float(cusp["delta"]) - one_shot)})
    frame = label_server(pd.concat(frames, ignore_index=True))
    table = pd.DataFrame(cusps).set_index(["L", "alpha", "ServerOpt"])
    scale = (f"mu={cfg.mu:g}, gamma={cfg.gamma:g}, d in {cfg.dims}, {len(ks)} K values in "
             f"[{cfg.k_min:g}, {cfg.k_max:g}], seed {cfg.seed}")
    return _result(cfg, frame, table, SIMULATED, scale, start,
                   max_cusp_abs_difference=float(table["abs_difference"].max()))


# ----------------------------------------------------------------------------- theory checks
def _theorem1(cfg: CharlesTheoryConfig, qc, exact_qc, x: torch.Tensor, gen: torch.Generator,
              thetas: dict) -> pd.DataFrame:
    """Theorem 1: LocalUpdate's expected client update is the surrogate's gradient (Monte Carlo z-scores and the exact
    computation)."""
    rows = []
    R = cfg.monte_carlo_runs
    for name, th in thetas.items():
        for alpha in (0.0, 0.5):
            g = 0.5 / (th.K * cfg.L + alpha) if th.kind == "last" else 0.5 / (cfg.L + alpha)
            want = S.surrogate_grad(qc.A, qc.c, x, alpha, g, th)
            mc = QuadraticLocalUpdate(theta=th, gamma=g, alpha=alpha, batch_size=cfg.batch_size)
            ids = torch.arange(qc.num_clients).repeat_interleave(R)
            q = mc.client_updates(qc, ids, x, gen).reshape(qc.num_clients, R, -1)
            z = ((q.mean(1) - want).abs() / (q.std(1) / math.sqrt(R))).max()
            ex = QuadraticLocalUpdate(theta=th, gamma=g, alpha=alpha).client_updates(
                exact_qc, torch.arange(exact_qc.num_clients), x)
            err = (ex - S.surrogate_grad(exact_qc.A, exact_qc.c, x, alpha, g, th)).abs().max()
            zcrit = float(torch.distributions.Normal(0, 1).icdf(torch.tensor(1 - 0.01 / (2 * want.numel()))))
            rows.append({"Theta": name, "alpha": alpha, "gamma": g, "MC runs": R, "max |z|": float(z),
                         "99% bound": zcrit, "MC holds": bool(z < zcrit), "exact max abs error": float(err)})
    return pd.DataFrame(rows).set_index(["Theta", "alpha"])


def _theorem2(cfg: CharlesTheoryConfig, exact_qc, x: torch.Tensor, gamma: float, gen: torch.Generator) -> pd.DataFrame:
    """Theorem 2: MAML's client update is the surrogate gradient of Theta_2K+1 (FOMAML's: Theta_K+1)."""
    rows = []
    model, data64 = QuadraticModel(cfg.dim, dtype=torch.float64), exact_qc.to_federated(dtype=torch.float64)
    for K in (1, 2, 5):
        q = MAML(model, inner_steps=K, gamma=gamma, batch_size=1).client_updates(
            {"x": x}, data64, torch.arange(exact_qc.num_clients), gen)["x"]
        want = S.surrogate_grad(exact_qc.A, exact_qc.c, x, 0.0, gamma, maml_theta(K))
        fo = S.surrogate_grad(exact_qc.A, exact_qc.c, x, 0.0, gamma, S.theta_K(K + 1))
        rows.append({"K": K, "max |MAML - grad f~(Theta_2K+1)|": float((q - want).abs().max()),
                     "max |MAML - grad f~(Theta_K+1)| (FOMAML)": float((q - fo).abs().max())})
    return pd.DataFrame(rows).set_index("K")


def _lemmas34(cfg: CharlesTheoryConfig, qc) -> pd.DataFrame:
    """Lemmas 3-4: the surrogate's condition number against bounds (11) and (13)."""
    rows = []
    tight = torch.diag(torch.tensor([cfg.L, cfg.mu], dtype=torch.float64)).unsqueeze(0)
    for alpha in (0.0, 1.0):
        for K in (2, 10, 100):
            gs = 0.5 / (cfg.L + alpha)
            gl = 0.5 / (K * cfg.L + alpha)
            b11 = float(S.kappa_bound_sum(cfg.mu, cfg.L, alpha, gs, K))
            b13 = float(S.kappa_bound_last(cfg.mu, cfg.L, alpha, gl, K))
            rows.append({"alpha": alpha, "K": K,
                         "kappa(Theta_1:K) / bound (11)": float(S.kappa(qc.A, alpha, gs, S.theta_1_to_K(K))) / b11,
                         "B.3 client / bound (11)": float(S.kappa(tight, alpha, gs, S.theta_1_to_K(K))) / b11,
                         "kappa(Theta_K) / bound (13)": float(S.kappa(qc.A, alpha, gl, S.theta_K(K))) / b13,
                         "B.3 client / bound (13)": float(S.kappa(tight, alpha, gl, S.theta_K(K))) / b13})
    return pd.DataFrame(rows).set_index(["alpha", "K"])


def _lemma5(cfg: CharlesTheoryConfig, qc, thetas: dict, x_star: torch.Tensor) -> pd.DataFrame:
    """Lemma 5: the surrogate minimizer's distance to x* against its bound."""
    rows = []
    for name, th in thetas.items():
        g = 0.5 / (th.K * cfg.L) if th.kind == "last" else 0.5 / cfg.L
        gap = float((S.surrogate_minimizer(qc.A, qc.c, 0.0, g, th) - x_star).norm())
        rows.append({"Theta": name, "gamma": g, "|x*(a,g,Theta) - x*|": gap,
                     "Lemma 5 bound": float(S.lemma5_bound(qc.A, 0.0, g, th, qc.C))})
    lem5 = pd.DataFrame(rows).set_index("Theta")
    lem5["holds"] = lem5.iloc[:, 1] <= lem5["Lemma 5 bound"]
    return lem5


def _surrogate_mu_L(A: torch.Tensor, alpha: float, gamma: float, th) -> tuple[float, float]:
    """(mu~, L~): the surrogate Hessians' smallest and largest eigenvalues, averaged over the clients (what
    ``ServerOpt.tuned`` takes)."""
    lam = torch.linalg.eigvalsh(A)
    qa = S.distortion_eigenvalues(lam, alpha, gamma, th) * lam
    return float(qa.min(-1).values.mean()), float(qa.max(-1).values.mean())


def _table2(cfg: CharlesTheoryConfig, gen: torch.Generator) -> pd.DataFrame:
    """Table 2: each ServerOpt's measured contraction against its rate, on clients with shared eigenvectors."""
    rows = []
    # shared eigenvectors: kappa (eq. 9) is the surrogate Hessian's condition number, so Table 2 is exact;
    # a large L gives long asymptotic windows (momentum's double root adds a slowly vanishing t factor)
    shared = quadratic_clients(cfg.num_clients, cfg.dim, mu=cfg.mu, L=cfg.table2_L, C=cfg.C, shared_basis=True,
                               generator=gen)
    th, g = S.theta_1_to_K(10), 0.2 / cfg.table2_L
    mu_t, L_t = _surrogate_mu_L(shared.A, 0.0, g, th)
    kap = float(S.kappa(shared.A, 0.0, g, th))
    x_sur = S.surrogate_minimizer(shared.A, shared.c, 0.0, g, th)
    x0 = 3 * torch.randn(cfg.dim, generator=gen, dtype=torch.float64)
    for opt in S.SERVER_OPTS:
        xs = QuadraticLocalUpdate(theta=th, gamma=g, server_opt=ServerOpt.tuned(opt, mu_t, L_t)).run(shared, x0, 3000)
        err = (xs - x_sur).norm(dim=1)
        hi = int((err > 1e-10 * err[0]).nonzero().max())
        lo = hi // 2
        measured = float((err[hi] / err[lo]) ** (1.0 / max(hi - lo, 1)))
        rho = float(S.rate(kap, opt))
        rows.append({"ServerOpt": SERVER_LABELS[opt], "kappa": kap, "rho (Table 2)": rho,
                     "measured contraction": measured, "relative difference": measured / rho - 1})
    return pd.DataFrame(rows).set_index("ServerOpt")


def _central(cfg: CharlesTheoryConfig, qc, x_star: torch.Tensor) -> pd.DataFrame:
    """Corollary 1: where FedAvg, FedProx, FOMAML and FedSGD end, against the bound."""
    rows = []
    for name, th, alpha, g in [("FedAvg Theta_1:10", S.theta_1_to_K(10), 0.0, 0.05),
                               ("FedProx Theta_1:10", S.theta_1_to_K(10), 1.0, 0.05),
                               ("FOMAML Theta_4", S.theta_K(4), 0.0, 0.02),
                               ("FedSGD (gamma = 0)", S.theta_1_to_K(10), 0.0, 0.0)]:
        mu_t, L_t = _surrogate_mu_L(qc.A, alpha, g, th)
        xs = QuadraticLocalUpdate(theta=th, gamma=g, alpha=alpha, server_opt=ServerOpt.tuned("gd", mu_t, L_t)).run(
            qc, torch.zeros(cfg.dim), cfg.rounds)
        x_sur = S.surrogate_minimizer(qc.A, qc.c, alpha, g, th)
        kb = float((S.kappa_bound_sum if th.kind == "sum" else S.kappa_bound_last)(cfg.mu, cfg.L, alpha, g, th.K))
        cor1 = S.corollary1_bound(cfg.rounds, float(S.rate(kb, "gd")), float((xs[0] - x_sur).norm()), qc.C, kb,
                                  cfg.L / cfg.mu)
        rows.append({"method": name, "|x_T - x*(a,g,Theta)|": float((xs[-1] - x_sur).norm()),
                     "|x_T - x*|": float((xs[-1] - x_star).norm()),
                     "|x*(a,g,Theta) - x*|": float((x_sur - x_star).norm()), "Corollary 1 bound": cor1})
    return pd.DataFrame(rows).set_index("method")


def theory(cfg: CharlesTheoryConfig) -> StageResult:
    """Tables checking Theorem 1 (Monte Carlo and exact), Theorem 2, Lemmas 3-5, Table 2 and Corollary 1
    on random quadratic clients. Returns {name: table} plus 'metrics' (a dict)."""

    start = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed)
    qc = quadratic_clients(cfg.num_clients, cfg.dim, mu=cfg.mu, L=cfg.L, C=cfg.C,
                           examples_per_client=cfg.examples_per_client, example_noise=cfg.example_noise,
                           generator=gen)
    exact_qc = quadratic_clients(cfg.num_clients, cfg.dim, mu=cfg.mu, L=cfg.L, C=cfg.C, generator=gen)
    x = torch.randn(cfg.dim, generator=gen, dtype=torch.float64)
    gamma = 0.5 / (cfg.L + 1.0)
    thetas = {"Theta_1:5": S.theta_1_to_K(5), "Theta_4": S.theta_K(4),
              "(0.3, 0, 1.5, 0.7)": S.Theta.of([0.3, 0, 1.5, 0.7])}
    thm1 = _theorem1(cfg, qc, exact_qc, x, gen, thetas)
    thm2 = _theorem2(cfg, exact_qc, x, gamma, gen)
    lem34 = _lemmas34(cfg, qc)
    x_star = qc.minimizer()
    lem5 = _lemma5(cfg, qc, thetas, x_star)
    table2 = _table2(cfg, gen)  # draws from gen after the tables above, as before
    central = _central(cfg, qc, x_star)
    frames = {"theorem1": thm1, "theorem2": thm2, "lemmas34": lem34, "lemma5": lem5, "table2": table2,
              "central": central}
    metrics = {"stage": cfg.stage, "data": f"{cfg.num_clients} random quadratic clients, d={cfg.dim}",
               **{k: table_records(v) for k, v in frames.items()},
               "runtime_s": round(time.perf_counter() - start, 3), "environment": environment(),
               "config": cfg.model_dump()}
    return StageResult(thm1, metrics, metrics["data"], f"{cfg.rounds} rounds, {cfg.monte_carlo_runs} Monte Carlo runs",
                       frames=frames)
