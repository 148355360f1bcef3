"""Admission holds of the simulated server: announced requests arrive when they were due."""

import time

import pytest

from tuner.sim import admission
from tuner.sim.admission import Admission, parse_plan


def test_plan_header_parsing():
    assert parse_plan("ab12 8 16") == ("ab12", 8, 16)
    assert parse_plan("ab12 8 0") == ("ab12", 8, None)
    for bad in (None, "", "ab12 8", "ab12 0 16", "ab12 x 16", "ab12 8 -1"):
        assert parse_plan(bad) is None


def test_first_wave_arrives_at_the_first_requests_time():
    adm = Admission()
    assert adm.arrive("p 3 6", 10.0) == (10.0, "p")
    assert adm.holding()
    assert adm.arrive("p 3 6", 10.4) == (10.0, "p")
    assert adm.holding()
    assert adm.arrive("p 3 6", 10.9) == (10.0, "p")
    assert not adm.holding() and adm.late == 0


def test_follow_ups_arrive_at_the_step_end_until_the_plan_is_spent():
    adm = Admission()
    for rid, now in enumerate((1.0, 1.1)):
        adm.track(rid, adm.arrive("p 2 3", now)[1])
    assert not adm.holding()
    # both finish at 5.0: only one request of the plan is left, so one follow-up is awaited
    assert adm.finished([0, 1], 5.0, time.perf_counter())
    assert adm.arrive("p 2 3", 5.7) == (5.0, "p")
    assert not adm.holding()
    adm.track(2, "p")
    assert not adm.finished([2], 9.0, time.perf_counter())  # the plan is spent: no hold


def test_requests_without_a_plan_and_late_ones_arrive_at_the_wall_clock_time(monkeypatch):
    monkeypatch.setattr(admission, "HOLD_S", 0.01)
    adm = Admission()
    assert adm.arrive(None, 3.0) == (3.0, None)
    adm.track(0, adm.arrive("q 1 0", 4.0)[1])  # one stream, total unknown
    assert adm.finished([0], 6.0, time.perf_counter())
    time.sleep(0.02)
    assert not adm.holding()  # the hold gave up
    assert adm.arrive("q 1 0", 6.9) == (6.9, "q") and adm.late == 1


@pytest.mark.parametrize("header", ["p 2 2", "p 2 0"])
def test_a_hold_waits_no_longer_than_hold_s(monkeypatch, header):
    monkeypatch.setattr(admission, "HOLD_S", 0.01)
    adm = Admission()
    adm.arrive(header, 1.0)
    assert adm.holding()
    time.sleep(0.02)
    assert not adm.holding()


def test_a_replacement_sent_before_its_failed_request_finished_is_not_waited_for():
    """A broken stream fails on the client's side while the engine still runs the request; the
    client's next request arrives first.  The engine must not then hold (and stop stepping,
    a stall of HOLD_S wall seconds) for a request that has already come."""
    adm = Admission()
    for rid, now in enumerate((1.0, 1.0)):
        adm.track(rid, adm.arrive("p 2 0", now)[1])
    assert not adm.holding()
    adm.track(2, adm.arrive("p 2 0", 2.0)[1])  # request 0's stream broke: its replacement
    assert adm.late == 1
    assert not adm.finished([0], 3.0, time.perf_counter())  # request 0 ends in the engine
    assert not adm.holding()
    assert adm.finished([1], 4.0, time.perf_counter())  # a normal end is still held for
    assert adm.arrive("p 2 0", 4.5) == (4.0, "p") and not adm.holding()
