"""Drawing for the Charles & Konecny plot stages: Pareto frontiers in the (rho, Delta) unit square (Figs. 1-5,
7-10) and the neural-network curves vs rounds (Figs. 6/11, 12, 13), from the tables the compute stages wrote
(``frontier.csv``, ``history.csv``) and their run.json."""
from __future__ import annotations

import pandas as pd
import seaborn as sns

from ..plotting import finish, plt, title

RHO_LABEL = "rate rho (error factor per round)"
DELTA_LABEL = "suboptimality Delta (eq. 17, x 8C)"
ROUND_LABEL = "communication round"
TRAIN_LOSS_LABEL = "training loss (cross-entropy, nats)"


# ------------------------------------------------------------------------------------ frontiers
def frontier_axes(ax, title: str | None = None):
    """Unit-square axes with the frontier labels."""
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(RHO_LABEL)
    ax.set_ylabel(DELTA_LABEL)
    if title:
        ax.set_title(title)
    return ax


def labelled(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    """``frame`` with the numbers of ``column`` as legend labels (``alpha = 0.5``)."""
    return frame.assign(**{column: frame[column].map(lambda v: f"{column} = {v:g}")})


def plot_curves(ax, frame: pd.DataFrame, hue: str, style: str | None = None, title: str | None = None):
    """Analytic frontiers: one line per curve, drawn in the order of its K (or gamma) grid."""
    sns.lineplot(data=frame, x="rho", y="delta", hue=hue, style=style, sort=False, estimator=None, ax=ax,
                 palette="colorblind")
    return frontier_axes(ax, title)


def plot_simulated(ax, frame: pd.DataFrame, title: str | None = None):
    """Simulated MAML points (one colour per d) over the analytic FedAvg frontier (black line)."""
    fedavg = frame[frame["d"] == 0]
    maml = frame[frame["d"] > 0]
    ax.plot(fedavg["rho"], fedavg["delta"], color="black", linewidth=1.5, label="FedAvg (Theta_1:K)")
    sns.scatterplot(data=maml, x="rho", y="delta", hue="method", s=6, linewidth=0, ax=ax, palette="colorblind")
    ax.legend(fontsize=8, markerscale=2)
    return frontier_axes(ax, title)


def simulated_figure(frame: pd.DataFrame, facet: str | None, what: str, data_label: str, scale: str):
    """Figs. 5, 7, 8, 10: one panel of :func:`plot_simulated` per value of ``facet`` (None: one panel)."""
    groups = list(frame.groupby(facet, sort=False)) if facet else [(None, frame)]
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups), 4.6), squeeze=False)
    for ax, (key, part) in zip(axes[0], groups):
        plot_simulated(ax, part, title=None if key is None else f"{facet} = {key}")
    finish(fig, title(what, data_label, scale))
    return fig


# ------------------------------------------------------------------------------- neural networks
def plot_loss_curves(ax, history: pd.DataFrame, hue: str = "gamma", title: str | None = None,
                     metric: str = "train_loss", ylabel: str = TRAIN_LOSS_LABEL):
    """One line per ``hue`` value of ``metric`` vs rounds (a run_grid history)."""
    sub = history[history["metric"] == metric].copy()
    sub[hue] = sub[hue].map(lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    sns.lineplot(data=sub, x="round", y="value", hue=hue, marker="o", markersize=3, ax=ax)
    ax.set_xlabel(ROUND_LABEL)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8, title=hue)
    return ax


def task_labels(run_info: dict) -> dict[str, str]:
    """Task -> the dataset that ran for it, in the stage's task order (run.json ``task_labels``)."""
    return {entry["task"]: entry["label"] for entry in run_info["task_labels"]}


def loss_by_task_figure(history: pd.DataFrame, labels: dict[str, str], what: str, scale: str):
    """Figs. 12, 13: training loss vs rounds, one panel per task (titled by its dataset), one line per gamma;
    the scale's task parts on separate lines of the title."""
    fig, axes = plt.subplots(1, len(labels), figsize=(5.2 * len(labels), 5.2), squeeze=False)
    for ax, (name, label) in zip(axes[0], labels.items()):
        plot_loss_curves(ax, history[history["task"] == name], "gamma", title=label)
    finish(fig, title(what, ", ".join(labels.values()), scale.replace("; ", "\n")))
    return fig


#: Figs. 6/11: the two panels of the tuned curves (history column ``panel``) and their titles
FIG6_PANELS = (("server", "ServerOpt (alpha = 0)"), ("alpha", "alpha (no momentum)"))
ACCURACY_LABEL = "test accuracy (fraction correct)"
TEST_LOSS_LABEL = "test loss (cross-entropy, nats)"


def fig6_figure(history: pd.DataFrame, what: str, data_label: str, scale: str):
    """Fig. 6: the tuned curves' test accuracy, server momentum (left) and alpha (right)."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (panel, name) in zip(axes, FIG6_PANELS):
        plot_loss_curves(ax, history[history["panel"] == panel], "variant", title=name, metric="test_accuracy",
                         ylabel=ACCURACY_LABEL)
    finish(fig, title(what, data_label, scale))
    return fig


def fig11_figure(history: pd.DataFrame, what: str, data_label: str, scale: str):
    """Fig. 11: Fig. 6's panels with the test loss below the test accuracy."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    for col, (panel, name) in enumerate(FIG6_PANELS):
        sub = history[history["panel"] == panel]
        plot_loss_curves(axes[0, col], sub, "variant", title=name, metric="test_accuracy", ylabel=ACCURACY_LABEL)
        plot_loss_curves(axes[1, col], sub, "variant", metric="test_loss", ylabel=TEST_LOSS_LABEL)
    finish(fig, title(what, data_label, scale))
    return fig
