"""Every fault of the simulated server's fault mode, and the outcome a trial gets for it.

Integration tests: `run_trial` launches the simulator as a real process on 127.0.0.1 with one
fault kind at probability 1 (seeded), so each outcome below comes from what the tuner observed.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import tuner.server.start
from tuner.bench.records import Cell
from tuner.errors import UsageError
from tuner.server.process import port_is_free, processes_matching
from tuner.sim import nvml
from tuner.sim.faults import KINDS, ServerFaults, parse_spec
from tuner.search.space_file import load_space
from tuner.trial.context import TrialContext
from tuner.trial.run import run_trial
from tuner.search.workload import load_workload
from tuner.paths import REPO_ROOT

ROOT = REPO_ROOT
MODEL = str(ROOT / "models" / "llama-3.2-1b")
SPACE = ROOT / "search_spaces" / "infinilm.yaml"
PARAMS = {"kv_cache_tokens": 16384, "block_size": 256, "max_batch_size": 8}
CELL = Cell(concurrency=4, input_len=256, output_len=16, num_prompts=8)
OPTIONS = "after=1,span=8,count=2,seed=5"


def test_spec_parses_kinds_and_options_and_rejects_the_rest():
    spec = parse_spec("http500=0.25, cut=0.5,seed=3,after=2")
    assert spec.rates == {"http500": 0.25, "cut": 0.5} and spec.opt("after") == 2
    assert spec.opt("count") == 2  # default
    for bad in ("oops=1", "cut", "cut=x", "cut=-1", "cut=0.6,flap=0.6"):
        with pytest.raises(UsageError):
            parse_spec(bad)


def test_draws_are_seeded_per_port_and_follow_the_rates():
    spec = parse_spec(",".join(f"{k}=0.1" for k in KINDS) + ",seed=1")
    a, b = ServerFaults(spec, 40000), ServerFaults(spec, 40000)
    assert (a.kind, a.hit) == (b.kind, b.hit)
    kinds = [ServerFaults(spec, port).kind for port in range(20000, 24000)]
    for kind in KINDS:
        assert abs(kinds.count(kind) / len(kinds) - 0.1) < 0.02, kind
    assert abs(kinds.count(None) / len(kinds) - 0.3) < 0.03


def _ctx(**kw) -> TrialContext:
    workload = load_workload(ROOT / "studies" / "quick.yaml")  # warm-up: 1 request
    return TrialContext(space=load_space(SPACE), workload=workload, model_dir=MODEL,
                        simulate="rtx4090", time_scale=50.0, stall_timeout_s=600.0, **kw)


def _trial(tmp_path: Path, monkeypatch, fault: str, **kw):
    monkeypatch.setenv("TUNER_SIM_FAULTS", f"{fault}=1,{OPTIONS}")
    res = run_trial(_ctx(**kw), PARAMS, tmp_path / "t", cells=[CELL])
    port = json.loads((tmp_path / "t" / "server.json").read_text())["port"]
    assert port_is_free(port) and not processes_matching("tuner.sim", str(tmp_path))
    return res


@pytest.mark.parametrize("fault, kind, first_error", [
    ("http500", "flaky", "HTTP 500"),
    ("cut", "protocol", "connection closed mid-stream"),
    ("malformed", "protocol", "event is not JSON")])
def test_two_failed_requests_of_eight_fail_the_trial(tmp_path, monkeypatch, fault, kind,
                                                    first_error):
    """5xx answers beside successes: flaky; a request broken inside its stream: protocol."""
    res = _trial(tmp_path, monkeypatch, fault)
    assert res.outcome.kind == kind and not res.outcome.feasible
    assert "2 of 8 requests failed" in res.outcome.reason and first_error in res.outcome.reason
    assert res.metrics["completed"] == 6 and res.metrics["failed"] == 2


def test_health_that_flaps_is_flaky_not_unhealthy(tmp_path, monkeypatch):
    res = _trial(tmp_path, monkeypatch, "flap")
    assert res.outcome.kind == "flaky" and "recovered" in res.outcome.reason
    assert res.metrics["failed"] == 0


def test_start_up_slower_than_the_timeout_says_which_flag_to_raise(tmp_path, monkeypatch):
    res = _trial(tmp_path, monkeypatch, "slow_start", startup_timeout_s=200.0)
    assert res.outcome.kind == "startup" and "--startup-timeout" in res.outcome.reason


def test_port_taken_at_every_launch_is_a_startup_failure_naming_the_port(tmp_path, monkeypatch):
    res = _trial(tmp_path, monkeypatch, "port_taken")
    assert res.outcome.kind == "startup" and "port" in res.outcome.reason
    assert res.ports_taken == 2
    assert len(list((tmp_path / "t").glob("server.port-taken-*.log"))) == 2


def test_a_port_another_process_takes_is_retried_on_a_fresh_one(tmp_path, monkeypatch):
    """A real foreign listener on the port the check found free: the launch moves on."""
    thief = socket.socket()
    thief.bind(("127.0.0.1", 0))
    thief.listen(1)
    ports = iter([thief.getsockname()[1]])
    real = tuner.server.start.free_port
    monkeypatch.setattr(tuner.server.start, "free_port",
                        lambda host: next(ports, None) or real(host))
    try:
        res = run_trial(_ctx(), PARAMS, tmp_path / "t", cells=[CELL])
    finally:
        thief.close()
    assert res.outcome.kind == "ok" and res.ports_taken == 1
    lost = (tmp_path / "t" / "server.port-taken-1.log").read_text()
    assert "address already in use" in lost


def test_a_gpu_grabbed_mid_trial_spoils_the_trial_not_the_config(tmp_path, monkeypatch):
    card = tmp_path / "gpu.json"
    nvml.create(card)
    monkeypatch.setenv(nvml.SIM_NVML_ENV, str(card))
    monkeypatch.setenv("TUNER_SIM_FAULTS", f"gpu_grab=1,grab_s=3,{OPTIONS}")
    base = nvml.read_state(card).used_bytes
    res = run_trial(_ctx(gpu_index=0, gpu_baseline_bytes=base, gpu_wait_s=30.0), PARAMS,
                    tmp_path / "t", cells=[CELL])
    assert res.outcome.kind == "gpu_busy" and "took the GPU" in res.outcome.reason
    # the next trial waits for the foreign process to leave, then runs clean
    monkeypatch.delenv("TUNER_SIM_FAULTS")
    res = run_trial(_ctx(gpu_index=0, gpu_baseline_bytes=base, gpu_wait_s=30.0), PARAMS,
                    tmp_path / "t2", cells=[CELL])
    assert res.outcome.kind == "ok"
