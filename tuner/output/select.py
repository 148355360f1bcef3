"""Choose one config from a study: the feasible Pareto set, then a pick rule, then robustness.

A trial re-run by a confirmation of the pick (`tuner.trial.confirm_pick`) is judged by that
confirmation's runs, not its own (`tuner.study.record.latest`).  Feasible is
`TrialRecord.feasible`: COMPLETE, every constraint <= 0, outcome "ok" and measured on
the full matrix (failed servers are COMPLETE with worst-case values, so the outcome is checked too
in case a constraint was ever left out).  Outcome "slo" (the server ran, an SLO was missed) is
infeasible but measured: its values are real and the figures plot them.  Picks:

- knee: on the Pareto set, scale each objective to [0, 1] (1 = best seen) and take the trial
  closest to the ideal point (all 1) -- the balanced compromise.
- max-throughput / min-ttft / min-tpot: best output_throughput / p99_ttft_ms / p99_tpot_ms.
- slo: the trials meeting every `--slo` term, then the best first objective among them.

Any pick may be narrowed by `--slo`.  Candidates within TIE_RTOL of the best are tied, and so
is a feasible trial run more times than the best whose figures all lie within the study's
run-to-run noise of the best's (`run_noise`: measured on the configs run more than once; a
single run that beats a config confirmed over three by less than the runs of one config differ
is no evidence that it is better: on an H100,
three picks' first runs were 6-14% above their next two, and each confirmation handed the pick
to the next single run, benchmarks/results/h100-transformers-3b-rag-r31).  Ties go to the
most robust trial: the most runs behind its figures, then the most memory headroom (the
record's peak_bytes or predicted_peak_bytes over capacity_bytes), then least spread over
repeats (`repeats`: list of metric dicts, the coefficient of variation of the pick's metric),
then the lowest trial number.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import optuna

from tuner.errors import UsageError
from tuner.output.numbers import fmt
from tuner.search.objectives import Objective
from tuner.search.slo import SloTerm, check_known, term_value, total_violation
from tuner.study import pareto
from tuner.study.record import TrialRecord, latest, records
from tuner.study.study_record import StudyInfo

PICKS = ("knee", "max-throughput", "min-ttft", "min-tpot", "slo")
PICK_METRICS = {"max-throughput": ("output_throughput", True), "min-ttft": ("p99_ttft_ms", False),
                "min-tpot": ("p99_tpot_ms", False)}
TIE_RTOL = 0.01


@dataclass(frozen=True)
class Choice:
    """The picked trial, the Pareto set it came from, and why it won."""

    trial: TrialRecord
    pareto: list[TrialRecord]
    rule: str


def study_objectives(study: optuna.Study) -> list[Objective]:
    """Objectives from the study's record, else from metric names and directions."""
    maximize = [d == optuna.study.StudyDirection.MAXIMIZE for d in study.directions]
    declared = StudyInfo.of(study).objectives
    if len(declared) == len(maximize):
        return [Objective(o.split(None, 1)[-1], mx) for o, mx in zip(declared, maximize)]
    names = study.metric_names or [f"objective_{i}" for i in range(len(maximize))]
    return [Objective(n, mx) for n, mx in zip(names, maximize)]


def feasible_front(
    trials: Sequence[TrialRecord], objectives: Sequence[Objective]
) -> list[TrialRecord]:
    """The Pareto set of the feasible trials (a confirmed config by its confirmation)."""
    return pareto.front([t for t in latest(trials) if t.feasible], objectives)


def memory_headroom(trial: TrialRecord) -> float | None:
    """Free fraction of device memory at the trial's peak (seen if recorded, else predicted)."""
    peak = trial.peak_bytes if trial.peak_bytes is not None else trial.predicted_peak_bytes
    cap = trial.capacity_bytes
    if peak is None or cap is None or cap <= 0:
        return None
    return 1.0 - peak / cap


def _run_values(trial: TrialRecord, metric: str) -> list[float]:
    """`metric` in each run behind the trial's figures (its repeats), where it has several."""
    if not isinstance(trial.repeats, list):
        return []
    runs = [r.get("metrics", r) for r in trial.repeats if isinstance(r, dict)]
    return [float(m[metric]) for m in runs if isinstance(m.get(metric), (int, float))]


