"""One seaborn style for every figure, curve plots with a band over seeds, page-width layouts, one legend
outside the data, PNG + SVG saving through the figure lint (:mod:`pflkit.figure_lint`).

The figure settings (params.yaml ``figures``, read by every plot stage as :class:`FigureConfig`) set the
style once per notebook (:func:`configure`): seaborn context, font scale, the band drawn over seeds and
the DPI of the PNGs. Only plot stages read that section, so changing a figure setting re-runs them alone.

Every figure is laid out the same way: :func:`panels` makes the axes (at most :data:`MAX_COLUMNS` a row,
:data:`PAGE_WIDTH` inches wide, constrained layout), the drawing code draws, :func:`finish` sets the
two-line title (what, then the dataset and scale), readable ticks (integer rounds, log axes as plain
decimals or 10^k) and one legend for the whole figure below the panels, and :func:`save_figure` refuses a
figure that breaks a rule of :func:`pflkit.figure_lint.check`.
"""
from __future__ import annotations

import math

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter

from . import figure_lint
from .figure_config import FigureConfig
from .io import atomic_path
from .methods import METHODS

#: the settings :func:`use_style` and :func:`plot_curves` apply (set by :func:`configure`)
_STYLE = {"context": "notebook", "font_scale": 1.0, "dpi": 150, "band": "sd"}

#: a figure is at most this wide (inches): a page's text width, so a figure prints at its size
PAGE_WIDTH = 7.5
#: panels a row at most (more wrap to the next row)
MAX_COLUMNS = 2
#: the height of one row of panels (inches)
PANEL_HEIGHT = 3.0
#: an x axis labelled like this counts rounds (integer ticks)
ROUND_AXIS = figure_lint.ROUND_AXIS


def configure(cfg: FigureConfig) -> None:
    """Use ``cfg``'s figure settings for every figure this process draws next."""
    _STYLE.update(context=cfg.context, font_scale=cfg.font_scale, dpi=cfg.dpi, band=cfg.band)
    use_style()


def band() -> str | None:
    """seaborn's ``errorbar`` for the configured band (None: no band)."""
    return None if _STYLE["band"] == "none" else _STYLE["band"]


FORMATS = ("png", "svg")
BASELINE = "Majority class"

#: (colour, dashes (seaborn: "" = solid, else on/off lengths), marker)
Style = tuple[str, "str | tuple", str]
#: One look per method in every figure, by method key (:data:`pflkit.methods.METHODS`; a method without one gets
#: a spare style per figure): a colour from the Okabe-Ito colour-blind-safe palette, a dash pattern and a marker,
#: so methods stay apart in colour, in grey print and for colour-blind readers. Chayti et al.'s Fig. 2 caption
#: fixes its colours: training alone blue, WGA green, BC orange. (Here, not in the method's record: a plot
#: stage's code, so a colour change re-runs the plot stages alone.)
STYLES: dict[str, Style] = {
    "perm": ("#0072B2", "", "o"),                     # blue, solid
    "perm_hetero": ("#0072B2", "", "o"),
    "perm_hetero_paper": ("#44AA99", (5, 2), "o"),    # teal, dashed (apart from PERM-hetero's blue)
    "local": ("#E69F00", (4, 2), "s"),                # orange
    "alone": ("#0072B2", "", "o"),                    # Chayti Fig. 2: training alone in blue
    "fedavg": ("#009E73", (1, 1.5), "^"),             # bluish green
    "localized_fedavg": ("#D55E00", (6, 2, 1, 2), "D"),   # vermillion
    "perfedavg_fo": ("#CC79A7", (3, 1, 1, 1), "v"),   # reddish purple
    "perfedavg_hf": ("#882255", (3, 1, 1, 1, 1, 1), "<"),
    "pfedme": ("#000000", (2, 2), "X"),               # black
    "ditto": ("#56B4E9", (5, 1), "P"),                # sky blue (a baseline beyond the PERM paper)
    "wga": ("#009E73", (1, 1.5), "^"),                # Chayti Fig. 2: green
    "bc": ("#E69F00", (4, 2), "s"),                   # Chayti Fig. 2: orange
}
#: the majority-class baseline the curve figures draw (no method: a grey dashed line)
BASELINE_STYLE: Style = ("#777777", (4, 4), "")
#: the same looks by the display name results carry (derived: the records' names)
METHOD_STYLES: dict[str, Style] = {METHODS[k].name: style for k, style in STYLES.items()} | {BASELINE: BASELINE_STYLE}
#: colours for names no figure shares, each far from the fixed ones and from each other
_SPARE_COLOURS = ("#882255", "#999933", "#AA4499", "#DDCC77", "#117733", "#332288", "#F0E442", "#56B4E9")
_SPARE_DASHES = ((5, 1), (2, 1, 2, 3), (8, 2), (1, 3), (4, 1, 1, 1, 1, 1))
_SPARE_MARKERS = ("P", "*", "h", "d", "p", ">")


