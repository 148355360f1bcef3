"""Parse and evaluate `--slo` specs for picking a config: aggregate or per-cell limits.

Syntax (also shown by `tuner export --help`)::

    SPEC  := TERM ("," TERM)*
    TERM  := ["cell:" CELL ":"] METRIC OP NUMBER [UNIT]
    CELL  := c<concurrency>_i<input_len>_o<output_len>        e.g. c64_i256_o256
    METRIC:= a vllm metric name (p99_ttft_ms, output_throughput, mean_tpot_ms, ...)
             or the short form <name>_<pNN|mean|median|std>: ttft_p99 = p99_ttft_ms
    OP    := <= | < | >= | >
    UNIT  := ms | s          (only on *_ms metrics; s is converted to ms)
             tok/s | req/s   (only on *_throughput metrics; no conversion)

Without `cell:` a term limits the trial's aggregate metric (the worst cell for p99_*, the mean for
mean_*, see docs/architecture.md); with it, that one cell's metric.  Metric names are checked
against what the study recorded, so a typo is an error rather than a silently empty selection.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.errors import UsageError

_TERM = re.compile(
    r"^(?:cell:(?P<cell>[^:]+):)?(?P<metric>[A-Za-z0-9_]+)\s*(?P<op><=|>=|<|>)\s*"
    r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(?P<unit>ms|s|tok/s|req/s)?$"
)
_SHORT = re.compile(r"^([a-z0-9]+)_(p\d+|mean|median|std)$")
_CELL = re.compile(r"^c(\d+)_i(\d+)_o(\d+)$")


class Measured(Protocol):
    """What an SLO is judged on: a trial's aggregate metrics and its per-cell rows."""

    @property
    def metrics(self) -> Mapping[str, float]: ...

    @property
    def cells(self) -> Sequence[Mapping[str, Any]]: ...


@dataclass(frozen=True)
class SloTerm:
    """One limit: `metric op limit`, on the aggregate (cell None) or on one cell."""

    metric: str
    op: str
    limit: float
    cell: str | None = None

    def __str__(self) -> str:
        where = f"cell:{self.cell}:" if self.cell else ""
        return f"{where}{self.metric}{self.op}{self.limit:g}"

    def signed(self, value: float) -> float:
        """Relative distance to the limit, > 0 on the wrong side: a graded Optuna constraint."""
        scale = max(abs(self.limit), 1e-12)
        over = value - self.limit if self.op in ("<=", "<") else self.limit - value
        return over / scale

    def violation(self, value: float | None) -> float:
        """0 when met, else the relative distance to the limit (inf when the value is missing)."""
        if value is None or not math.isfinite(value):
            return math.inf
        met = {"<=": value <= self.limit, "<": value < self.limit,
               ">=": value >= self.limit, ">": value > self.limit}[self.op]
        return 0.0 if met else max(self.signed(value), 1e-12)


def cell_id(cell: Mapping[str, Any]) -> str:
    """The name a cell goes by in SLO specs and reports: c<concurrency>_i<input>_o<output>."""
    return f"c{cell.get('concurrency')}_i{cell.get('input_len')}_o{cell.get('output_len')}"


def canonical_metric(name: str) -> str:
    """Map the short form (ttft_p99) to the vllm name (p99_ttft_ms); other names pass through."""
    m = _SHORT.match(name)
    return f"{m.group(2)}_{m.group(1)}_ms" if m else name


def parse_slo(spec: str) -> list[SloTerm]:
    """Parse a comma-separated SLO spec; raises UsageError naming the bad term."""
    terms = []
    for raw in spec.split(","):
        text = raw.strip()
        if not text:
            continue
        m = _TERM.match(text)
        if not m:
            raise UsageError(
                f"bad SLO term {text!r}: expected "
                "[cell:c<C>_i<I>_o<O>:]METRIC(<=|<|>=|>)NUMBER[ms|s]"
            )
        metric = canonical_metric(m.group("metric"))
        limit = float(m.group("num"))
        unit = m.group("unit")
        if unit in ("ms", "s"):
            if not metric.endswith("_ms"):
                raise UsageError(f"SLO term {text!r}: unit {unit} only applies to *_ms metrics")
            limit *= 1000.0 if unit == "s" else 1.0
        elif unit and not metric.endswith("_throughput"):
            raise UsageError(f"SLO term {text!r}: unit {unit} only applies to *_throughput metrics")
        cell = m.group("cell")
        if cell is not None and not _CELL.match(cell):
            raise UsageError(f"SLO term {text!r}: cell must look like c64_i256_o256")
        terms.append(SloTerm(metric, m.group("op"), limit, cell))
    if not terms:
        raise UsageError("empty --slo spec")
    return terms


def check_known(terms: Iterable[SloTerm], trials: Iterable[Measured]) -> None:
    """Refuse metrics and cells that no trial recorded (typos would otherwise select nothing)."""
    agg: set[str] = set()
    per_cell: dict[str, set[str]] = {}
    for trial in trials:
        agg.update(trial.metrics.keys())
        for c in trial.cells:
            per_cell.setdefault(cell_id(c.get("cell", {})), set()).update(
                (c.get("metrics") or {}).keys()
            )
    for term in terms:
        if term.cell is None:
            known = agg
        elif term.cell not in per_cell:
            raise UsageError(f"unknown cell {term.cell!r} in --slo (known: "
                             f"{', '.join(sorted(per_cell)) or 'none'})")
        else:
            known = per_cell[term.cell]
        if term.metric not in known:
            raise UsageError(f"unknown SLO metric {term.metric!r} (known: "
                             f"{', '.join(sorted(known)) or 'none recorded'})")


def term_value(term: SloTerm, trial: Measured) -> float | None:
    """The value a trial has for the term's metric (its aggregate, or one cell's), or None."""
    if term.cell is None:
        value = trial.metrics.get(term.metric)
    else:
        value = None
        for c in trial.cells:
            if cell_id(c.get("cell", {})) == term.cell:
                value = (c.get("metrics") or {}).get(term.metric)
    return float(value) if isinstance(value, (int, float)) else None


def total_violation(terms: Iterable[SloTerm], trial: Measured) -> float:
    """Sum of relative violations: 0 means every term is met."""
    return sum(t.violation(term_value(t, trial)) for t in terms)
