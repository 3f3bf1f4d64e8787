"""Every notebook stage, in one table: its name, paper, notebook, config class and outputs.

This table is the one place a stage is declared. ``pflkit.config`` looks stage configs up here
(importing only the module that defines the stage's config, when it is asked for), and
``scripts/dvc_stages.py`` writes dvc.yaml from it: each stage runs
``python -m pflkit stage <name> <notebook>.ipynb`` and depends on its notebook's py:percent twin and
on the pflkit source files its code imports. To add a stage: add an entry here, a section to
params.yaml, then run ``python scripts/dvc_stages.py``.

Importing this module imports nothing else of pflkit.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import PurePosixPath


@dataclass(frozen=True)
class Plot:
    """A DVC plot of a CSV the stage writes (``file`` inside ``results/<stage>/``), with DVC's plot
    properties (None: not set)."""

    file: str
    x: str
    title: str
    y: str | None = None
    template: str | None = None
    x_label: str | None = None
    y_label: str | None = None

    def props(self) -> dict[str, str]:
        """The set properties in dvc.yaml's order: template, x, y, title, x_label, y_label."""
        keys = ("template", "x", "y", "title", "x_label", "y_label")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}


@dataclass(frozen=True)
class Stage:
    """One notebook stage.

    * ``notebook``: the py:percent twin (``notebooks/<paper>/<name>.py``); the stage executes the
      ``.ipynb`` beside it and keeps the executed copy in ``reports/<paper>/``;
    * ``config``: ``"module:Class"``, the StageConfig subclass that validates the stage's params;
    * ``results``: files the stage writes into ``results/<stage>/`` besides metrics.json (which the
      claims ledger reads), in dvc.yaml's order; ``plots``: CSVs there that DVC plots;
    * ``figures``: figure names the stage saves as png + svg in ``figures/<paper>/`` (default: the
      notebook's name);
    * ``extra_outs`` / ``extra_deps``: other outputs (e.g. a model another stage reads) and inputs
      (another stage's outputs);
    * ``tune``: ``"module:function"`` of the learning-rate sweep of ``python -m pflkit tune``; None:
      the stage cannot be tuned.
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
    def results_dir(self) -> str:
        return f"results/{self.name}"

    @property
    def figures_dir(self) -> str:
        return f"figures/{self.paper}"

    @property
    def outs(self) -> list[str]:
        """Every output but the plots: executed notebook, figures, metrics.json, results, extra outputs."""
        figures = (self.stem,) if self.figures is None else self.figures
        return ([f"reports/{self.paper}/{self.stem}.ipynb"]
                + [f"{self.figures_dir}/{f}.{ext}" for f in figures for ext in ("png", "svg")]
                + [f"{self.results_dir}/{f}" for f in ("metrics.json", *self.results)] + list(self.extra_outs))

    def config_class(self) -> type:
        """The config class, importing only its module."""
        return resolve(self.config)


def resolve(target: str):
    """``"package.module:attribute"`` -> the attribute, importing only that module."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


_PERM, _CHAYTI, _CHARLES = "pflkit.experiments.perm", "pflkit.experiments.chayti", "pflkit.experiments.charles"
_NN = "pflkit.experiments.charles_nn"


def _frontier_stage(n: int, notebook: str) -> Stage:
    """A Charles et al. Pareto-frontier figure: notebooks/charles/<notebook>.py, CharlesFig<n>Config."""
    return Stage(f"charles_fig{n}", "charles", f"notebooks/charles/{notebook}.py", f"{_CHARLES}:CharlesFig{n}Config",
                 results=("run.json",), plots=(Plot("frontier.csv", template="scatter", x="rho", y="delta",
                                                    title=f"Charles & Konecny Fig. {n}: Pareto frontier",
                                                    x_label="rho", y_label="Delta"),))


def _chayti_curves(title: str) -> tuple[Plot, ...]:
    return (Plot("curves.csv", template="scatter", x="step", y="mean", title=title),)


