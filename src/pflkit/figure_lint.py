"""The figure lint: rules every figure of the plot stages keeps, checked from a matplotlib Figure's artists.

:func:`check` returns one line per broken rule (``"<rule>: <what, where>"``); :func:`assert_clean` raises
:class:`FigureLintError` with all of them (``plotting.save_figure`` calls it, so no plot stage writes a figure
that breaks one). The rules (:data:`RULES`):

* ``legend-over-data``: no legend box covers a drawn data point, line, band, bar, image or mesh of any panel;
* ``empty-band``: no empty band between the title and the panels below it; the panels (with their labels,
  colour bars and the legend) fill the figure's width (no small plot in a wide canvas);
* ``too-wide``: the figure is at most :data:`MAX_WIDTH` inches wide, no text runs past its edges, at most
  :data:`MAX_ASPECT` times as wide as high, at most :data:`MAX_COLUMNS` panels a row;
* ``title-lines``: the figure title and every panel title at most two lines, none wider than the figure, no two
  panel titles overlapping;
* ``round-ticks``: an x axis counting rounds (its label matches :data:`ROUND_AXIS`) has integer tick labels;
* ``log-ticks``: a log axis's tick labels are plain decimals or 10^k (never 6x10^-1);
* ``tick-overlap``: no two tick labels of one axis overlap;
* ``axis-labels``: every panel with tick labels names both axes.

Library code: matplotlib only (no DVC, no params.yaml).
"""
from __future__ import annotations

import re

import numpy as np
from matplotlib.collections import Collection, PathCollection, QuadMesh
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import Bbox

#: inches: a page's text width plus a margin
MAX_WIDTH = 8.0
#: width / height at most
MAX_ASPECT = 3.0
#: panels a row at most
MAX_COLUMNS = 3
#: inches of empty height allowed between the figure title and the top of the panels
MAX_TITLE_GAP = 0.3
#: the panels' share of the figure's drawn width at least
MIN_FILL = 0.7
#: an x axis with this label counts rounds
ROUND_AXIS = re.compile(r"^(communication )?rounds?\b|\brounds R\b", re.I)
#: readable log-axis labels: a plain decimal, or 10^k as mathtext
READABLE_LOG = re.compile(r"^(−|-)?\d+(\.\d+)?$|^\$(\\mathdefault\{)?10\^\{(−|-)?\d+\}\}?\$$")
INTEGER = re.compile(r"^(−|-)?\d+$")
RULES = ("legend-over-data", "empty-band", "too-wide", "title-lines", "round-ticks", "log-ticks", "tick-overlap",
         "axis-labels")


class FigureLintError(ValueError):
    """A figure breaks rules of the figure lint (each named in the message)."""


def is_colorbar(ax) -> bool:
    return getattr(ax, "_colorbar", None) is not None or ax.get_label() == "<colorbar>"


