"""One seaborn style for every figure, curve plots with a band over seeds, PNG + SVG saving."""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from .io import atomic_path

FORMATS = ("png", "svg")
BASELINE = "Majority class"


def use_style() -> None:
    """The shared look: seaborn whitegrid, colour-blind palette, readable fonts, fixed DPI."""
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind",
                  rc={"figure.dpi": 100, "savefig.dpi": 150, "savefig.bbox": "tight",
                      "axes.titlesize": 11, "svg.hashsalt": "pflkit", "svg.fonttype": "none"})


def title(what: str, dataset_label: str, scale: str) -> str:
    """Figure titles always name the data that ran and the scale (e.g. "N=50, 3 seeds")."""
    return f"{what}\n{dataset_label} ({scale})"


def finish(fig, text: str) -> None:
    """Set the figure title (use ``title``) and lay the axes out below it."""
    fig.suptitle(text)
    fig.tight_layout(rect=(0, 0, 1, 0.9))


def plot_curves(ax, history: pd.DataFrame, metric: str, ylabel: str, xlabel: str = "communication round",
                baseline: bool = True):
    """Mean over seeds with a +-1 sd band per method; the majority-class baseline as a dashed line."""
    sub = history[history["metric"] == metric]
    methods = sub[sub["method"] != BASELINE]
    sns.lineplot(data=methods, x="round", y="value", hue="method", errorbar="sd", ax=ax)
    base = sub[sub["method"] == BASELINE]
    if baseline and len(base):
        ax.axhline(base["value"].mean(), color="0.3", linestyle="--", linewidth=1, label=BASELINE)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return ax


def save_figure(fig, stem: str | Path, formats=FORMATS) -> list[Path]:
    """Save ``fig`` as ``stem.png`` and ``stem.svg`` (atomically each); returns the paths."""
    stem = Path(stem)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
        paths.append(path)
    return paths


__all__ = ["use_style", "title", "finish", "accuracy_loss_figure", "plot_curves", "save_figure", "plt"]


def accuracy_loss_figure(history: pd.DataFrame, what: str, dataset_label: str, scale: str):
    """The PERM curve figures: (a) personalized accuracy, (b) personalized loss, vs rounds."""
    use_style()
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    plot_curves(ax_acc, history, "accuracy", "personalized test accuracy (fraction correct)")
    plot_curves(ax_loss, history, "loss", "personalized test loss (cross-entropy, nats)", baseline=False)
    ax_loss.set_yscale("log")
    finish(fig, title(what, dataset_label, scale))
    return fig
