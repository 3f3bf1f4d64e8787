"""Drawing for the Charles & Konecny plot stages: Pareto frontiers in the (rho, Delta) unit square (Figs. 1-5,
7-10) and the neural-network curves vs rounds (Figs. 6/11, 12, 13), from the tables the compute stages wrote
(``frontier.csv``, ``history.csv``) and their run.json.

Curves that can coincide (Fig. 3's and Fig. 9's alpha frontiers, Fig. 4's FedAvg and MAML, the tuned curves of
Figs. 6/11-13) are drawn from widest to narrowest (``plotting.layered_widths``, as the paper's Fig. 9 does), so
every one of them shows where they lie on each other; each swept value keeps one colour in every panel."""
from __future__ import annotations

import pandas as pd

from ..plotting import finish, layered_widths, panels, series_palette, title

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


def plot_curves(ax, frame: pd.DataFrame, hue: str, style: str | None = None, title: str | None = None,
                palette: dict | None = None, layered: bool = False):
    """Analytic frontiers: one line per ``hue`` value, drawn in the order of its K (or gamma) grid, in one colour
    per value (``palette``: the figure's, so a value keeps its colour in every panel). ``layered``: widest first
    so coinciding curves all show. ``style`` (Fig. 4's method): the first value wide and pale, the others
    dashed and narrow on top of it."""
    palette = palette or series_palette(frame[hue])
    hues = list(dict.fromkeys(frame[hue]))
    widths = dict(zip(hues, layered_widths(len(hues)))) if layered else dict.fromkeys(hues, 1.8)
    styles = list(dict.fromkeys(frame[style])) if style else [None]
    for s_index, s_value in enumerate(styles):
        part = frame if style is None else frame[frame[style] == s_value]
        for value in hues:
            curve = part[part[hue] == value]
            if not len(curve):
                continue
            kwargs = dict(color=palette[value], linewidth=widths[value], solid_capstyle="butt")
            if style is not None and s_index == 0:
                kwargs.update(linewidth=5.0, alpha=0.35)
            elif style is not None:
                kwargs.update(linewidth=1.6, linestyle=(0, (4, 2)))
            ax.plot(curve["rho"], curve["delta"], label=value if style is None else f"{value}: {s_value}", **kwargs)
    return frontier_axes(ax, title)


def plot_simulated(ax, frame: pd.DataFrame, title: str | None = None, palette: dict | None = None):
    """Simulated MAML points (one colour per d, the first d's points largest so that coinciding points of every d
    show) over the analytic FedAvg frontier (black line)."""
    fedavg = frame[frame["d"] == 0]
    maml = frame[frame["d"] > 0]
    ax.plot(fedavg["rho"], fedavg["delta"], color="black", linewidth=1.5, label=fedavg["method"].iloc[0]
            if len(fedavg) else "FedAvg (Theta_1:K)")
    palette = palette or series_palette(maml["method"])
    groups = list(maml.groupby("method", sort=False))
    sizes = layered_widths(len(groups), widest=18.0, narrowest=4.0)  # later (smaller) points on top: both show
    for (method, part), size in zip(groups, sizes if len(groups) > 1 else [8.0]):
        ax.scatter(part["rho"], part["delta"], s=size, linewidth=0, color=palette[method], label=method, zorder=3)
    return frontier_axes(ax, title)


def simulated_figure(frame: pd.DataFrame, facet: str | None, what: str, data_label: str, scale: str):
    """Figs. 5, 7, 8, 10: one panel of :func:`plot_simulated` per value of ``facet`` (None: one panel), two a
    row, one legend below."""
    groups = list(frame.groupby(facet, sort=False)) if facet else [(None, frame)]
    fig, axes = panels(len(groups), height=3.2)
    palette = series_palette(frame[frame["d"] > 0]["method"])
    for ax, (key, part) in zip(axes, groups):
        plot_simulated(ax, part, title=None if key is None else f"{facet} = {key:g}" if isinstance(key, float)
                       else f"{facet} = {key}", palette=palette)
    finish(fig, title(what, data_label, scale), ncol=3)
    return fig


def frontier_figure(frame: pd.DataFrame, facet: str | None, hue: str, what: str, data_label: str, scale: str,
                    style: str | None = None, layered: bool = False, diagonal: bool = False):
    """Figs. 1-4, 9: the analytic frontiers (:func:`plot_curves`), one panel per ``facet`` value (None: one
    panel), two a row; ``diagonal``: the line rho = Delta dotted."""
    groups = list(frame.groupby(facet, sort=False)) if facet else [(None, frame)]
    fig, axes = panels(len(groups), height=3.2)
    palette = series_palette(frame[hue])
    for ax, (key, part) in zip(axes, groups):
        name = None if key is None else key if isinstance(key, str) else f"{facet} = {key:g}"
        plot_curves(ax, part, hue, style=style, title=name, palette=palette, layered=layered)
        if diagonal:
            ax.plot([0, 1], [0, 1], color="0.6", linestyle=":", linewidth=1, label="rho = Delta")
    finish(fig, title(what, data_label, scale), ncol=3 if style else None)
    return fig