def data_axes(fig) -> list:
    """The visible panels of ``fig`` (not colour bars)."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.axison and not is_colorbar(ax)]


def _legends(fig) -> list:
    found = list(fig.legends)
    for ax in fig.axes:
        if ax.get_legend() is not None and ax.get_legend().get_visible():
            found.append(ax.get_legend())
    return found


def _data_artists(ax):
    for artist in [*ax.lines, *ax.collections, *ax.patches, *ax.images]:
        if artist.get_visible() and not (isinstance(artist, Collection) and not len(artist.get_paths())
                                         and not isinstance(artist, PathCollection)):
            yield artist


def _inside(points, box: Bbox) -> bool:
    """Whether any of the display points (N x 2) lies inside ``box``."""
    points = np.asarray(points, dtype=float).reshape(-1, 2)
    return bool(np.any((points[:, 0] >= box.x0) & (points[:, 0] <= box.x1) & (points[:, 1] >= box.y0)
                       & (points[:, 1] <= box.y1)))


def _covers(artist, box: Bbox) -> bool:
    """Whether ``artist`` (in display coordinates) draws anything inside ``box``."""
    if isinstance(artist, Line2D):
        xy = artist.get_xydata()
        if not len(xy):
            return False
        path = artist.get_transform().transform_path(artist.get_path())
        if artist.get_linestyle() not in ("None", "none", "", " ") and artist.get_linewidth() > 0:
            if path.intersects_bbox(box, filled=False):
                return True
        if artist.get_marker() not in (None, "None", "none", ""):
            return _inside(artist.get_transform().transform(xy), box)
        return False
    if isinstance(artist, (AxesImage, QuadMesh)):
        return artist.get_window_extent().overlaps(box)
    if isinstance(artist, PathCollection) and len(artist.get_offsets()):
        return _inside(artist.get_offset_transform().transform(artist.get_offsets()), box)
    if isinstance(artist, Collection):
        transform = artist.get_transform()
        return any(transform.transform_path(p).intersects_bbox(box, filled=True) for p in artist.get_paths())
    if isinstance(artist, Patch):
        path = artist.get_transform().transform_path(artist.get_path())
        return path.intersects_bbox(box, filled=True)
    return False


def legend_over_data(fig, renderer) -> list[str]:
    problems = []
    for legend in _legends(fig):
        box = legend.get_window_extent(renderer)
        box = Bbox.from_extents(box.x0 + 1, box.y0 + 1, box.x1 - 1, box.y1 - 1)
        for ax in data_axes(fig):
            if not ax.get_window_extent(renderer).overlaps(box):
                continue
            clip = Bbox.intersection(ax.get_window_extent(renderer), box)
            hits = [a for a in _data_artists(ax) if clip is not None and _covers(a, clip)]
            if hits:
                problems.append(f"legend-over-data: the legend covers {len(hits)} data artist(s) of panel "
                                f"{ax.get_title() or fig.axes.index(ax)!r} (e.g. {hits[0].get_label()!r})")
    return problems


def _union(boxes):
    boxes = [b for b in boxes if b is not None and b.width > 0 and b.height > 0]
    return Bbox.union(boxes) if boxes else None


def empty_space(fig, renderer) -> list[str]:
    problems = []
    axes = data_axes(fig)
    if not axes:
        return problems
    dpi = fig.dpi
    panel_boxes = [ax.get_tightbbox(renderer) for ax in fig.axes if ax.get_visible()]
    panels = _union(panel_boxes)
    title = fig._suptitle
    if title is not None and title.get_text() and panels is not None:
        gap = (title.get_window_extent(renderer).y0 - panels.y1) / dpi
        if gap > MAX_TITLE_GAP:
            problems.append(f"empty-band: {gap:.2f} in of empty height between the title and the panels "
                            f"(at most {MAX_TITLE_GAP})")
    drawn = fig.get_tightbbox(renderer)  # inches
    filled = _union(panel_boxes + [lg.get_window_extent(renderer) for lg in _legends(fig)])
    if filled is not None and drawn.width > 0:
        share = filled.width / dpi / drawn.width
        if share < MIN_FILL:
            problems.append(f"empty-band: the panels fill {share:.0%} of the figure's width (at least "
                            f"{MIN_FILL:.0%}: a small plot in a wide canvas)")
    return problems


def size(fig, renderer) -> list[str]:
    problems = []
    drawn = fig.get_tightbbox(renderer)
    width, height = drawn.width, drawn.height
    if width > MAX_WIDTH:
        problems.append(f"too-wide: {width:.1f} in wide (at most {MAX_WIDTH})")
    texts = [*fig.texts, fig._suptitle, *(lg.get_title() for lg in _legends(fig)),
             *(text for lg in _legends(fig) for text in lg.get_texts())]
    for ax in fig.axes:
        texts += [*ax.texts, ax.title, ax.xaxis.label, ax.yaxis.label]
    for text in texts:
        if text is not None and text.get_visible() and text.get_text().strip():
            box = text.get_window_extent(renderer)
            if box.x0 < -2 or box.x1 > fig.bbox.width + 2:
                problems.append(f"too-wide: the text {text.get_text()[:60]!r} runs past the figure's edge")
    if height > 0 and width / height > MAX_ASPECT:
        problems.append(f"too-wide: aspect {width / height:.1f} (width / height at most {MAX_ASPECT})")
    rows: dict[float, int] = {}
    for ax in data_axes(fig):
        key = round(ax.get_position().y0, 2)
        rows[key] = rows.get(key, 0) + 1
    if rows and max(rows.values()) > MAX_COLUMNS:
        problems.append(f"too-wide: {max(rows.values())} panels in one row (at most {MAX_COLUMNS})")
    return problems


def titles(fig, renderer) -> list[str]:
    problems = []
    texts = [("figure title", fig._suptitle)] + [(f"panel {i} title", ax.title) for i, ax in enumerate(fig.axes)]
    for name, text in texts:
        if text is None or not text.get_text():
            continue
        lines = text.get_text().count("\n") + 1
        if lines > 2:
            problems.append(f"title-lines: the {name} has {lines} lines (at most 2): {text.get_text()!r}")
        if text.get_window_extent(renderer).width > fig.bbox.width * 1.001:
            problems.append(f"title-lines: the {name} is wider than the figure: {text.get_text()!r}")
    shown = [ax.title for ax in fig.axes if ax.get_visible() and ax.title.get_text()]
    for i, a in enumerate(shown):
        for b in shown[i + 1:]:
            overlap = Bbox.intersection(a.get_window_extent(renderer), b.get_window_extent(renderer))
            if overlap is not None and overlap.width > 1 and overlap.height > 1:
                problems.append(f"title-lines: panel titles {a.get_text()!r} and {b.get_text()!r} overlap")
    return problems


def _shown_labels(axis, renderer):
    """(text, extent) of the tick labels drawn inside the axis's view."""
    low, high = sorted(axis.get_view_interval())
    shown = []
    for tick in [*axis.get_major_ticks(), *axis.get_minor_ticks()]:
        label = tick.label1
        if not (label.get_visible() and label.get_text() and tick.get_visible()):
            continue
        loc = tick.get_loc()
        if loc is None or not (low - 1e-9 * abs(low) <= loc <= high + 1e-9 * abs(high)):
            continue
        shown.append((label.get_text(), label.get_window_extent(renderer)))
    return shown