def repeat_spread(trial: TrialRecord, metric: str) -> float | None:
    """Coefficient of variation of `metric` over the trial's repeats, when it has them."""
    values = _run_values(trial, metric)
    if len(values) < 2 or statistics.fmean(values) == 0:
        return None
    return statistics.pstdev(values) / abs(statistics.fmean(values))


def run_noise(trials: Sequence[TrialRecord], metric: str) -> float:
    """How far apart runs of one config fall in this study: over the configs run more than once,
    the median of `metric`'s range over its runs relative to their median (TIE_RTOL at least,
    and where no config was run twice)."""
    spreads = []
    for t in trials:
        values = _run_values(t, metric)
        if len(values) >= 2 and statistics.median(values) != 0:
            spreads.append((max(values) - min(values)) / abs(statistics.median(values)))
    return max(TIE_RTOL, statistics.median(spreads)) if spreads else TIE_RTOL


def metric_value(trial: TrialRecord, metric: str, objectives: Sequence[Objective]) -> float | None:
    """The trial's aggregate metric, falling back to the objective value of the same name."""
    value = trial.metrics.get(metric)
    if isinstance(value, (int, float)):
        return float(value)
    for obj, v in zip(objectives, trial.values or ()):
        if obj.metric == metric:
            return float(v)
    return None


def _knee_scores(front: Sequence[TrialRecord], objectives: Sequence[Objective]) -> dict[int, float]:
    """Distance of each trial to the ideal point after scaling every objective to [0, 1]."""
    dist = {t.number: 0.0 for t in front}
    for i, obj in enumerate(objectives):
        vals = [t.values[i] for t in front if t.values is not None]
        lo, hi = min(vals), max(vals)
        for t in front:
            assert t.values is not None
            good = 1.0 if hi == lo else (t.values[i] - lo) / (hi - lo)
            good = good if obj.maximize else 1.0 - good
            dist[t.number] += (1.0 - good) ** 2
    return {n: math.sqrt(d) for n, d in dist.items()}


def _robust_key(trial: TrialRecord, metric: str) -> tuple[int, float, float, int]:
    room = memory_headroom(trial)
    spread = repeat_spread(trial, metric)
    return (-trial.runs, -(room if room is not None else -math.inf),
            spread if spread is not None else math.inf, trial.number)


def _surest(tied: list[TrialRecord], pick: str,
            objectives: list[Objective]) -> list[TrialRecord]:
    """Of tied trials, those run the most times; where those are several and each was run
    more than once, the best of them by `pick` on their medians (and its own ties)."""
    most = max(t.runs for t in tied)
    surest = [t for t in tied if t.runs == most]
    if most == 1 or len(surest) == 1:
        return surest
    scores, _, tol = _scores(pick, surest, objectives)
    best = min(scores.values())
    return [t for t in surest if t.number in scores and scores[t.number] <= best + tol]


def _within_noise(trial: TrialRecord, lead: TrialRecord, noise: Mapping[str, float],
                  objectives: Sequence[Objective]) -> bool:
    """Whether `trial`'s figures are all within the study's run-to-run noise of `lead`'s."""
    for metric, rel in noise.items():
        a, b = metric_value(trial, metric, objectives), metric_value(lead, metric, objectives)
        if a is None or b is None or abs(a - b) > rel * abs(b):
            return False
    return True


def explain_infeasible(trials: Sequence[TrialRecord]) -> str:
    """Why nothing is feasible: counts of outcomes and the first failure reason."""
    if not trials:
        return "the study has no trials"
    counts = Counter(t.outcome for t in trials)
    summary = ", ".join(f"{n} {o}" for o, n in counts.most_common())
    reason = next((t.reason for t in trials if not t.feasible and t.reason), "")
    return f"{len(trials)} trials: {summary}" + (f" (e.g. {reason})" if reason else "")


