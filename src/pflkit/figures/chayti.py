"""Drawing for the Chayti et al. plot stages: loss curves over steps with their exact expectation (Figs. 2-5)
and the speedup heat map with its simulated check (Fig. 1), from the tables the compute stages wrote
(``curves.csv``, ``final.csv``, ``heatmap.csv``, ``check.csv``) and their run.json."""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import LogNorm

from matplotlib.patches import Patch

from ..plotting import METHOD_STYLES, finish, key_handles, method_palette, panels, series_palette, title
from ..theory import speedup as theory

FLOOR_COLOUR = "0.4"
#: what the line styles and bands mean, in every figure's one legend
KEY = (("mean of runs", dict(color="0.2")), ("exact expectation", dict(color="0.2", linestyle="--", linewidth=1)))


def colours(labels) -> dict:
    """Each curve's colour: a method's fixed one (``plotting.METHOD_STYLES``: Fig. 2's caption fixes Alone blue,
    WGA green, BC orange), else one colour-blind-safe colour per swept value."""
    labels = list(dict.fromkeys(labels))
    if all(label in METHOD_STYLES for label in labels):
        return method_palette(labels)
    return series_palette(labels)


def loss_axes(ax, curves: pd.DataFrame, labels=None, theory_style: str = "--", names: dict | None = None):
    """Plot mean loss per curve (solid) with the 10-90% band over runs and the exact expectation (dashed);
    each curve in its colour (:func:`colours`), shown as ``names[label]`` when given."""
    labels = list(dict.fromkeys(curves["label"])) if labels is None else labels
    names = names or {}
    for label, color in colours(labels).items():  # solid: dashed lines are the theory
        sub = curves[curves["label"] == label]
        ax.plot(sub["step"], sub["mean"], color=color, label=names.get(label, label))
        ax.fill_between(sub["step"], sub["q10"], sub["q90"], color=color, alpha=0.2, linewidth=0)
        if sub["theory"].notna().all():
            ax.plot(sub["step"], sub["theory"], color=color, linestyle=theory_style, linewidth=1)
    ax.set_yscale("log")
    ax.set_xlabel("step t (one gradient per user per step)")
    ax.set_ylabel("loss f_0(x_t) - f_0* (log scale)")
    return ax


def key_entries() -> tuple:
    """The legend's entries for the encodings: solid mean, dashed exact, the 10-90% band."""
    return (*key_handles(*KEY), (Patch(color="0.2", alpha=0.2, linewidth=0), "10-90% of runs"))


def sweep_figure(curves: pd.DataFrame, final: pd.DataFrame, floor_label: str, what: str, data_label: str,
                 scale: str):
    """Figs. 3-5: one loss curve per swept value (:func:`loss_axes`) and the paper-level floor
    (``final.paper_floor``) dotted: one grey line when every curve shares it, else one per curve in its colour."""
    fig, (ax,) = panels(1, height=3.4, width=6.0)
    loss_axes(ax, curves)
    floors = final.set_index("label")["paper_floor"]
    if floors.nunique() == 1:
        ax.axhline(floors.iloc[0], color=FLOOR_COLOUR, linestyle=":", linewidth=1, label=floor_label)
        extra = ()
    else:
        for label, color in colours(list(floors.index)).items():
            ax.axhline(floors[label], color=color, linestyle=":", linewidth=1)
        extra = key_handles((floor_label, dict(color=FLOOR_COLOUR, linestyle=":")))
    finish(fig, title(what, data_label, scale), extra=(*key_entries(), *extra), ncol=3)
    return fig


def convergence_figure(curves: pd.DataFrame, final: pd.DataFrame, panels_: list[str], what: str, data_label: str,
                       scale: str):
    """Fig. 2: per panel, Alone / WGA / BC loss curves (the caption's colours), each panel titled by its setting
    and the step sizes (``final.eta``)."""
    fig, axes = panels(len(panels_), height=3.2)
    for ax, panel in zip(axes, panels_):
        sub = curves[curves["panel"] == panel]
        etas = final[final["panel"] == panel].set_index("label")["eta"]
        loss_axes(ax, sub)
        ax.set_title(f"{panel}\neta: " + ", ".join(f"{m} {eta:g}" for m, eta in etas.items()), fontsize=9)
    finish(fig, title(what, data_label, scale), extra=key_entries(), ncol=3)
    return fig


def speedup_map(ax, fig, heatmap: pd.DataFrame) -> None:
    """Fig. 1 (a): S(N, tau) over the (tau, N) grid of ``heatmap`` (long: N, tau, speedup), log axes, contours."""
    grid = heatmap.pivot(index="N", columns="tau", values="speedup").sort_index().sort_index(axis=1)
    n_grid, tau_grid, speedup = grid.index.to_numpy(), grid.columns.to_numpy(), grid.to_numpy()
    mesh = ax.pcolormesh(tau_grid, n_grid, speedup, norm=LogNorm(vmin=1, vmax=speedup.max()), shading="auto",
                         cmap="viridis", rasterized=True)
    levels = [lv for lv in (1.1, 2, 5, 10, 50, 100, 500) if lv < speedup.max()]
    contours = ax.contour(tau_grid, n_grid, speedup, levels=levels, colors="white", linewidths=0.8)
    ax.clabel(contours, fmt="%g", fontsize=8)
    ax.set(xscale="log", yscale="log", xlabel="cumulative bias tau\n= mu T zeta^2 / (L sigma^2)",
           ylabel="number of collaborators N")
    fig.colorbar(mesh, ax=ax, label="speedup S(N, tau) over training alone")
    ax.set_title("(a) S(N, tau) = 1 + N / (1 + N tau)")


def speedup_check(ax, check: pd.DataFrame, eta: float, runs: int) -> None:
    """Fig. 1 (b): measured speedup per (N, tau) with +-2 SE against S(N, tau) (lines, a decade beyond
    the checked taus on each side)."""
    taus = np.logspace(np.log10(check["tau"].min()) - 1, np.log10(check["tau"].max()) + 1, 200)
    ns = list(dict.fromkeys(check["N"]))
    for color, n in zip(sns.color_palette("colorblind", len(ns)), ns):
        ax.plot(taus, theory.wga_speedup(n, taus), color=color, label=f"N={n}: theory")
        sub = check[check["N"] == n]
        ax.errorbar(sub["tau"], sub["speedup_measured"], yerr=2 * sub["speedup_se"], fmt="o", color=color,
                    capsize=3, label=f"N={n}: simulated WGA(a*) (±2 SE)")
    ax.set(xscale="log", yscale="log", xlabel="cumulative bias tau", ylabel="speedup\n(Alone loss / WGA(a*) loss)")
    ax.set_title(f"(b) simulated check (eta={eta}, {runs} runs a point)")


def speedup_figure(heatmap: pd.DataFrame, check: pd.DataFrame, eta: float, runs: int, what: str,
                   data_label: str, scale: str):
    """Fig. 1: (a) the speedup heat map, (b) its simulated check."""
    fig, (ax_map, ax_check) = panels(2, height=3.2)
    speedup_map(ax_map, fig, heatmap)
    speedup_check(ax_check, check, eta, runs)
    finish(fig, title(what, data_label, scale))
    return fig
