# %% [markdown]
# # PERM, Fig. 5 — the learned mixing weights of the Fig. 4 run
#
# Heat map of alpha (N x N; row i = client i's weights over all clients) at the end of the Fig. 4
# PERM run (first seed). Clients are ordered by their majority label so clients with similar label
# distributions sit together. The dataset is whatever Fig. 4 ran (a named substitute offline).
# The smoke default reads the alpha that the Fig. 4 notebook's smoke run saved (run it first);
# `dvc repro` reads `models/perm_fig4/alpha.npz`.

# %% tags=["parameters"]
stage = "perm_fig5"
profile = "smoke"  # smoke: params.yaml's section with its profiles.smoke overlay (fast; what nbval runs)
threads = None  # torch CPU threads; None keeps params.yaml's (auto means $OMP_NUM_THREADS if set, else 1)
results_dir = None  # None: build/<profile>/<stage>; dvc repro passes results/<stage>
figures_dir = None  # None: build/<profile>/figures/<paper>; dvc repro passes figures/<paper>

# %%
import numpy as np
import pandas as pd

from pflkit import report
from pflkit.experiments import perm as experiment

cfg = experiment.PermFig5Config.from_namespace(globals())
saved = experiment.load_alpha(cfg.alpha_file)
alpha, counts = saved["alpha"], saved["label_counts"]
majority = counts.argmax(1)
order = np.lexsort((-counts.max(1), majority))
share = counts / counts.sum(1, keepdims=True)
similarity = share @ share.T  # overlap of label distributions

# %%
# trained float32 results: tests/regression compares them within measured tolerances
summary = pd.Series({
    "clients": len(alpha),
    "effective support (mean 1/sum a^2)": float((1 / (alpha ** 2).sum(1)).mean()),
    "self weight (mean)": float(np.diag(alpha).mean()),
    "mass on same-majority-label clients": float((alpha * (majority[:, None] == majority[None, :])).sum(1).mean()),
    "corr(alpha_ij, label overlap), i != j": float(np.corrcoef(alpha[~np.eye(len(alpha), dtype=bool)],
                                                                similarity[~np.eye(len(alpha), dtype=bool)])[0, 1]),
})
report.print_table(summary.to_frame("value"))

# %%
report.write_stage(cfg.results_dir, {"dataset": str(saved["dataset"]), **summary.to_dict()},
                   alpha=experiment.matrix_frame(order, alpha=alpha, overlap=similarity),
                   run_info={"stage": cfg.stage, "config": cfg.model_dump(), "environment": report.environment(),
                             "data_label": str(saved["dataset"]), "scale": str(saved["scale"])})
