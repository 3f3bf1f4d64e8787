"""The figure lint (pflkit.figure_lint): it fails a figure made to break each of its rules and passes the same figure
drawn the shared way (pflkit.plotting: panels, finish). That every figure every plot stage draws passes it:
tests/regression/test_figure_lint_smoke.py, after the notebooks wrote the smoke results."""
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from pflkit import figure_lint, plotting, stages  # noqa: E402
from pflkit.plotting import plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PLOT_STAGES = [s for s in stages.STAGES if s.is_plot]


def rules(fig) -> set[str]:
    """The rules ``fig`` breaks (closed after)."""
    broken = {problem.split(":")[0] for problem in figure_lint.check(fig)}
    plt.close(fig)
    return broken


def clean_panels(n=2, **kwargs):
    fig, axes = plotting.panels(n, **kwargs)
    for ax in axes:
        ax.plot(np.arange(5), np.arange(5) ** 2, label="a")
        ax.set(xlabel="communication round", ylabel="loss (nats)")
    return fig, axes


# ------------------------------------------------------------------------- figures that break one rule
def legend_over_data():
    fig, axes = clean_panels(1)
    axes[0].plot([0, 4], [8, 8], label="through the middle")
    axes[0].legend(loc="center")
    fig.suptitle("what\ndata (scale)")
    return fig


def legend_over_points():
    fig, axes = clean_panels(1)
    axes[0].scatter([2.0], [8.0], label="a point in the middle")
    axes[0].plot([2.2], [7.5], marker="o", linestyle="none", label="a marker in the middle")
    axes[0].legend(loc="center")
    return fig


def empty_band():
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(np.arange(5), np.arange(5))
    ax.set(xlabel="communication round", ylabel="loss (nats)")
    fig.suptitle("what\ndata (scale)")
    fig.tight_layout(rect=(0, 0, 1, 0.7))  # the old finish(): a band under the title
    return fig


def small_plot_in_wide_canvas():
    """The old PERM Fig. 3: one small panel under a title as wide as the canvas."""
    fig, ax = plt.subplots(figsize=(7.5, 3))
    fig.subplots_adjust(left=0.4, right=0.6, top=0.8)
    ax.plot(np.arange(5), np.arange(5))
    ax.set(xlabel="communication round", ylabel="loss (nats)")
    fig.suptitle("what\n" + "a long description of the data and the scale it ran at, " * 2, fontsize=7)
    return fig


def too_wide():
    fig, axes = plt.subplots(1, 4, figsize=(20, 4), layout="constrained")  # four panels, 3,000 px in a row
    for ax in axes:
        ax.plot(np.arange(5), np.arange(5))
        ax.set(xlabel="communication round", ylabel="loss (nats)")
    return fig


def text_past_the_edge():
    fig, axes = clean_panels(2)
    axes[1].set_title("a panel title far too long for its place at the right edge of the figure " * 2)
    return fig


def three_line_title():
    fig, _ = clean_panels()
    fig.suptitle("what\ndata\n(scale; and more)")
    return fig


def fractional_round_ticks():
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    ax.plot(np.arange(5), np.arange(5))  # matplotlib's ticks: 0.0, 0.5, ..., 4.0
    ax.set(xlabel="communication round", ylabel="loss (nats)")
    return fig


def unreadable_log_ticks():
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    ax.plot(np.arange(5), [0.3, 0.4, 0.5, 0.6, 0.7])
    ax.set_yscale("log")  # less than a decade: matplotlib labels 3x10^-1, 4x10^-1, 6x10^-1
    ax.set(xlabel="step", ylabel="loss (log)")
    return fig


def overlapping_tick_labels():
    fig, ax = plt.subplots(figsize=(3, 3), layout="constrained")
    names = [f"a very long method name {i}" for i in range(6)]
    ax.bar(names, np.arange(6))
    ax.set(xlabel="method", ylabel="time (ms)")
    return fig


