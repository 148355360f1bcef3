"""How numbers and the default-config comparison read in every table, message and figure.

Why one module: `inspect`, the result block, best.env, report.html and error messages each
printed numbers their own way (`3223.4948527504853`, `5492`, `5,491.9`), and each left the
comparison with the server's default config blank without saying why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tuner.search.objectives import Objective, unit
from tuner.study.record import Stage, TrialRecord

_WHY_UNMEASURED = {
    "skipped": "was skipped by the memory pre-screen",
    "slo": "missed an SLO",
}


def fmt(v: object, group: bool = True) -> str:
    """One number format everywhere: thousands separators (unless `group` is False, where a
    comma separates items), 1 decimal from 10 up, 2 below, two significant digits for tiny
    values; ints stay whole; inf/nan said as words."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    sep = "," if group else ""
    if isinstance(v, int):
        return f"{v:{sep}}"
    if not math.isfinite(v):
        return str(v)
    if abs(v) >= 10:
        return f"{v:{sep}.1f}"
    if v == 0 or abs(v) >= 0.01:
        return f"{v:.2f}"
    return f"{v:.2g}"


def with_unit(metric: str, v: object) -> str:
    """`296.8 tok/s`, `3,284.8 ms`: the value and the metric's unit."""
    return f"{fmt(v)} {unit(metric)}".rstrip()


def axis_title(metric: str) -> str:
    """A plot axis label with its unit: `p99_ttft_ms (ms)`, `output_throughput (tok/s)`."""
    u = unit(metric)
    return f"{metric} ({u})" if u else metric


def default_trial(trials: Sequence[TrialRecord]) -> TrialRecord | None:
    """The trial of the server's own defaults, if the study ran one."""
    return next((t for t in trials if t.is_default), None)


def default_blank_reason(default: TrialRecord | None) -> str | None:
    """Why nothing can be compared with the default config, or None when it was measured in
    full: it was never run, was pre-screened, failed, or carries screening estimates."""
    if default is None:
        return ("the study ran no default config (made with --no-defaults, or the space "
                "declares no defaults)")
    head = f"the default config (trial {default.number})"
    if default.measured and default.stage == Stage.FULL:
        return None
    if default.measured:
        return f"{head} only ran the screening cells (its values are estimates)"
    why = _WHY_UNMEASURED.get(default.outcome, f"failed ({default.outcome})")
    reason = f": {default.reason[:100]}" if default.reason else ""
    return f"{head} {why}{reason}; no measured values to compare with"


def ratio(t: TrialRecord, default: TrialRecord | None, i: int) -> float | None:
    """Objective i of `t` over the default's; None when either is not measured."""
    if default_blank_reason(default) is not None or not t.measured:
        return None
    assert default is not None and default.values is not None and t.values is not None
    base = default.values[i]
    return t.values[i] / base if base else None


def vs_default_line(t: TrialRecord, default: TrialRecord | None,
                    objectives: Sequence[Objective]) -> str:
    """The result block's comparison: each objective as a multiple of the default's, or why
    there is none."""
    blank = default_blank_reason(default)
    if blank is not None:
        return f"vs default: none, {blank}"
    assert default is not None
    parts = [f"{o.metric} {r:.2f}x" for i, o in enumerate(objectives)
             if (r := ratio(t, default, i)) is not None]
    return f"vs default (trial {default.number}): " + ", ".join(parts)