def ticks(fig, renderer) -> list[str]:
    problems = []
    for ax in data_axes(fig):
        name = ax.get_title() or str(fig.axes.index(ax))
        for letter, axis, scale in (("x", ax.xaxis, ax.get_xscale()), ("y", ax.yaxis, ax.get_yscale())):
            shown = _shown_labels(axis, renderer)
            texts = [t for t, _ in shown]
            if letter == "x" and scale == "linear" and ROUND_AXIS.search(ax.get_xlabel()):
                bad = [t for t in texts if not INTEGER.match(t)]
                if bad:
                    problems.append(f"round-ticks: panel {name!r} counts rounds but labels {bad[:4]}")
            if scale == "log":
                bad = [t for t in texts if not READABLE_LOG.match(t)]
                if bad:
                    problems.append(f"log-ticks: panel {name!r} {letter} axis labels {bad[:4]} (plain decimals "
                                    "or 10^k only)")
            boxes = sorted((b for _, b in shown), key=lambda b: (b.x0, b.y0))
            for a, b in zip(boxes, boxes[1:]):
                if a.overlaps(b) and Bbox.intersection(a, b).width > 1 and Bbox.intersection(a, b).height > 1:
                    problems.append(f"tick-overlap: panel {name!r} {letter} tick labels overlap")
                    break
        for letter, axis, label in (("x", ax.xaxis, ax.get_xlabel()), ("y", ax.yaxis, ax.get_ylabel())):
            if _shown_labels(axis, renderer) and not label.strip():
                problems.append(f"axis-labels: panel {name!r} has tick labels but no {letter} label")
    return problems


def check(fig) -> list[str]:
    """Every broken rule of ``fig`` (empty: it keeps them all), one line each."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [*legend_over_data(fig, renderer), *empty_space(fig, renderer), *size(fig, renderer),
            *titles(fig, renderer), *ticks(fig, renderer)]


def assert_clean(fig, name: str = "figure") -> None:
    """Raise :class:`FigureLintError` naming every rule ``fig`` breaks."""
    problems = check(fig)
    if problems:
        raise FigureLintError(f"{name} breaks the figure lint ({len(problems)} problem(s)):\n  "
                              + "\n  ".join(problems))