# ------------------------------------------------------------------------------- neural networks
def _hue_label(hue: str, value) -> str:
    if hue == "variant":
        return str(value)
    return f"{hue} = {value:g}" if isinstance(value, float) else f"{hue} = {value}"


def plot_loss_curves(ax, history: pd.DataFrame, hue: str = "gamma", title: str | None = None,
                     metric: str = "train_loss", ylabel: str = TRAIN_LOSS_LABEL, palette: dict | None = None):
    """One line per ``hue`` value of ``metric`` vs rounds (a run_grid history), widest first so coinciding
    curves all show, each value in its colour (``palette``: the figure's)."""
    sub = history[history["metric"] == metric].copy()
    sub["label"] = sub[hue].map(lambda v: _hue_label(hue, v))
    labels = list(dict.fromkeys(sub["label"]))
    palette = palette or series_palette(labels)
    few = sub["round"].nunique() <= 15  # markers only where they do not crowd the lines
    for label, width in zip(labels, layered_widths(len(labels), widest=4.5, narrowest=1.2)):
        curve = sub[sub["label"] == label].groupby("round", as_index=False)["value"].mean()
        ax.plot(curve["round"], curve["value"], color=palette[label], linewidth=width, marker="o" if few else None,
                markersize=width + 1, label=label, solid_capstyle="butt")
    ax.set_xlabel(ROUND_LABEL)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    return ax


def task_labels(run_info: dict) -> dict[str, str]:
    """Task -> the dataset that ran for it, in the stage's task order (run.json ``task_labels``)."""
    return {entry["task"]: entry["label"] for entry in run_info["task_labels"]}


def split_scale(scale: str, tasks) -> tuple[str, dict[str, str]]:
    """A Charles NN scale "K=2; femnist: ...; cifar100: ..." as (the shared part, task -> its own part)."""
    shared, own = [], {}
    for part in scale.split("; "):
        task, sep, rest = part.partition(": ")
        if sep and task in tasks:
            own[task] = rest
        else:
            shared.append(part)
    return "; ".join(shared), own


def loss_by_task_figure(history: pd.DataFrame, labels: dict[str, str], what: str, scale: str):
    """Figs. 12, 13: training loss vs rounds, one panel per task (titled by its dataset and its own scale), one
    line per gamma (one colour per gamma in every panel); the shared scale in the figure's title."""
    fig, axes = panels(len(labels), height=3.2)
    shared, own = split_scale(scale, labels)
    gammas = [_hue_label("gamma", v) for v in dict.fromkeys(history["gamma"])]
    palette = series_palette(gammas)
    for ax, (name, label) in zip(axes, labels.items()):
        plot_loss_curves(ax, history[history["task"] == name], "gamma",
                         title=label + (f"\n{own[name]}" if name in own else ""), palette=palette)
    finish(fig, f"{what}\n{shared}" if shared else what)
    return fig


#: Figs. 6/11: the two panels of the tuned curves (history column ``panel``) and their titles
FIG6_PANELS = (("server", "ServerOpt (alpha = 0)"), ("alpha", "alpha (no momentum)"))
ACCURACY_LABEL = "test accuracy (fraction correct)"
TEST_LOSS_LABEL = "test loss (cross-entropy, nats)"


def fig6_figure(history: pd.DataFrame, what: str, data_label: str, scale: str):
    """Fig. 6: the tuned curves' test accuracy, server momentum (left) and alpha (right)."""
    fig, axes = panels(2, height=3.2)
    palette = series_palette(history["variant"])
    for ax, (panel, name) in zip(axes, FIG6_PANELS):
        plot_loss_curves(ax, history[history["panel"] == panel], "variant", title=name, metric="test_accuracy",
                         ylabel=ACCURACY_LABEL, palette=palette)
    finish(fig, title(what, data_label, scale))
    return fig


def fig11_figure(history: pd.DataFrame, what: str, data_label: str, scale: str):
    """Fig. 11: Fig. 6's panels with the test loss below the test accuracy."""
    fig, axes = panels(4, height=2.8)
    palette = series_palette(history["variant"])
    for col, (panel, name) in enumerate(FIG6_PANELS):
        sub = history[history["panel"] == panel]
        plot_loss_curves(axes[col], sub, "variant", title=name, metric="test_accuracy", ylabel=ACCURACY_LABEL,
                         palette=palette)
        plot_loss_curves(axes[2 + col], sub, "variant", metric="test_loss", ylabel=TEST_LOSS_LABEL,
                         palette=palette)
    finish(fig, title(what, data_label, scale))
    return fig


__all__ = ["frontier_axes", "labelled", "plot_curves", "plot_simulated", "simulated_figure", "frontier_figure",
           "plot_loss_curves", "task_labels", "split_scale", "loss_by_task_figure", "fig6_figure", "fig11_figure"]
