"""Drawing for the PERM plot stages: heat maps of N x N matrices written as long tables, the round-time bars,
the Theorem 1 convergence, the heterogeneous-models bars, and the "why" of the PERM verdicts (Figs. 2 / 4:
each PERM variant's alpha diagnostics from metrics.json, shown beside the curves)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns

from ..plotting import BASELINE, band, finish, method_palette, panels, title


def matrix(frame: pd.DataFrame, column: str) -> np.ndarray:
    """The N x N matrix ``column`` of a long table (``experiments.perm.matrix_frame``), in display order."""
    n = int(frame["i"].max()) + 1
    out = np.full((n, n), np.nan)
    out[frame["i"].to_numpy(), frame["j"].to_numpy()] = frame[column].to_numpy()
    return out


def heatmap(ax, values: np.ndarray, colour_label: str, title: str, cmap: str = "viridis",
            order_label: str = "by majority label") -> None:
    """One client x client heat map: rows i, columns j in display order, a labelled colour bar."""
    sns.heatmap(values, ax=ax, cmap=cmap, vmin=0, square=True, cbar_kws={"label": colour_label, "shrink": 0.85},
                xticklabels=False, yticklabels=False)
    ax.set(xlabel=f"client j ({order_label})", ylabel=f"client i ({order_label})")
    ax.set_title(title, fontsize=9)


def heatmaps_figure(mats: list[tuple[np.ndarray, str, str, str]], what: str, data_label: str, scale: str,
                    order_label: str = "by majority label"):
    """Figs. 5 / 6: one heat map per (matrix, colour-bar label, panel title, colour map), two a row."""
    fig, axes = panels(len(mats), height=2.7)
    for ax, (values, colour_label, name, cmap) in zip(axes, mats):
        heatmap(ax, values, colour_label, name, cmap=cmap, order_label=order_label)
    finish(fig, title(what, data_label, scale), legend=False)
    return fig


def alpha_diagnostics(metrics: dict, lrs: dict) -> list[str]:
    """Lines that say why each PERM variant ends where it does, from metrics.json's ``alpha_zero_fraction`` and
    ``largest_step`` (the experiment's ``perm_alpha_effects``) and the other methods' step sizes (run.json
    ``config.lr``): under Alg. 1's shuffle a visit moves model i by eta * alpha_ij * N, so a small largest step
    leaves PERM's models near where they start, and alpha_ij = 0 skips that visit. Empty when the stage
    recorded none."""
    zero, step = metrics.get("alpha_zero_fraction", {}), metrics.get("largest_step", {})
    others = [v for k, v in lrs.items() if not k.startswith("perm")]
    verdict = metrics.get("claim_perm_best", {}).get("holds")
    lines = []
    for name in step:
        text = (f"{name}: largest step per visit {step[name]:.3g}" if name == "PERM"
                else f"{name}: every step {step[name]:.3g}")
        if name in zero:
            text += f"; alpha_ij = 0 for {zero[name]:.0%} of pairs"
        lines.append(text)
    if lines and others:
        lines.append(f"the other methods step with lr {min(others):g}"
                     + (f" to {max(others):g}" if max(others) != min(others) else ""))
    if lines:
        lines.insert(0, {True: "Why PERM is best", False: "Why PERM is not best"}.get(verdict, "PERM's alpha")
                     + " (a visit to client j moves model i by eta * alpha_ij * N):")
    return lines


def round_time_figure(times: pd.DataFrame, num_clients: int, what: str, data_label: str, scale: str):
    """Fig. 3: one bar per method (its colour) and workload (a panel each), the mean over the timed rounds with
    the configured band."""
    workloads = list(dict.fromkeys(times["workload"]))
    fig, axes = panels(len(workloads), height=3.0)
    for ax, workload in zip(axes, workloads):
        sub = times[times.workload == workload].assign(ms=lambda d: d.seconds * 1e3)
        names = list(dict.fromkeys(sub["method"]))
        sns.barplot(data=sub, x="method", y="ms", hue="method", palette=method_palette(names), legend=False,
                    errorbar=band(), ax=ax)
        ax.set(xlabel="method", ylabel="time per communication round (ms)", title=f"{workload}, N={num_clients}")
        ax.tick_params(axis="x", rotation=20)
    finish(fig, title(what, data_label, scale), legend=False)
    return fig


def alpha_convergence_figure(table: pd.DataFrame, shares: pd.DataFrame, final_r: int, what: str, data_label: str,
                             scale: str):
    """Theorem 1: (a) ||w^R - w*|| and the mean ||alpha_i - alpha*_i||_1 vs R (log-log; the mean over seeds, each
    seed a thin line: no +-sd band on a log axis); (b) the share of each alpha_i inside the client's own group."""
    fig, (ax_err, ax_own) = panels(2, height=3.0)
    names = {"w_error": "||w^R - w*||_2", "alpha_error_l1": "mean_i ||alpha_i - alpha*_i||_1"}
    colours = dict(zip(names, sns.color_palette("colorblind", 2)))
    positive = table[table.R > 0]
    for column, name in names.items():
        if positive["seed"].nunique() > 1:
            for _, seed in positive.groupby("seed"):
                ax_err.plot(seed["R"], seed[column], color=colours[column], linewidth=0.6, alpha=0.4)
        mean = positive.groupby("R", as_index=False)[column].mean()
        ax_err.plot(mean["R"], mean[column], color=colours[column], marker="o", label=name)
    ax_err.set(xscale="log", yscale="log", xlabel="FedAvg rounds R (exact, K = 1)",
               ylabel="distance to the optimum (log)", title="(a) distance to the optimum")
    sns.histplot(data=shares, x="own_group_mass", hue="group", bins=20, binrange=(0, 1), multiple="stack", ax=ax_own)
    legend = ax_own.get_legend()
    if legend is not None:
        for text in legend.get_texts():
            text.set_text(f"group {text.get_text()}")
    ax_own.set(xlabel="share of alpha_i inside client i's own group", ylabel="clients (count)",
               title=f"(b) own-group share at R = {final_r}")
    finish(fig, title(what, data_label, scale), ncol=2)
    return fig


def hetero_figure(clients: pd.DataFrame, costs: pd.DataFrame, what: str, data_label: str, scale: str):
    """PERM-hetero: (a) each budget group's personalized accuracy (bar = mean over seeds, with the band),
    (b) the training compute per client per round (log scale); one legend for both."""
    fig, (ax_acc, ax_cost) = panels(2, height=3.2)
    names = list(dict.fromkeys(costs["method"]))  # the methods, in the stage's order
    palette = method_palette(names + [BASELINE])
    budget_order = sorted(set(clients["budget"]), reverse=True)
    per_seed = clients.groupby(["method", "budget", "seed"], as_index=False)["accuracy"].mean()
    sns.barplot(data=per_seed, x="budget", y="accuracy", hue="method", hue_order=names + [BASELINE],
                palette=palette, errorbar=band(), ax=ax_acc, order=budget_order)
    ax_acc.set(xlabel="client budget r\n(width fraction of the server MLP)",
               ylabel="personalized test accuracy\n(fraction correct)", title="(a) accuracy per budget group")
    sns.barplot(data=costs, x="budget", y="train_mflops_per_round", hue="method", hue_order=names,
                palette=palette, ax=ax_cost, order=budget_order)
    ax_cost.set_yscale("log")
    ax_cost.set(xlabel="client budget r\n(width fraction of the server MLP)",
                ylabel="training compute per client\nper round (MFLOPs, log)", title="(b) compute per round")
    finish(fig, title(what, data_label, scale), ncol=3)
    return fig
