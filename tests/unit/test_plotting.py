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


def test_a_look_belongs_to_a_method_key_and_follows_its_record_name():
    """Styles are keyed by method key (``plotting.STYLES``), and the looks by display name are derived from the
    records (``pflkit.methods.METHODS``): renaming a method keeps its look; a key no record has is an error."""
    from pflkit.methods import METHODS
    assert set(plotting.STYLES) <= set(METHODS), set(plotting.STYLES) - set(METHODS)
    assert {k: plotting.METHOD_STYLES[METHODS[k].name] for k in plotting.STYLES} == plotting.STYLES
    assert set(plotting.METHOD_STYLES) == {METHODS[k].name for k in plotting.STYLES} | {plotting.BASELINE}


def test_every_record_names_a_class_and_chaytis_records_the_labels_their_runs_carry():
    """Each record's class imports (a class the pipeline runs: a round written as passes, or Chayti et al.'s
    collaborative method, whose ``name`` labels its curves and must be its record's name)."""
    from pflkit.methods import METHODS
    for key, method in METHODS.items():
        cls = method.algorithm
        if method.family == "speedup":
            assert cls.name == method.name, key
        else:
            assert hasattr(cls, "round_passes") and callable(method.make), key


def test_the_records_and_the_figure_style_load_no_torch():
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", "import sys, pflkit.methods, pflkit.plotting; "
                          "print('torch' in sys.modules)"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
