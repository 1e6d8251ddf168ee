"""A RULER `*_filled` task is read by its filled-region accuracy, `acc_filled` (RidgeFill paper section 3.1),
in the generic tables."""

from __future__ import annotations

from rf_eval.stats.measures.base import TaskMeasures


class RulerFilled(TaskMeasures):
    name = "ruler_filled"
    suffix = "_filled"
    metrics_read = ("acc_filled",)
