"""A study's trials and cells as pandas DataFrames: the tables `inspect` prints and exports.

Why DataFrames: one frame feeds the terminal table, `--format csv` and anyone who opens the study
in a notebook (`trials_frame(optuna.load_study(...))`), with numbers kept as numbers.
"""

from __future__ import annotations

import math

import optuna
import pandas as pd

from tuner.output.select import study_objectives
from tuner.search.slo import cell_id
from tuner.study.record import TrialRecord, records


def trials_frame(study: optuna.Study, wide: bool = False) -> pd.DataFrame:
    """One row per trial, indexed by number: outcome, objective values (NaN when not measured),
    params and constraints; `wide` adds stage, reason and every aggregate metric."""
    objectives = study_objectives(study)
    rows = []
    for t in records(study):
        row: dict[str, object] = {"outcome": t.outcome}
        for i, o in enumerate(objectives):
            row[o.metric] = t.values[i] if t.measured and t.values else math.nan
        row.update(t.params)
        row.update(t.constraints)
        if wide:
            row.update({"stage": t.stage.value, "reason": t.reason,
                        **{f"metric:{k}": v for k, v in t.metrics.items()}})
        rows.append(pd.Series(row, name=t.number))
    return pd.DataFrame(rows).rename_axis("#") if rows else pd.DataFrame()


def cells_frame(trial: TrialRecord) -> pd.DataFrame:
    """One row per cell of a trial, in the order it ran: its id, error class and metrics."""
    rows = [{"cell": cell_id(c.get("cell", {})), "error": c.get("error_class"),
             **(c.get("metrics") or {})} for c in trial.cells]
    return pd.DataFrame(rows)
