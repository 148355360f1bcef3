"""Choose one config from a study: the feasible Pareto set, then a pick rule, then robustness.

Feasible means what Optuna means (COMPLETE, every constraint <= 0) *and* outcome "ok": the study
loop stores failed servers as COMPLETE with worst-case values, so the outcome is checked too in
case a constraint was ever left out.  Outcome "slo" (the server ran, an SLO was missed) is
infeasible but measured: its values are real and the figures plot them.  Picks:

- knee: on the Pareto set, scale each objective to [0, 1] (1 = best seen) and take the trial
  closest to the ideal point (all 1) -- the balanced compromise.
- max-throughput / min-ttft / min-tpot: best output_throughput / p99_ttft_ms / p99_tpot_ms.
- slo: the trials meeting every `--slo` term, then the best first objective among them.

Any pick may be narrowed by `--slo`.  Candidates within TIE_RTOL of the best are tied; ties go to
the most robust trial: most memory headroom (user_attrs peak_bytes or predicted_peak_bytes over
capacity_bytes), then least spread over repeats (user_attr `repeats`: list of metric dicts, the
coefficient of variation of the pick's metric), then the lowest trial number.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.errors import UsageError
from tuner.output.slo import SloTerm, check_known, term_value, total_violation

PICKS = ("knee", "max-throughput", "min-ttft", "min-tpot", "slo")
PICK_METRICS = {"max-throughput": ("output_throughput", True), "min-ttft": ("p99_ttft_ms", False),
                "min-tpot": ("p99_tpot_ms", False)}
TIE_RTOL = 0.01
MEASURED_OUTCOMES = ("ok", "slo")


@dataclass(frozen=True)
class Objective:
    """One objective: the metric it names and whether bigger is better."""

    metric: str
    maximize: bool

    def __str__(self) -> str:
        return f"{'max' if self.maximize else 'min'} {self.metric}"


@dataclass(frozen=True)
class Choice:
    """The picked trial, the Pareto set it came from, and why it won."""

    trial: FrozenTrial
    pareto: list[FrozenTrial]
    rule: str


def study_objectives(study: optuna.Study) -> list[Objective]:
    """Objectives from the study attr `objectives`, else from metric names and directions."""
    maximize = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
    declared = study.user_attrs.get("objectives")
    if isinstance(declared, list) and len(declared) == len(maximize):
        return [Objective(str(o).split(None, 1)[-1], mx) for o, mx in zip(declared, maximize)]
    names = study.metric_names or [f"objective_{i}" for i in range(len(maximize))]
    return [Objective(n, mx) for n, mx in zip(names, maximize)]


def outcome(trial: FrozenTrial) -> str:
    """The stored outcome; else "ok" for a COMPLETE trial, the Optuna state (running, fail) otherwise."""
    if "outcome" in trial.user_attrs:
        return str(trial.user_attrs["outcome"])
    return "ok" if trial.state == TrialState.COMPLETE else trial.state.name.lower()


def is_measured(trial: FrozenTrial) -> bool:
    """COMPLETE with values that were measured (ok or slo), not worst-case stand-ins."""
    return (trial.state == TrialState.COMPLETE and trial.values is not None
            and outcome(trial) in MEASURED_OUTCOMES)


def is_feasible(trial: FrozenTrial) -> bool:
    """COMPLETE, all constraints <= 0, the server ran ok, and the values were measured on the
    full matrix (a config screened out after the screening cells carries estimated values)."""
    return (trial.state == TrialState.COMPLETE and trial.values is not None
            and all(v <= 0 for v in trial.constraints.values()) and outcome(trial) == "ok"
            and trial.user_attrs.get("stage") != "screen")


def pareto_front(trials: Sequence[FrozenTrial], objectives: Sequence[Objective]) -> list[FrozenTrial]:
    """The non-dominated trials (by their objective values), in trial-number order."""
    signs = [-1.0 if o.maximize else 1.0 for o in objectives]
    keyed = [(t, [s * v for s, v in zip(signs, t.values)]) for t in trials]

    def dominated(a: list[float]) -> bool:
        return any(all(x <= y for x, y in zip(b, a)) and any(x < y for x, y in zip(b, a)) for _, b in keyed)

    return sorted((t for t, a in keyed if not dominated(a)), key=lambda t: t.number)


def memory_headroom(trial: FrozenTrial) -> float | None:
    """Free fraction of device memory at the trial's peak (seen if recorded, else predicted)."""
    attrs = trial.user_attrs
    peak = attrs.get("peak_bytes", attrs.get("predicted_peak_bytes"))
    cap = attrs.get("capacity_bytes")
    if not isinstance(peak, (int, float)) or not isinstance(cap, (int, float)) or cap <= 0:
        return None
    return 1.0 - peak / cap


