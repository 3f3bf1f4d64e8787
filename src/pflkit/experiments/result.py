"""The one result type every figure function returns, whatever the paper."""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd


@dataclass
class StageResult:
    """A figure function's result.

    * ``table``: the final table the notebook prints (what the regression checks compare);
    * ``metrics``: what goes to metrics.json (numbers, which dataset ran, claim verdicts);
    * ``data_label`` / ``scale``: the dataset that ran (a substitute named as such) and the scale, for
      titles and text;
    * ``run_info``: what goes to run.json (config, data summary, environment);
    * ``frames``: the stage's other tables by name (``history``, ``curves``, ``frame``, ...);
    * ``extra``: anything else a figure needs (final states, grids, labels).

    A name in ``frames`` or ``extra`` reads as an attribute: ``result.history`` is
    ``result.frames["history"]``."""

    table: pd.DataFrame
    metrics: dict
    data_label: str
    scale: str
    run_info: dict = field(default_factory=dict)
    frames: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def __getattr__(self, name: str):
        if not name.startswith("__"):
            for bag in ("frames", "extra"):
                values = self.__dict__.get(bag) or {}
                if name in values:
                    return values[name]
        frames, extra = sorted(self.__dict__.get("frames") or {}), sorted(self.__dict__.get("extra") or {})
        raise AttributeError(f"{type(self).__name__} has no {name!r} (frames: {frames}, extra: {extra})")