#: every stage, in dvc.yaml's order
STAGES: tuple[Stage, ...] = (
    Stage("perm_fig1", "perm", "notebooks/perm/fig1_synthetic.py", f"{_PERM}:PermFig1Config",
          results=("history.csv", "run.json"), tune=f"{_PERM}:lr_sweep",
          plots=(Plot("curves_accuracy.csv", x="round", y_label="accuracy",
                      title="PERM Fig. 1 (synthetic): mean personalized test accuracy"),)),
    Stage("perm_fig6", "perm", "notebooks/perm/fig6_mnist_alpha.py", f"{_PERM}:PermFig6Config",
          results=("run.json", "alpha_summary.csv")),
    _frontier_stage(1, "fig1_frontiers_gamma_and_K"),
    _frontier_stage(2, "fig2_server_momentum"),
    _frontier_stage(3, "fig3_proximal"),
    _frontier_stage(4, "fig4_fedavg_vs_maml"),
    _frontier_stage(5, "fig5_simulated_maml"),
    _frontier_stage(7, "fig7_simulated_maml_L"),
    _frontier_stage(8, "fig8_simulated_maml_momentum"),
    _frontier_stage(9, "fig9_proximal_maml"),
    _frontier_stage(10, "fig10_simulated_maml_alpha"),
    Stage("charles_theory", "charles", "notebooks/charles/theory_checks.py", f"{_CHARLES}:CharlesTheoryConfig",
          figures=(), results=("theorem1.csv", "theorem2.csv", "lemmas34.csv", "lemma5.csv", "table2.csv",
                               "central.csv", "run.json")),
    Stage("perm_alpha_convergence", "perm", "notebooks/perm/alpha_convergence.py",
          f"{_PERM}:PermAlphaConvergenceConfig", results=("run.json", "convergence.csv", "own_group_mass.csv")),
    Stage("chayti_fig1", "chayti", "notebooks/chayti/fig1_speedup.py", f"{_CHAYTI}:ChaytiFig1Config",
          results=("heatmap.csv", "run.json"),
          plots=(Plot("check.csv", template="scatter", x="tau", y="speedup_measured",
                      title="Chayti Fig. 1: measured WGA(a*) speedup vs tau"),)),
    Stage("chayti_fig2", "chayti", "notebooks/chayti/fig2_convergence.py", f"{_CHAYTI}:ChaytiFig2Config",
          results=("final.csv", "tuning.csv", "run.json"),
          plots=_chayti_curves("Chayti Fig. 2: mean loss of Alone, WGA, BC")),
    Stage("chayti_fig3", "chayti", "notebooks/chayti/fig3_bc_zeta.py", f"{_CHAYTI}:ChaytiFig3Config",
          results=("final.csv", "run.json"), plots=_chayti_curves("Chayti Fig. 3: mean BC loss for several zeta")),
    Stage("chayti_fig4", "chayti", "notebooks/chayti/fig4_wga_zeta.py", f"{_CHAYTI}:ChaytiFig4Config",
          results=("final.csv", "run.json"), plots=_chayti_curves("Chayti Fig. 4: mean WGA loss for several zeta")),
    Stage("chayti_fig5", "chayti", "notebooks/chayti/fig5_bc_collaborators.py", f"{_CHAYTI}:ChaytiFig5Config",
          results=("final.csv", "run.json"), plots=_chayti_curves("Chayti Fig. 5: mean BC loss for several N")),
    Stage("perm_fig2", "perm", "notebooks/perm/fig2_cifar10.py", f"{_PERM}:PermFig2Config",
          results=("history.csv", "run.json", "curves_accuracy.csv"), tune=f"{_PERM}:lr_sweep"),
    Stage("perm_fig3", "perm", "notebooks/perm/fig3_round_time.py", f"{_PERM}:PermFig3Config",
          results=("times.csv", "run.json")),
    Stage("perm_fig4", "perm", "notebooks/perm/fig4_emnist.py", f"{_PERM}:PermFig4Config",
          results=("history.csv", "run.json", "curves_accuracy.csv"), extra_outs=("models/perm_fig4/alpha.npz",),
          tune=f"{_PERM}:lr_sweep"),
    Stage("perm_fig5", "perm", "notebooks/perm/fig5_alpha_heatmap.py", f"{_PERM}:PermFig5Config",
          results=("run.json",), extra_deps=("models/perm_fig4/alpha.npz",)),
    Stage("charles_fig12", "charles", "notebooks/charles/fig12_client_lr_fixed_eta.py", f"{_NN}:CharlesFig12Config",
          results=("history.csv", "run.json", "diverged.csv")),
    Stage("charles_fig13", "charles", "notebooks/charles/fig13_client_lr_tuned_eta.py", f"{_NN}:CharlesFig13Config",
          results=("history.csv", "run.json", "diverged.csv", "grid.csv"),
          plots=(Plot("tuned.csv", template="scatter", x="gamma", y="score",
                      title="Charles & Konecny Fig. 13: final training loss with eta tuned, per gamma",
                      x_label="gamma (client learning rate)", y_label="training loss"),)),
    Stage("charles_fig6", "charles", "notebooks/charles/fig6_server_momentum_and_alpha_femnist.py",
          f"{_NN}:CharlesFig6Config",
          figures=("fig6_server_momentum_and_alpha_femnist", "fig11_server_momentum_and_alpha_femnist"),
          results=("history.csv", "run.json", "diverged.csv", "grid.csv", "tuned.csv")),
    Stage("perm_hetero", "perm", "notebooks/perm/hetero.py", "pflkit.experiments.perm_hetero:PermHeteroConfig",
          results=("run.json", "history.csv", "groups.csv", "costs.csv", "clients.csv"),
          plots=(Plot("curves_accuracy.csv", x="round", y_label="accuracy",
                      title="PERM Sec. 3.3 (heterogeneous models): mean personalized test accuracy"),)),
    Stage("flower_equivalence", "flower", "notebooks/flower/equivalence.py",
          "pflkit.experiments.flower:FlowerEquivalenceConfig", results=("history.csv", "run.json", "final.csv")),
)

#: name -> stage
BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


def get(name: str) -> Stage | None:
    return BY_NAME.get(name)


def tunable() -> list[str]:
    """Names of the stages ``python -m pflkit tune`` can sweep."""
    return [s.name for s in STAGES if s.tune is not None]