def method_styles(names) -> dict[str, tuple[str, str | tuple, str]]:
    """(colour, dashes, marker) for each name: the fixed style of a known method, else spare styles in
    the order given (for names no figure shares, e.g. PartialFedAvg variants), never a colour a fixed name
    of the same figure has."""
    names = list(dict.fromkeys(names))
    taken = {METHOD_STYLES[n][0].lower() for n in names if n in METHOD_STYLES}
    colours = [c for c in _SPARE_COLOURS if c.lower() not in taken]
    styles, spare = {}, 0
    for name in names:
        if name in METHOD_STYLES:
            styles[name] = METHOD_STYLES[name]
        else:
            styles[name] = (colours[spare % len(colours)], _SPARE_DASHES[spare % len(_SPARE_DASHES)],
                            _SPARE_MARKERS[spare % len(_SPARE_MARKERS)])
            spare += 1
    return styles


def method_palette(names) -> dict[str, str]:
    """Colour of each method name (see :data:`METHOD_STYLES`), for seaborn's ``palette=``."""
    return {name: style[0] for name, style in method_styles(names).items()}


def series_palette(values) -> dict:
    """One colour-blind-safe colour per value (a sweep's gammas, L's, variants), the same in every panel."""
    values = list(dict.fromkeys(values))
    return dict(zip(values, sns.color_palette("colorblind", max(len(values), 1))))


def layered_widths(n: int, widest: float = 5.0, narrowest: float = 1.2) -> list[float]:
    """Line widths from widest to narrowest for ``n`` curves drawn in that order, so curves that coincide all
    show (each narrower one on top of the wider ones: Charles & Konecny's Fig. 9, "plots of varying width")."""
    if n <= 1:
        return [2.0] * n
    return [widest - (widest - narrowest) * i / (n - 1) for i in range(n)]


def use_style() -> None:
    """The shared look: seaborn whitegrid, colour-blind palette, readable fonts, fixed DPI."""
    sns.set_theme(context=_STYLE["context"], style="whitegrid", palette="colorblind", font_scale=_STYLE["font_scale"],
                  rc={"figure.dpi": 100, "savefig.dpi": _STYLE["dpi"], "savefig.bbox": "tight",
                      "axes.titlesize": 10, "axes.labelsize": 9, "xtick.labelsize": 8, "ytick.labelsize": 8,
                      "legend.fontsize": 8, "figure.titlesize": 11,
                      "svg.hashsalt": "pflkit", "svg.fonttype": "none"})


