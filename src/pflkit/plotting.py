"""One seaborn style for every figure, curve plots with a band over seeds, PNG + SVG saving.

The figure settings (params.yaml ``figures``, read by every plot stage as :class:`FigureConfig`) set the
style once per notebook (:func:`configure`): seaborn context, font scale, the band drawn over seeds and
the DPI of the PNGs. Only plot stages read that section, so changing a figure setting re-runs them alone.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import seaborn as sns

from .figure_config import FigureConfig
from .io import atomic_path

#: the settings :func:`use_style` and :func:`plot_curves` apply (set by :func:`configure`)
_STYLE = {"context": "notebook", "font_scale": 1.0, "dpi": 150, "band": "sd"}


def configure(cfg: FigureConfig) -> None:
    """Use ``cfg``'s figure settings for every figure this process draws next."""
    _STYLE.update(context=cfg.context, font_scale=cfg.font_scale, dpi=cfg.dpi, band=cfg.band)
    use_style()


def band() -> str | None:
    """seaborn's ``errorbar`` for the configured band (None: no band)."""
    return None if _STYLE["band"] == "none" else _STYLE["band"]

FORMATS = ("png", "svg")
BASELINE = "Majority class"

#: One look per method in every figure: a colour from the Okabe-Ito colour-blind-safe palette, a dash
#: pattern and a marker, so methods stay apart in colour, in grey print and for colour-blind readers.
#: (colour, dashes (seaborn: "" = solid, else on/off lengths), marker)
METHOD_STYLES: dict[str, tuple[str, str | tuple, str]] = {
    "PERM": ("#0072B2", "", "o"),                     # blue, solid
    "PERM-hetero": ("#0072B2", "", "o"),
    "PERM-hetero (paper D)": ("#56B4E9", (5, 2), "o"),
    "Local": ("#E69F00", (4, 2), "s"),                # orange
    "Alone": ("#E69F00", (4, 2), "s"),
    "FedAvg": ("#009E73", (1, 1.5), "^"),             # bluish green
    "Localized FedAvg": ("#D55E00", (6, 2, 1, 2), "D"),   # vermillion
    "Per-FedAvg (FO)": ("#CC79A7", (3, 1, 1, 1), "v"),    # reddish purple
    "Per-FedAvg (HF)": ("#882255", (3, 1, 1, 1, 1, 1), "<"),
    "pFedMe": ("#000000", (2, 2), "X"),               # black
    "WGA": ("#009E73", (1, 1.5), "^"),
    "BC": ("#0072B2", "", "o"),
    BASELINE: ("#777777", (4, 4), ""),
}
_SPARE_COLOURS = ("#56B4E9", "#F0E442", "#882255", "#44AA99", "#999933", "#AA4499", "#DDCC77", "#117733")
_SPARE_DASHES = ((5, 1), (2, 1, 2, 3), (8, 2), (1, 3), (4, 1, 1, 1, 1, 1))
_SPARE_MARKERS = ("P", "*", "h", "d", "p", ">")


def method_styles(names) -> dict[str, tuple[str, str | tuple, str]]:
    """(colour, dashes, marker) for each name: the fixed style of a known method, else spare styles in
    the order given (for names no figure shares, e.g. PartialFedAvg variants)."""
    styles, spare = {}, 0
    for name in dict.fromkeys(names):
        if name in METHOD_STYLES:
            styles[name] = METHOD_STYLES[name]
        else:
            styles[name] = (_SPARE_COLOURS[spare % len(_SPARE_COLOURS)], _SPARE_DASHES[spare % len(_SPARE_DASHES)],
                            _SPARE_MARKERS[spare % len(_SPARE_MARKERS)])
            spare += 1
    return styles


def method_palette(names) -> dict[str, str]:
    """Colour of each method name (see :data:`METHOD_STYLES`), for seaborn's ``palette=``."""
    return {name: style[0] for name, style in method_styles(names).items()}


def use_style() -> None:
    """The shared look: seaborn whitegrid, colour-blind palette, readable fonts, fixed DPI."""
    sns.set_theme(context=_STYLE["context"], style="whitegrid", palette="colorblind", font_scale=_STYLE["font_scale"],
                  rc={"figure.dpi": 100, "savefig.dpi": _STYLE["dpi"], "savefig.bbox": "tight",
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
    """Mean over seeds with a band per method (+-1 sd by default: :func:`band`), each method in its fixed
    colour, dash pattern and marker (:data:`METHOD_STYLES`); the majority-class baseline as a grey dashed line."""
    sub = history[history["metric"] == metric]
    methods = sub[sub["method"] != BASELINE]
    styles = method_styles(methods["method"])
    sns.lineplot(data=methods, x="round", y="value", hue="method", style="method", errorbar=band(), ax=ax,
                 palette={m: s[0] for m, s in styles.items()}, dashes={m: s[1] for m, s in styles.items()},
                 markers={m: s[2] or "o" for m, s in styles.items()}, markersize=5, markeredgewidth=0)
    base = sub[sub["method"] == BASELINE]
    if baseline and len(base):
        ax.axhline(base["value"].mean(), color=METHOD_STYLES[BASELINE][0], linestyle="--", linewidth=1,
                   label=BASELINE)
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


__all__ = ["FigureConfig", "configure", "band", "use_style", "title", "finish", "accuracy_loss_figure", "plot_curves",
           "save_figure", "plt",
           "METHOD_STYLES", "method_styles", "method_palette"]


def accuracy_loss_figure(history: pd.DataFrame, what: str, dataset_label: str, scale: str):
    """The PERM curve figures: (a) personalized accuracy, (b) personalized loss, vs rounds."""
    use_style()
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    plot_curves(ax_acc, history, "accuracy", "personalized test accuracy (fraction correct)")
    plot_curves(ax_loss, history, "loss", "personalized test loss (cross-entropy, nats)", baseline=False)
    ax_loss.set_yscale("log")
    finish(fig, title(what, dataset_label, scale))
    return fig
