"""Figures anyone can read: one fixed look per method in every figure."""
import matplotlib

matplotlib.use("Agg")

from matplotlib.colors import to_rgb  # noqa: E402

from pflkit import plotting  # noqa: E402

PERM_FIGURE_METHODS = ["Local", "FedAvg", "Localized FedAvg", "PERM", "Per-FedAvg (FO)", "Per-FedAvg (HF)", "pFedMe"]


def test_a_method_keeps_its_colour_whatever_the_order_or_company():
    a = plotting.method_palette(PERM_FIGURE_METHODS)
    b = plotting.method_palette(list(reversed(PERM_FIGURE_METHODS[:3])) + ["PERM"])
    assert a["PERM"] == b["PERM"] == "#0072B2"
    assert a["FedAvg"] == b["FedAvg"]


def test_methods_of_one_figure_differ_in_colour_dashes_and_marker():
    styles = plotting.method_styles(PERM_FIGURE_METHODS)
    for i, field in enumerate(("colour", "dashes", "marker")):
        values = [str(s[i]) for s in styles.values()]
        assert len(set(values)) == len(values), f"two methods share a {field}: {styles}"


def test_unknown_names_get_distinct_spare_styles():
    styles = plotting.method_styles(["PERM", "width 0.5", "width 0.25"])
    assert styles["width 0.5"] != styles["width 0.25"]
    assert styles["width 0.5"][0] not in {plotting.METHOD_STYLES["PERM"][0]}


def test_curve_figure_draws_each_method_in_its_colour():
    import pandas as pd
    rows = [(r, m, s, metric, 0.5 + 0.01 * r) for m in ("PERM", "pFedMe", "FedAvg") for s in (0, 1)
            for r in (0, 1, 2) for metric in ("accuracy", "loss")]
    history = pd.DataFrame(rows, columns=["round", "method", "seed", "metric", "value"])
    fig = plotting.accuracy_loss_figure(history, "t", "d", "s")
    assert len(fig.legends) == 1 and fig.axes[0].get_legend() is None  # one legend, below the panels
    lines = {line.get_label(): line for line in fig.legends[0].get_lines()}
    for method in ("PERM", "pFedMe", "FedAvg"):
        assert to_rgb(lines[method].get_color()) == to_rgb(plotting.METHOD_STYLES[method][0])
    plotting.plt.close(fig)