def panels(n: int = 1, columns: int | None = None, height: float = PANEL_HEIGHT, width: float | None = None,
           **kwargs):
    """A figure of ``n`` panels, at most :data:`MAX_COLUMNS` a row (``columns`` to choose fewer or up to 3),
    :data:`PAGE_WIDTH` wide (one panel: 6 inches), constrained layout; returns (fig, list of axes)."""
    use_style()
    columns = min(n, columns or MAX_COLUMNS, 3)
    rows = -(-n // columns)
    width = width or (PAGE_WIDTH if columns > 1 else 6.0)
    fig, axes = plt.subplots(rows, columns, figsize=(width, height * rows + 0.9), squeeze=False,
                             layout="constrained", **kwargs)
    flat = list(axes.flat)
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


def title(what: str, dataset_label: str, scale: str) -> str:
    """Figure titles always name the data that ran and the scale (e.g. "N=50, 3 seeds"): two lines."""
    return f"{what}\n{dataset_label} ({scale})" if scale else f"{what}\n{dataset_label}"


def _fit_width(fig, text, smallest: float = 6.5, width: float | None = None) -> None:
    """Shrink ``text``'s font until it is no wider than ``width`` (display units; default: the figure)."""
    renderer = fig.canvas.get_renderer()
    size = text.get_fontsize()
    width = 0.98 * fig.bbox.width if width is None else width
    def too_wide():
        box = text.get_window_extent(renderer)
        return box.width > width or box.x0 < 0 or box.x1 > fig.bbox.width

    while size > smallest and too_wide():
        size -= 0.5
        text.set_fontsize(size)


def _plain(value: float, _pos=None) -> str:
    """A log-axis tick label: a plain decimal (0.0001 ... 99999), else 10^k; '' for other values out there."""
    if value <= 0 or not math.isfinite(value):
        return ""
    exponent = math.log10(value)
    if 1e-4 <= value < 1e5:
        return f"{value:.6g}"
    if abs(exponent - round(exponent)) < 1e-9:
        return f"$10^{{{round(exponent)}}}$"
    return ""


def readable_log_ticks(ax, axis: str = "y") -> None:
    """Log-axis ticks a reader can read: decades as plain decimals (10^k beyond 0.0001 ... 99999), and where the
    axis spans less than two decades the 2 and 5 between them too (never 6x10^-1)."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    low, high = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    span = math.log10(high / low) if low > 0 and high > 0 else 99
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if span < 2 else (1.0,), numticks=12))
    target.set_major_formatter(FuncFormatter(_plain))
    target.set_minor_formatter(NullFormatter())


def tidy_axes(fig) -> None:
    """Integer ticks on round axes, readable ticks on log axes, for every panel of ``fig``."""
    for ax in figure_lint.data_axes(fig):
        if ROUND_AXIS.search(ax.get_xlabel()) and ax.get_xscale() == "linear":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        for axis in ("x", "y"):
            if (ax.get_xscale() if axis == "x" else ax.get_yscale()) == "log":
                readable_log_ticks(ax, axis)


def figure_legend(fig, extra: tuple = (), title: str | None = None, ncol: int | None = None):
    """One legend for the whole figure, below the panels (never over data): every panel's legend entries
    (each label once, first panel first) and ``extra`` (handle, label) pairs; the panels' own legends go."""
    handles: dict[str, object] = {}
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None:
            pairs = zip(legend.legend_handles, [t.get_text() for t in legend.get_texts()])
            legend.remove()
        else:
            pairs = zip(*ax.get_legend_handles_labels()) if ax.get_legend_handles_labels()[0] else ()
        for handle, label in pairs:
            if label and not label.startswith("_"):
                handles.setdefault(label, handle)
    for handle, label in extra:
        handles.setdefault(label, handle)
    if not handles:
        return None
    count = len(handles)
    ncol = ncol or min(count, 4)
    renderer = fig.canvas.get_renderer()
    while True:
        legend = fig.legend(list(handles.values()), list(handles), loc="outside lower center", ncol=ncol,
                            title=title, title_fontsize=8, frameon=False)
        if ncol == 1 or legend.get_window_extent(renderer).width <= 0.98 * fig.bbox.width:
            return legend
        legend.remove()
        ncol -= 1


def finish(fig, text: str, legend: bool = True, extra: tuple = (), legend_title: str | None = None,
           ncol: int | None = None) -> None:
    """Set the figure title (use :func:`title`: at most two lines, shrunk to the figure's width), tidy the ticks
    (:func:`tidy_axes`) and gather the legends into one below the panels (:func:`figure_legend`)."""
    if fig.get_layout_engine() is None:
        fig.set_layout_engine("constrained")
    suptitle = fig.suptitle(text, fontsize=11)
    _fit_width(fig, suptitle)
    fig.canvas.draw()  # lays the panels out, so each title is fitted where it will be drawn
    for ax in figure_lint.data_axes(fig):
        if ax.get_title():
            _fit_width(fig, ax.title, width=1.1 * ax.get_window_extent().width)
    tidy_axes(fig)
    if legend:
        figure_legend(fig, extra, legend_title, ncol)


def key_handles(*items) -> tuple:
    """Legend entries that explain a figure's encodings (not one series): (label, Line2D keyword args)."""
    return tuple((Line2D([], [], **kwargs), label) for label, kwargs in items)


def plot_curves(ax, history: pd.DataFrame, metric: str, ylabel: str, xlabel: str = "communication round",
                baseline: bool = True, log: bool = False):
    """Mean over seeds per method, each method in its fixed colour, dash pattern and marker
    (:data:`METHOD_STYLES`), the majority-class baseline as a grey dashed line; a band over seeds (+-1 sd by
    default: :func:`band`) only on a linear axis (``log``: a log y axis and no band: mean +- sd means nothing
    there)."""
    sub = history[history["metric"] == metric]
    methods = sub[sub["method"] != BASELINE]
    styles = method_styles(methods["method"])
    sns.lineplot(data=methods, x="round", y="value", hue="method", style="method",
                 errorbar=None if log else band(), ax=ax,
                 palette={m: s[0] for m, s in styles.items()}, dashes={m: s[1] for m, s in styles.items()},
                 markers={m: s[2] or "o" for m, s in styles.items()}, markersize=5, markeredgewidth=0)
    base = sub[sub["method"] == BASELINE]
    if baseline and len(base):
        ax.axhline(base["value"].mean(), color=METHOD_STYLES[BASELINE][0], linestyle="--", linewidth=1,
                   label=BASELINE)
    if log:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend()
    return ax


def spans_decades(values, decades: float = 1.0) -> bool:
    """Whether positive ``values`` span more than ``decades`` powers of ten (a log axis pays off)."""
    positive = pd.Series(values)[lambda s: s > 0]
    return len(positive) > 0 and math.log10(positive.max() / positive.min()) > decades


def save_figure(fig, stem: str | Path, formats=FORMATS, lint: bool = True) -> list[Path]:
    """Save ``fig`` as ``stem.png`` and ``stem.svg`` (atomically each); returns the paths. With ``lint``
    (always, in the plot stages) a figure that breaks a rule of :func:`pflkit.figure_lint.check` is refused
    (:class:`pflkit.figure_lint.FigureLintError`, every problem named) before anything is written."""
    stem = Path(stem)
    if lint:
        figure_lint.assert_clean(fig, stem.name)
    paths = []
    for fmt in formats:
        path = stem.with_suffix(f".{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, metadata={"Date": None} if fmt == "svg" else None)
        paths.append(path)
    return paths


__all__ = ["FigureConfig", "configure", "band", "use_style", "title", "finish", "accuracy_loss_figure", "plot_curves",
           "save_figure", "plt", "panels", "figure_legend", "tidy_axes", "readable_log_ticks", "layered_widths",
           "series_palette", "key_handles", "spans_decades", "PAGE_WIDTH", "MAX_COLUMNS",
           "METHOD_STYLES", "method_styles", "method_palette"]


def accuracy_loss_figure(history: pd.DataFrame, what: str, dataset_label: str, scale: str, notes=()):
    """The PERM curve figures: (a) personalized accuracy, (b) personalized loss, vs rounds; the loss on a log
    axis (no band) when it spans more than a decade. ``notes``: lines of a diagnostic shown in a text panel
    under the two (read from results files by the caller)."""
    use_style()
    notes = list(notes)
    if notes:
        fig, grid = plt.subplot_mosaic([["acc", "loss"], ["note", "note"]], layout="constrained",
                                       height_ratios=[PANEL_HEIGHT, 0.16 * len(notes)],
                                       figsize=(PAGE_WIDTH, PANEL_HEIGHT + 0.16 * len(notes) + 1.2))
        ax_acc, ax_loss, ax_note = grid["acc"], grid["loss"], grid["note"]
        ax_note.axis("off")
        ax_note.text(0, 1, "\n".join(notes), transform=ax_note.transAxes, ha="left", va="top", fontsize=8)
    else:
        fig, (ax_acc, ax_loss) = panels(2)
    plot_curves(ax_acc, history, "accuracy", "personalized test accuracy\n(fraction correct)")
    loss = history[(history["metric"] == "loss") & (history["method"] != BASELINE)]["value"]
    plot_curves(ax_loss, history, "loss", "personalized test loss\n(cross-entropy, nats)", baseline=False,
                log=spans_decades(loss))
    ax_acc.set_title("(a) accuracy")
    ax_loss.set_title("(b) loss" + (" (log scale)" if ax_loss.get_yscale() == "log" else ""))
    finish(fig, title(what, dataset_label, scale))
    return fig
