"""The terminal table of `tuner inspect`: a handful of columns by default, every one on request.

Why a narrow default: with a dozen knobs and their constraints the full table is about 300
characters wide and wraps into noise.  The default shows what a user reads first (outcome, the
objectives in their units, the gain over the server's default config, why a trial failed);
`--wide` prints every param and constraint.  Trials without measured values (failures,
pre-screen skips) show `-`, never the worst-case stand-ins the sampler is given.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import optuna

from tuner.output.numbers import default_blank_reason, default_trial, fmt, ratio
from tuner.output.select import Choice, study_objectives
from tuner.output.tables import trials_frame
from tuner.search.objectives import unit
from tuner.study.record import Stage, TrialRecord, records

NOTE_WIDTH = 50


def _note(t: TrialRecord) -> str:
    """Why a row looks the way it does, in a few words."""
    parts = []
    if t.is_default:
        sampled = t.sampled
        parts.append(f"server default ({len(sampled)} knobs sampled)" if sampled
                     else "server default")
    if t.cached_from is not None:
        parts.append(f"copy of trial {t.cached_from}")
    if t.confirms is not None:
        parts.append(f"trial {t.confirms} confirmed: medians of {t.runs} runs")
    if t.measured and t.stage == Stage.SCREEN:
        parts.append("screened out: values estimated from the screening cells")
    if t.outcome != "ok" and t.reason and not (t.confirms is not None and t.outcome == "slo"):
        parts.append(t.reason)
    text = "; ".join(parts)
    return text if len(text) <= NOTE_WIDTH else text[:NOTE_WIDTH - 3] + "..."


def _marks(t: TrialRecord, pareto: Sequence[int], chosen: int | None) -> str:
    return (">" if t.number == chosen else "") + ("*" if t.number in pareto else "")


def _render(header: list[str], rows: list[list[str]], left: set[int]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = []
    for r in [header, *rows]:
        cells = [c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in
                 enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def compact(study: optuna.Study, pareto: Sequence[int], choice: Choice | None) -> str:
    """Marks, number, outcome, objectives with units, x default, note; then the footnotes."""
    trials = records(study)
    objectives = study_objectives(study)
    default = default_trial(trials)
    chosen = choice.trial.number if choice else None
    header = ["", "#", "outcome",
              *[f"{o.metric} ({unit(o.metric)})" if unit(o.metric) else o.metric
                for o in objectives],
              f"vs default ({objectives[0].metric})" if objectives else "vs default", "note"]
    rows = []
    for t in trials:
        values = [fmt(v) if t.measured and t.values else "-"
                  for v in (t.values or [math.nan] * len(objectives))]
        r = ratio(t, default, 0) if objectives else None
        rows.append([_marks(t, pareto, chosen), str(t.number), t.outcome, *values,
                     f"{r:.2f}x" if r is not None else "-", _note(t)])
    text = _render(header, rows, left={0, 2, len(header) - 1})
    return text + "\n" + "\n".join(footnotes(default))


def footnotes(default: TrialRecord | None) -> list[str]:
    """What a `-` means, once, under the table."""
    notes = ["'-': not measured (the trial failed or was skipped; it is infeasible, and the "
             "worst-case values the sampler was given are not shown)"]
    blank = default_blank_reason(default)
    if blank is not None:
        notes.append(f"vs default: '-' throughout: {blank}")
    elif default is not None:
        notes.append(f"vs default: the first objective as a multiple of trial "
                     f"{default.number}'s (the server's default config)")
        if default.sampled:
            notes.append(f"  trial {default.number} is the server's default only where the "
                         f"space gives one; sampled: {', '.join(default.sampled)}")
    return notes


def wide(study: optuna.Study, pareto: Sequence[int], choice: Choice | None) -> str:
    """Every column `trials_frame` has (params, constraints), in the same number format."""
    frame = trials_frame(study).reset_index()
    if frame.empty:
        return "(no trials)"
    chosen = choice.trial.number if choice else None
    frame.insert(0, "", [(">" if n == chosen else "") + ("*" if n in pareto else "")
                         for n in frame["#"]])
    return frame.to_string(index=False, na_rep="-", float_format=fmt)