def unlabelled_axes():
    fig, ax = plt.subplots(figsize=(5, 4), layout="constrained")
    ax.plot(np.arange(5), np.arange(5))
    return fig


BROKEN = [("legend-over-data", legend_over_data), ("legend-over-data", legend_over_points), ("empty-band", empty_band),
          ("empty-band", small_plot_in_wide_canvas), ("too-wide", too_wide), ("too-wide", text_past_the_edge),
          ("title-lines", three_line_title),
          ("round-ticks", fractional_round_ticks), ("log-ticks", unreadable_log_ticks),
          ("tick-overlap", overlapping_tick_labels), ("axis-labels", unlabelled_axes)]


@pytest.mark.parametrize("rule, make", BROKEN, ids=[make.__name__ for _, make in BROKEN])
def test_the_lint_fails_a_figure_that_breaks_the_rule(rule, make):
    assert rule in figure_lint.RULES
    assert rule in rules(make())


def test_unreadable_log_ticks_are_what_matplotlib_draws_by_default():
    fig = unreadable_log_ticks()
    fig.canvas.draw()
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels(minor=True) if t.get_text()]
    plt.close(fig)
    assert any("times" in label for label in labels), labels


# ------------------------------------------------------------------------------ the shared way passes
def test_a_figure_drawn_the_shared_way_passes():
    fig, axes = clean_panels(3)
    axes[1].set_yscale("log")
    axes[2].plot([0, 4], [8, 8], label="through the middle")
    plotting.finish(fig, plotting.title("what", "data", "scale"))
    assert len(fig.legends) == 1 and not any(ax.get_legend() for ax in fig.axes)
    assert figure_lint.check(fig) == []
    plt.close(fig)


def test_finish_makes_round_ticks_integer_and_log_ticks_readable():
    fig = unreadable_log_ticks()
    fig.axes[0].set_xlabel("communication round")
    plotting.finish(fig, "what\ndata (scale)")
    fig.canvas.draw()
    assert figure_lint.check(fig) == []
    renderer = fig.canvas.get_renderer()
    xs = [text for text, _ in figure_lint._shown_labels(fig.axes[0].xaxis, renderer)]
    ys = [text for text, _ in figure_lint._shown_labels(fig.axes[0].yaxis, renderer)]
    plt.close(fig)
    assert xs == ["0", "1", "2", "3", "4"]
    assert ys and all(re.match(r"^\d+(\.\d+)?$", y) for y in ys), ys


def test_save_figure_refuses_a_figure_that_breaks_a_rule(tmp_path):
    with pytest.raises(figure_lint.FigureLintError, match="title-lines"):
        plotting.save_figure(three_line_title(), tmp_path / "bad")
    assert not list(tmp_path.iterdir())
    plt.close("all")


@pytest.mark.parametrize("values, label", [(0.6, "0.6"), (10.0, "10"), (1e-5, "$10^{-5}$"), (1e6, "$10^{6}$"),
                                           (6e-6, "")])
def test_log_labels_are_plain_decimals_or_powers_of_ten(values, label):
    assert plotting._plain(values) == label
    assert label == "" or figure_lint.READABLE_LOG.match(label)


def test_a_spare_colour_is_never_a_fixed_colour_of_the_same_figure():
    names = ["PERM-hetero", "PERM-hetero (paper D)", "HeteroFL + FT", "FedRolex + FT", "Small-model FedAvg + FT",
             plotting.BASELINE]
    colours = [c.lower() for c in plotting.method_palette(names).values()]
    assert len(set(colours)) == len(colours), colours


def test_chayti_fig2_colours_are_the_captions():
    """Chayti et al. Fig. 2: "Bias Correction (orange) to WGA (green) and training alone (blue)"."""
    palette = plotting.method_palette(["Alone", "WGA", "BC"])
    assert palette == {"Alone": "#0072B2", "WGA": "#009E73", "BC": "#E69F00"}
