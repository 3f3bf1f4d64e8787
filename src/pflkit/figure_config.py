"""The figure settings a plot stage reads (params.yaml ``figures``), apart from :mod:`pflkit.plotting` so that the
stage runner validates a plot stage without loading matplotlib and seaborn, and apart from :mod:`pflkit.config`,
which every compute stage imports: a change here re-runs plot stages only."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from .config import StageConfig

#: what the band around a mean curve shows: +-1 standard deviation over seeds (or runs), +-1 standard
#: error, or nothing
BANDS = ("sd", "se", "none")
CONTEXTS = ("paper", "notebook", "talk", "poster")


class FigureConfig(StageConfig):
    """A plot stage's settings (:func:`pflkit.plotting.configure` applies them): it reads its source stage's
    results folder (``results_dir``) and writes figures into ``figures_dir``."""
    computes = False  # it reads results files and draws: no torch
    context: Literal[CONTEXTS]
    font_scale: float = Field(gt=0, le=4)
    dpi: int = Field(ge=50, le=600)
    band: Literal[BANDS]