def _within_slo(feasible: list[TrialRecord], all_trials: list[TrialRecord],
                slo: Sequence[SloTerm]) -> list[TrialRecord]:
    check_known(slo, all_trials)
    meeting = [t for t in feasible if total_violation(slo, t) == 0]
    if not meeting:
        closest = min(feasible, key=lambda t: (total_violation(slo, t), t.number))
        missed = "; ".join(f"{term} (is {fmt(term_value(term, closest))})" for term in slo
                           if term.violation(term_value(term, closest)) > 0)
        raise UsageError(f"no feasible trial meets --slo; closest is trial {closest.number}, "
                         f"which misses {missed}")
    return meeting


def _scores(pick: str, front: list[TrialRecord],
            objectives: list[Objective]) -> tuple[dict[int, float], str, float]:
    """Score per trial (lower wins), the metric ties are judged on, and the tie tolerance."""
    if pick == "knee":
        return _knee_scores(front, objectives), objectives[0].metric, TIE_RTOL
    metric, maximize = PICK_METRICS.get(pick, (objectives[0].metric, objectives[0].maximize))
    scores = {}
    for t in front:
        v = metric_value(t, metric, objectives)
        if v is not None:
            scores[t.number] = -v if maximize else v
    if not scores:
        raise UsageError(f"--pick {pick}: no feasible trial recorded {metric}")
    return scores, metric, TIE_RTOL * max(abs(min(scores.values())), 1e-12)


def choose(study: optuna.Study, pick: str = "knee", slo: Sequence[SloTerm] = ()) -> Choice:
    """Pick one feasible trial; UsageError (naming the closest trial) when none qualifies."""
    if pick not in PICKS:
        raise UsageError(f"unknown --pick {pick!r} (choose from {', '.join(PICKS)})")
    if pick == "slo" and not slo:
        raise UsageError("--pick slo needs --slo, e.g. --slo 'ttft_p99<=2000ms,tpot_p99<=50ms'")
    trials = latest(records(study))
    objectives = study_objectives(study)
    feasible = [t for t in trials if t.feasible]
    if not feasible:
        raise UsageError(f"no feasible trial in study {study.study_name!r}: "
                         f"{explain_infeasible(trials)}")
    if slo:
        feasible = _within_slo(feasible, trials, slo)
    front = pareto.front(feasible, objectives)
    scores, metric, tol = _scores(pick, front, objectives)
    best = min(scores.values())
    lead = min((t for t in front if scores.get(t.number) == best), key=lambda t: t.number)
    noise = {m: run_noise(trials, m)
             for m in ([o.metric for o in objectives] if pick == "knee" else [metric])}
    tied = [t for t in front if t.number in scores and scores[t.number] <= best + tol]
    tied += [t for t in feasible if t not in tied and t.runs > lead.runs
             and _within_noise(t, lead, noise, objectives)]
    tied = _surest(tied, pick, objectives)
    winner = min(tied, key=lambda t: _robust_key(t, metric))
    within = f" within --slo {','.join(map(str, slo))}" if slo else ""
    rule = f"{pick}{within}" + (
        f", tie of {len(tied)} broken by robustness" if len(tied) > 1 else "")
    if winner.runs > lead.runs:
        rule += (f"; its {winner.runs} runs are within the run-to-run noise ("
                 + ", ".join(f"{m} {100 * r:.0f}%" for m, r in noise.items())
                 + f") of trial {lead.number}'s "
                 + ("single run" if lead.runs == 1 else f"{lead.runs} runs"))
    return Choice(winner, front, rule)


def choose_trial(study: optuna.Study, number: int) -> Choice:
    """Trial `number` as the choice, if it exists and is feasible."""
    trials = records(study)
    match = [t for t in trials if t.number == number]
    if not match:
        raise UsageError(f"no trial {number} in study {study.study_name!r}")
    again = [t.number for t in trials if t.confirms == number]
    if again:
        raise UsageError(f"trial {number} was re-run by confirmation trial {again[-1]}, whose "
                         "runs replace it: choose that one")
    if not match[0].feasible:
        raise UsageError(f"trial {number} is not feasible (outcome {match[0].outcome})")
    return Choice(match[0], feasible_front(trials, study_objectives(study)), f"--trial {number}")
