"""Pre-screen evidence: a nearer measurement outweighs a scale carried from a farther config,
and the least forward every cell runs bars a config at the smallest scale any run measured."""

import math
from pathlib import Path

import optuna
from optuna.distributions import IntDistribution

from tuner.bench.records import Cell
from tuner.search.model import load_model_info
from tuner.study.record import TrialRecord
from tuner.trial.kv_calibration import calibrate, measured, proven, vouched
from tuner.trial.memory_estimate import Estimate, Knobs, act_bytes_per_token, estimate
from tuner.trial.prescreen import decide, estimate_attr

from .test_kv_share import _marked

ROOT = Path(__file__).resolve().parents[2]
GIB = 2 ** 30
CAP = 24 * GIB


def _formed(pool: float, forward: float, form: str, least: float = 0.0) -> Estimate:
    """One cell "big" whose worst case has `form`; sizes in GiB."""
    return Estimate(15 * GIB, int(pool * GIB), 2 * GIB, int(forward * GIB), "big",
                    cell_forwards=(("big", int(forward * GIB)),), cell_forms=(("big", form),),
                    cell_least=(("big", int(least * GIB)),))


def _knobs(params: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in params.items() if k != "kv"}


def test_a_config_measured_on_its_own_knobs_is_not_judged_by_a_far_configs_scale():
    """Its own knobs (another pool) measured the cell at 0.9 in one form; a config two knobs
    away measured the config's form at 1.2.  At 1.2 the config does not fit (15 + 5.3 + 2 +
    1.2 x 1.5 = 24.1 GiB); at its own 0.9 it does.  The measured-scale rule skips it unless the
    nearer measurement vouches for the cell, as it does for one knob from its own and two
    from the far one.  A config one knob from the far one, or as far from both (the tie
    takes the larger scale, at which it does not fit), is judged by the rule; so is one a
    knob from its own: that run measured another form, and the proposals' model sizes the
    config at the least its form measured (`Calibration.k`), the far config's 1.2."""
    own = _marked({"x": 1, "y": 1, "kv": 100}, 0.9, "prefill of 1")
    far = _marked({"x": 2, "y": 2, "kv": 200}, 1.2, "prefill of 2")
    trials = [own, far]
    cal = calibrate(trials, CAP, _knobs)
    est = _formed(5.3, 1.5, "prefill of 2")
    scales = measured(trials)
    assert math.isclose(scales[("big", False, "prefill of 2")], 1.2)
    mine = vouched(trials, est, False, {"x": 1, "y": 1}, cal, _knobs, CAP)
    assert mine == {"big"}
    assert decide(est, CAP, trials, measured=scales).skip
    assert not decide(est, CAP, trials, measured=scales, vouched=mine).skip
    assert vouched(trials, est, False, {"x": 2, "y": 3}, cal, _knobs, CAP) == frozenset()
    assert vouched(trials, est, False, {"x": 3, "y": 3}, cal, _knobs, CAP) == frozenset()
    assert vouched(trials, est, False, {"x": 1, "y": 3}, cal, _knobs, CAP) == frozenset()
    # a nearer run that puts the scale no higher than the nearest's condemns nothing
    assert vouched([own], est, False, {"x": 1, "y": 1}, calibrate([own], CAP, _knobs),
                   _knobs, CAP) == {"big"}


def _oom(params: dict[str, int], scale: float, form: str) -> TrialRecord:
    """A run of `params` (pool 4 GiB) that ran out of memory in the cell "big", whose forward
    of `form` was estimated at 3 GiB / `scale`: it proved the scale over `scale`."""
    est = _formed(4, 3 / scale, form)
    return TrialRecord.of(optuna.trial.create_trial(
        params=params, values=[0.0], distributions={n: IntDistribution(0, 100000) for n in params},
        user_attrs={"memory_estimate": estimate_attr(est, False), "outcome": "oom",
                    "cells": [{"cell": {"key": "big"}, "error_class": "oom"}]}))


