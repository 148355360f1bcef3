"""One number format, units on labels, and why the default-config comparison is blank."""

from __future__ import annotations

import math

import pytest
from optuna.trial import TrialState

from tuner.output.numbers import (axis_title, default_blank_reason, fmt, ratio, vs_default_line,
                                  with_unit)
from tuner.search.objectives import Objective
from tuner.study.record import Stage, TrialRecord

OBJ = [Objective("output_throughput", True), Objective("p99_ttft_ms", False)]


def rec(number: int, outcome: str = "ok", values=(200.0, 1000.0), **kw) -> TrialRecord:
    return TrialRecord(number=number, state=TrialState.COMPLETE, values=tuple(values),
                       constraints={}, params={}, outcome=outcome, **kw)


@pytest.mark.parametrize(("value", "text"), [
    (3223.4948527504853, "3,223.5"), (27.2449, "27.2"), (0.4249, "0.42"), (0.0, "0.00"),
    (0.00123, "0.0012"), (13055, "13,055"), (-0.1037, "-0.10"), (math.inf, "inf"),
    (True, "True"), ("x", "x")])
def test_fmt(value, text):
    assert fmt(value) == text


def test_units():
    assert with_unit("output_throughput", 296.84) == "296.8 tok/s"
    assert with_unit("p99_ttft_ms", 3284.77) == "3,284.8 ms"
    assert axis_title("request_throughput") == "request_throughput (req/s)"
    assert axis_title("capacity_rps") == "capacity_rps (req/s)"


def test_blank_reasons_name_what_happened():
    assert "ran no default config" in default_blank_reason(None)
    skipped = rec(0, "skipped", values=(0.0, 6e5), is_default=True, reason="needs 30 GiB")
    assert default_blank_reason(skipped) == ("the default config (trial 0) was skipped by the "
                                             "memory pre-screen: needs 30 GiB; no measured values "
                                             "to compare with")
    assert "failed (oom)" in default_blank_reason(rec(0, "oom", is_default=True))
    screened = rec(0, stage=Stage.SCREEN, is_default=True)
    assert "only ran the screening cells" in default_blank_reason(screened)
    assert default_blank_reason(rec(0, is_default=True)) is None


def test_ratio_and_line():
    default, best, failed = rec(0, is_default=True), rec(1, values=(300.0, 500.0)), rec(2, "oom")
    assert ratio(best, default, 0) == 1.5 and ratio(failed, default, 0) is None
    assert vs_default_line(best, default, OBJ) == ("vs default (trial 0): output_throughput 1.50x, "
                                                   "p99_ttft_ms 0.50x")
    assert vs_default_line(best, None, OBJ).startswith("vs default: none, the study ran no")


def test_a_default_with_knobs_the_space_leaves_open_says_which_were_sampled():
    """transformers.yaml gives defaults for two of seven knobs: the H200 study's trial 0 ran
    five sampled ones (r17), and its label said only "server default"."""
    import dataclasses

    from tuner.output.trial_table import _note, footnotes

    params = {"block": 256, "budget": 5365, "kv_share": 0.65, "blocks": 82}

    def run(number, **kw):
        return dataclasses.replace(rec(number), params=params, **kw)
    default = run(0, is_default=True, given=("block",))
    assert default.sampled == ["blocks", "budget"]
    assert _note(default) == "server default (2 knobs sampled)"
    assert footnotes(default)[-1].endswith("sampled: blocks, budget")
    whole = run(0, is_default=True, given=("block", "blocks", "budget"))
    assert whole.sampled == [] and _note(whole) == "server default"
    old = run(0, is_default=True)                          # a study from before `given_knobs`
    assert old.sampled == [] and _note(old) == "server default"
    assert run(1, given=("block",)).sampled == []
