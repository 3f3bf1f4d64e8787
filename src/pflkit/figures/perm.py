"""Drawing for the PERM plot stages: heat maps of N x N matrices written as long tables."""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns


def matrix(frame: pd.DataFrame, column: str) -> np.ndarray:
    """The N x N matrix ``column`` of a long table (``experiments.perm.matrix_frame``), in display order."""
    n = int(frame["i"].max()) + 1
    out = np.full((n, n), np.nan)
    out[frame["i"].to_numpy(), frame["j"].to_numpy()] = frame[column].to_numpy()
    return out


def heatmap(ax, values: np.ndarray, colour_label: str, title: str, cmap: str = "viridis",
            order_label: str = "by majority label") -> None:
    """One client x client heat map: rows i, columns j in display order, a labelled colour bar."""
    sns.heatmap(values, ax=ax, cmap=cmap, vmin=0, square=True, cbar_kws={"label": colour_label},
                xticklabels=False, yticklabels=False)
    ax.set(xlabel=f"client j ({order_label})", ylabel=f"client i ({order_label})")
    ax.set_title(title, fontsize=9)