def repeat_spread(trial: FrozenTrial, metric: str) -> float | None:
    """Coefficient of variation of `metric` over the trial's repeats, when it has them."""
    repeats = trial.user_attrs.get("repeats")
    if not isinstance(repeats, list):
        return None
    values = []
    for rep in repeats:
        metrics = rep.get("metrics", rep) if isinstance(rep, dict) else {}
        if isinstance(metrics.get(metric), (int, float)):
            values.append(float(metrics[metric]))
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.pstdev(values) / abs(statistics.fmean(values))


def metric_value(trial: FrozenTrial, metric: str, objectives: Sequence[Objective]) -> float | None:
    """The trial's aggregate metric, falling back to the objective value of the same name."""
    value = (trial.user_attrs.get("metrics") or {}).get(metric)
    if isinstance(value, (int, float)):
        return float(value)
    for obj, v in zip(objectives, trial.values or []):
        if obj.metric == metric:
            return float(v)
    return None


def _knee_scores(front: Sequence[FrozenTrial], objectives: Sequence[Objective]) -> dict[int, float]:
    """Distance of each trial to the ideal point after scaling every objective to [0, 1]."""
    dist = {t.number: 0.0 for t in front}
    for i, obj in enumerate(objectives):
        vals = [t.values[i] for t in front]
        lo, hi = min(vals), max(vals)
        for t in front:
            good = 1.0 if hi == lo else (t.values[i] - lo) / (hi - lo)
            good = good if obj.maximize else 1.0 - good
            dist[t.number] += (1.0 - good) ** 2
    return {n: math.sqrt(d) for n, d in dist.items()}


def _robust_key(trial: FrozenTrial, metric: str) -> tuple[float, float, int]:
    room = memory_headroom(trial)
    spread = repeat_spread(trial, metric)
    return (-(room if room is not None else -math.inf), spread if spread is not None else math.inf,
            trial.number)


def explain_infeasible(trials: Sequence[FrozenTrial]) -> str:
    """Why nothing is feasible: counts of outcomes and the first failure reason."""
    if not trials:
        return "the study has no trials"
    counts = Counter(outcome(t) for t in trials)
    summary = ", ".join(f"{n} {o}" for o, n in counts.most_common())
    failed = [t for t in trials if not is_feasible(t)]
    reason = next((t.user_attrs.get("reason") for t in failed if t.user_attrs.get("reason")), "")
    return f"{len(trials)} trials: {summary}" + (f" (e.g. {reason})" if reason else "")


def choose(study: optuna.Study, pick: str = "knee", slo: Sequence[SloTerm] = ()) -> Choice:
    """Pick one feasible trial; UsageError (naming the closest trial) when none qualifies."""
    if pick not in PICKS:
        raise UsageError(f"unknown --pick {pick!r} (choose from {', '.join(PICKS)})")
    if pick == "slo" and not slo:
        raise UsageError("--pick slo needs --slo, e.g. --slo 'ttft_p99<=2000ms,tpot_p99<=50ms'")
    trials = study.get_trials(deepcopy=False)
    objectives = study_objectives(study)
    feasible = [t for t in trials if is_feasible(t)]
    if not feasible:
        raise UsageError(f"no feasible trial in study {study.study_name!r}: {explain_infeasible(trials)}")
    if slo:
        check_known(slo, [t.user_attrs for t in trials])
        meeting = [t for t in feasible if total_violation(slo, t.user_attrs) == 0]
        if not meeting:
            closest = min(feasible, key=lambda t: (total_violation(slo, t.user_attrs), t.number))
            missed = "; ".join(f"{term} (is {term_value(term, closest.user_attrs)})" for term in slo
                               if term.violation(term_value(term, closest.user_attrs)) > 0)
            raise UsageError(f"no feasible trial meets --slo; closest is trial {closest.number}, "
                             f"which misses {missed}")
        feasible = meeting
    front = pareto_front(feasible, objectives)
    if pick == "knee":
        scores, metric, tol = _knee_scores(front, objectives), objectives[0].metric, TIE_RTOL
    else:
        metric, maximize = PICK_METRICS.get(pick, (objectives[0].metric, objectives[0].maximize))
        scores = {}
        for t in front:
            v = metric_value(t, metric, objectives)
            if v is not None:
                scores[t.number] = -v if maximize else v
        if not scores:
            raise UsageError(f"--pick {pick}: no feasible trial recorded {metric}")
        tol = TIE_RTOL * max(abs(min(scores.values())), 1e-12)
    best = min(scores.values())
    tied = [t for t in front if t.number in scores and scores[t.number] <= best + tol]
    winner = min(tied, key=lambda t: _robust_key(t, metric))
    rule = f"{pick}{' within --slo' if slo else ''}" + (f", tie of {len(tied)} broken by robustness"
                                                          if len(tied) > 1 else "")
    return Choice(winner, front, rule)