def test_a_scale_the_proposals_model_already_exceeds_condemns_nothing():
    """Mistral-7B / RTX 4090, seed 4: the config's nearest measured run N (a knob away)
    measured 0.9; O, a knob away too, ran out of memory and proved the scale over 0.95, so the
    proposals' model doubles that under-estimate to 1.0 and sizes the config at its edge by it;
    P, two knobs away, proved 1.05, but the healthy N at a pool as large differs from P only
    where the config has N's knob, so that OOM is charged to P's knob (`Calibration.oom_bound`).
    At 1.05 the config does not fit (15 + 4 + 2 + 1.05 x 2.94 = 24.09 GiB).  O's 0.95 is under
    the scale the config was sized at, so it no longer takes the cell from N's vouching, and
    the proven-scale rule does not skip the config; the OOM that P proved still condemns it
    for a config that has P's knob."""
    form = "prefill of 1 beside 20 decodes"
    own = _marked({"x": 1, "y": 1, "z": 1, "kv": 100}, 0.9, form)
    trials = [own, _oom({"x": 2, "y": 2, "z": 1, "kv": 100}, 0.95, form),
              _oom({"x": 1, "y": 1, "z": 2, "kv": 100}, 1.05, form)]
    cal = calibrate(trials, CAP, _knobs)
    config = {"x": 1, "y": 2, "z": 1}
    assert math.isclose(cal.k("big", knobs=config, form=form), 1.0, rel_tol=1e-6)
    est = _formed(4, 3 / 1.02, form)
    mine = vouched(trials, est, False, config, cal, _knobs, CAP)
    assert mine == {"big"}
    proved = proven(trials, CAP)
    assert math.isclose(proved[("big", False, form)], 1.05, rel_tol=1e-6)
    assert decide(est, CAP, trials, proven=proved).skip
    assert not decide(est, CAP, trials, proven=proved, vouched=mine).skip
    assert vouched(trials, est, False, {"x": 1, "y": 2, "z": 2}, cal, _knobs, CAP) == frozenset()


def test_one_prompts_prefill_at_the_smallest_scale_measured_bars_what_cannot_hold_it():
    """Runs measured forwards no smaller than 0.8 of the estimate (in another cell and form)
    and started with 2 GiB of runtime.  A config whose own form nothing measured is still
    skipped when one prompt's prefill alone (0.6 GiB estimated) cannot fit at 0.8; with no
    mark at all, when its weights, pool and least runtime alone exceed the card."""
    idle = _marked({"x": 1, "kv": 100}, 0.8, "decode")
    smallest = {("other", False, "decode"): 0.8}
    fits = _formed(6.5, 1.5, "prefill of 4", least=0.6)         # 21.5 + 2 + 0.48 < 24
    over = _formed(6.6, 1.5, "prefill of 4", least=0.6)         # 21.6 + 2 + 0.48 > 24
    assert not decide(fits, CAP, [idle], measured=smallest).skip
    verdict = decide(over, CAP, [idle], measured=smallest)
    assert verdict.skip and "every form of forward" in verdict.reason
    assert not decide(over, CAP, [idle], measured={}).skip     # no mark: start-up only
    unstartable = _formed(7.1, 1.5, "prefill of 4", least=0.6)  # 22.1 + 2 > 24
    assert decide(unstartable, CAP, [idle], measured={}).skip
    assert not decide(unstartable, CAP, []).skip               # no runtime seen: the prior


def test_the_least_forward_is_one_prompts_prefill_at_most_a_step_or_none_if_unadmitted():
    model = load_model_info(ROOT / "models" / "llama-3.1-8b")
    cells = (Cell(4, 4096, 1024, 8), Cell(64, 256, 256, 64))
    est = estimate(model, Knobs(kv_tokens=65536, block_size=256), cells)
    assert dict(est.cell_least) == {c.key: act_bytes_per_token(model) * c.input_len
                                    for c in cells}
    assert dict(estimate(model, Knobs(kv_tokens=1024, block_size=256), cells).cell_least)[
        cells[0].key] == 0
    chunked = estimate(model, Knobs(kv_tokens=65536, block_size=256, token_budget=1024), cells)
    assert dict(chunked.cell_least) == {cells[0].key: act_bytes_per_token(model) * 1024,
                                        cells[1].key: act_bytes_per_token(model) * 256}
