"""Drawing for the Flower equivalence plot stage: curves per engine and each engine's difference from in-process."""
from __future__ import annotations

import pandas as pd

from .. import plotting
from ..flower import ENGINE_NAMES

#: how each engine is drawn over the methods' colours: (line style, marker, marker size, line width)
ENGINE_STYLES = {"in-process": ("-", "", 0, 2.5), "loopback": ("", "x", 7, 0),
                 "simulation": (":", "o", 7, 1.2), "deployment": ("--", "s", 5, 1.2)}


def figure(history: pd.DataFrame, differences: pd.DataFrame, tolerance: float, data_label: str, scale: str):
    """Left: personalized test accuracy per round, each method in its colour, each engine in its line and
    marker (means over seeds). Right: every engine's accuracy minus in-process, with the +-tolerance band."""
    acc = history[history["metric"] == "accuracy"].groupby(["engine", "method", "round"], sort=False)["value"].mean()
    acc = acc.reset_index()
    diff = differences[differences["metric"] == "accuracy"]
    diff = diff.groupby(["engine", "method", "round"], sort=False)["difference"].mean().reset_index()
    colours = plotting.method_palette(acc["method"].unique())
    fig, (ax, ax_diff) = plotting.panels(2, height=3.2)
    for (engine, method), part in acc.groupby(["engine", "method"], sort=False):
        line, marker, size, width = ENGINE_STYLES[engine]
        ax.plot(part["round"], part["value"], linestyle=line or "none", marker=marker or None, markersize=size,
                linewidth=width, color=colours[method], markerfacecolor="none",
                label=f"{method}: {ENGINE_NAMES[engine]}")
    for (engine, method), part in diff.groupby(["engine", "method"], sort=False):
        line, marker, size, width = ENGINE_STYLES[engine]
        ax_diff.plot(part["round"], part["difference"], linestyle=line or "none", marker=marker or "o",
                     markersize=size or 5, linewidth=width, color=colours[method], markerfacecolor="none",
                     label=f"{method}: {ENGINE_NAMES[engine]}")
    ax_diff.axhspan(-tolerance, tolerance, color="#999999", alpha=0.25, label=f"within ±{tolerance:g} (the bar)")
    ax_diff.axhline(0.0, color="#444444", linewidth=0.8)
    ax_diff.set_yscale("symlog", linthresh=1e-6)
    worst = float(diff["difference"].abs().max()) if len(diff) else 0.0
    ax_diff.set_ylim(-max(1e-3, 2 * worst), max(1e-3, 2 * worst))
    ax.set_xlabel("communication round")
    ax.set_ylabel("personalized test accuracy\n(fraction correct)")
    ax_diff.set_xlabel("communication round")
    ax_diff.set_ylabel("accuracy minus in-process (symlog)")
    plotting.finish(fig, plotting.title("Flower vs the batched in-process engine: personalized test accuracy",
                                        data_label, scale), ncol=2)
    return fig
