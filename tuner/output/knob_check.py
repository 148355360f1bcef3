"""Which knobs moved nothing: a check that a study's knobs reach the server at all.

A knob the server does not read (the seed report's INFINILM_* scheduler variables against an
unpatched InfiniLM, a typo in an env name) silently wastes the sampler's budget.  Over the
trials that ran to completion, each knob's fANOVA importance for each objective says how much
of the objective's variance it explains; a knob below `threshold` for every objective showed no
measurable effect in this study.  With few trials fANOVA is noisy, so this is a warning to
look, not a proof: the report says how many trials it used, a knob that all but one trial
left at the same value is reported as too little varied to judge (fANOVA would call it dead),
and the report points to `tuner ablate`, which settles the question one knob at a time.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.importance import FanovaImportanceEvaluator, get_param_importances
from optuna.trial import FrozenTrial, TrialState

from tuner.study.record import KV_SHARE, TrialRecord
from tuner.study.study_record import StudyInfo

MIN_TRIALS = 5


@dataclass(frozen=True)
class KnobReport:
    trials_used: int
    importance: dict[str, dict[str, float]]   # knob -> objective label -> share of variance
    no_effect: list[str]                      # knobs below the threshold for every objective
    constant: list[str]                       # knobs that took a single value in those trials
    barely_varied: list[str]                  # all trials but one at the same value: no verdict


def knob_report(study: optuna.Study, threshold: float = 0.02) -> KnobReport | None:
    """fANOVA importances over the study's `ok` trials; None with fewer than MIN_TRIALS."""
    ok = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
          if (r := TrialRecord.of(t)).outcome == "ok" and r.original]
    if len(ok) < MIN_TRIALS:
        return None
    labels = list(StudyInfo.of(study).objectives) or \
        [f"objective {i}" for i in range(len(study.directions))]
    ok = _common_ranges(ok)
    params = sorted({k for t in ok for k in t.params} - {KV_SHARE})
    counts = {p: Counter(repr(t.params.get(p)) for t in ok) for p in params}
    constant = [p for p in params if len(counts[p]) == 1]
    varying = [p for p in params if p not in constant]
    barely = [p for p in varying if counts[p].most_common(1)[0][1] >= len(ok) - 1]
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the throw-away study is not news
    try:
        shadow = optuna.create_study(directions=study.directions)
    finally:
        optuna.logging.set_verbosity(verbosity)
    shadow.add_trials(ok)
    importance: dict[str, dict[str, float]] = {p: {} for p in varying}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, label in enumerate(labels):
            if len({t.values[i] for t in ok}) < 2:
                continue
            scores = get_param_importances(shadow, evaluator=FanovaImportanceEvaluator(seed=0),
                                           params=varying, target=_objective(i))
            for p in varying:
                importance[p][label] = float(scores.get(p, 0.0))
    no_effect = [p for p in varying if p not in barely
                 and all(v < threshold for v in importance[p].values())]
    return KnobReport(len(ok), importance, no_effect, constant, barely)


def _objective(i: int) -> Callable[[FrozenTrial], float]:
    return lambda t: t.values[i]


def _common_ranges(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials with one distribution per knob: a KV knob rendered from a share is suggested
    as a single value per trial (tuner.trial.kv_share), which fANOVA takes for a dynamic space;
    a study resumed with the share after drawing absolute sizes holds both kinds for that knob."""
    ints = optuna.distributions.IntDistribution
    single = {name for t in trials for name, d in t.distributions.items()
              if isinstance(d, ints) and d.single()}
    spans: dict[str, tuple[float, float]] = {}
    for t in trials:
        for name in single & set(t.distributions):
            d = t.distributions[name]
            if isinstance(d, ints):
                lo, hi = spans.get(name, (d.low, d.high))
                spans[name] = (min(lo, d.low), max(hi, d.high))
    if not spans:
        return trials
    wide = {n: optuna.distributions.IntDistribution(int(lo), int(max(hi, lo + 1)))
            for n, (lo, hi) in spans.items()}
    return [optuna.trial.create_trial(params=t.params, distributions={**t.distributions, **wide},
                                      values=t.values, user_attrs=t.user_attrs) for t in trials]


def describe(report: KnobReport | None, threshold: float = 0.02) -> str:
    if report is None:
        return f"knob check: needs at least {MIN_TRIALS} ok trials"
    lines = [
        f"knob check over {report.trials_used} ok trials "
        "(fANOVA share of each objective's variance):"
    ]
    for knob, per in sorted(
        report.importance.items(), key=lambda kv: -max(kv[1].values(), default=0)
    ):
        lines.append(f"  {knob:28s} " + "  ".join(f"{lab}={v:.2f}" for lab, v in per.items()))
    if report.no_effect:
        lines.append(f"  no measurable effect (< {threshold:.0%} on every objective): "
                     + ", ".join(report.no_effect) + " (with few trials this is noisy)")
    if report.barely_varied:
        lines.append("  too little varied to judge (all ok trials but one at one value): "
                     + ", ".join(report.barely_varied))
    if report.constant:
        lines.append("  never varied among ok trials: " + ", ".join(report.constant))
    unsure = report.no_effect + report.barely_varied + report.constant
    if unsure:
        lines.append(
            "  to check whether the server reads them: tuner ablate --knobs "
            + ",".join(unsure)
            + " (plus the study's --study/--model/--space/--workload)"
        )
    return "\n".join(lines)
