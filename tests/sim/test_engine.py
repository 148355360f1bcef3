"""Engine invariants: block accounting, caps, the long-context rules, failures, determinism."""

import math
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest

from tuner.bench.records import Cell
from tuner.errors import UsageError
from tuner.search.model import load_model_info
from tuner.sim import StartupFailure, simulate
from tuner.sim.config import parse_config
from tuner.sim.engine import Engine
from tuner.sim.profiles import get_profile

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "llama-3.1-8b")
INFO = load_model_info(MODEL)
GPU = get_profile("rtx4090")
FINAL_ENV = {
    "INFINILM_PREFILL_BATCH_CAP": "8", "INFINILM_DECODE_BATCH_CAP": "24",
    "INFINILM_LONG_CONTEXT_THRESHOLD": "4096", "INFINILM_LONG_CONTEXT_MAX_BATCH": "1",
    "INFINILM_DECODE_FIRST_WHEN_RUNNING": "1",
}


def make_engine(argv, env=None, log=None):
    cfg = parse_config(["--model", MODEL, "--enable-graph", *argv], env or {})
    return Engine(INFO, GPU, cfg, log)


class Recorder:
    """Wraps an engine's step functions to see every batch and the pool after each step."""

    def __init__(self, engine):
        self.engine, self.prefills, self.decodes, self.free_seen = engine, [], [], []
        pick_p, pick_d = engine._pick_prefill, engine._pick_decode

        def pick_prefill():
            running = list(engine.running)
            batch = pick_p()
            if batch:
                self.prefills.append((batch, running))
            self.free_seen.append(engine.free_blocks)
            return batch

        def pick_decode():
            batch = pick_d()
            self.decodes.append(batch)
            return batch

        engine._pick_prefill, engine._pick_decode = pick_prefill, pick_decode


def drive(engine, prompts, max_tokens, concurrency, total):
    """Closed loop on a bare engine; checks the block books after every advance."""
    reqs, rng = [], np.random.default_rng(1)

    def send():
        reqs.append(engine.submit(int(rng.choice(prompts)), int(rng.choice(max_tokens)), engine.clock))

    for _ in range(concurrency):
        send()
    while engine.failed is None:
        done = engine.advance()
        reserved = sum(r.blocks for r in engine.running)
        assert 0 <= engine.free_blocks and engine.free_blocks + reserved == engine.cfg.num_blocks
        for _ in done:
            if len(reqs) < total:
                send()
        if engine.idle():
            break
    return reqs


def test_blocks_never_over_allocated_and_every_request_finishes():
    engine = make_engine(["--num-blocks", "40", "--max-batch-size", "16"], FINAL_ENV)
    rec = Recorder(engine)
    reqs = drive(engine, [36, 100, 292, 1000], [1, 50, 256, 700], concurrency=12, total=120)
    assert engine.failed is None and len(reqs) == 120
    assert all(r.finished and r.error is None and r.generated == r.max_tokens for r in reqs)
    assert min(rec.free_seen) >= 0 and engine.free_blocks == 40
    for r in reqs:  # reservation: ceil((prompt + max_tokens) / block_size)
        assert r.blocks == math.ceil((r.prompt_len + r.max_tokens) / 256)


def test_caps_are_respected():
    env = {"INFINILM_PREFILL_BATCH_CAP": "3", "INFINILM_DECODE_BATCH_CAP": "5",
           "INFINILM_MAX_NUM_BATCHED_TOKENS": "1024"}
    engine = make_engine(["--num-blocks", "64", "--max-batch-size", "16"], env)
    rec = Recorder(engine)
    drive(engine, [100, 300, 600], [20, 60], concurrency=16, total=80)
    assert engine.failed is None
    assert rec.prefills and max(len(b) for b, _ in rec.prefills) == 3
    assert max(len(b) for b in rec.decodes) == 5
    for batch, _ in rec.prefills:  # token budget, except a lone request
        assert len(batch) == 1 or sum(r.prompt_len for r in batch) <= 1024


def test_max_batch_size_bounds_both_phases():
    engine = make_engine(["--num-blocks", "64", "--max-batch-size", "4"])
    rec = Recorder(engine)
    drive(engine, [40], [30], concurrency=12, total=24)
    assert max(len(b) for b, _ in rec.prefills) == 4 and max(len(b) for b in rec.decodes) == 4


def test_long_context_guard_and_decode_first():
    engine = make_engine(["--num-blocks", "64", "--max-batch-size", "64"], FINAL_ENV)
    rec = Recorder(engine)
    drive(engine, [40, 4132, 4200], [40, 200], concurrency=8, total=40)
    assert engine.failed is None
    longs = [(b, running) for b, running in rec.prefills if any(r.prompt_len >= 4096 for r in b)]
    assert longs
    for batch, running in longs:
        assert sum(r.prompt_len >= 4096 for r in batch) <= 1
        assert not running  # decode-first: no long prefill while anything decodes
    for batch in rec.decodes:
        assert sum(r.prompt_len >= 4096 for r in batch) <= 1


def test_oom_stops_the_engine_with_infinilm_log_lines():
    lines = []
    engine = make_engine(["--num-blocks", "64", "--max-batch-size", "64"], log=lines.append)
    reqs = [engine.submit(4132, 100, 0.0) for _ in range(2)]
    engine.advance()
    assert engine.failed and "cudaMalloc failed" in engine.failed
    assert lines[0] == "[rank 0] exception during forward: cudaMalloc failed: out of memory"
    assert lines[1] == "RankWorker stopped during run"
    assert lines[2].startswith("infinilm.llm.llm - ERROR - Error in step loop: ")
    assert not any(r.token_times for r in reqs)
    steps = engine.steps
    engine.advance(1e9)
    assert engine.steps == steps  # the step loop is dead


def test_every_admitted_request_ends_with_a_reason_after_oom():
    argv = ["--num-blocks", "64", "--max-batch-size", "64", "--enable-graph"]
    res = simulate(MODEL, "rtx4090", argv, {}, [Cell(16, 256, 256, 32), Cell(1, 32, 16, 2)])
    assert [r.error_class for r in res] == ["oom", "oom"]
    assert all(rec.error and rec.error_class == "oom" for rec in res[0].records)
    assert res[0].peak_bytes > res[0].capacity_bytes


def test_unservable_request_fails_at_once_with_a_reason():
    engine = make_engine(["--num-blocks", "4"])
    req = engine.submit(1000, 100, 0.0)
    assert req.finished and "needs 5 KV blocks" in req.error


def test_requests_queued_out_of_arrival_order_are_served_in_arrival_order():
    """Over HTTP a request can reach the queue after one stamped earlier (a closed-loop
    replacement stamped at its hold's time); a head that has not arrived yet must not block
    the ones that have (it stalled the simulated server for good after a cut stream)."""
    engine = make_engine(["--num-blocks", "64"])
    late = engine.submit(292, 16, 1.445)
    early = [engine.submit(292, 16, 1.373) for _ in range(2)]
    assert engine.waiting == [*early, late]
    while not engine.idle():
        assert engine.advance(), "the engine stalled with requests queued"
    assert all(r.finished and r.error is None for r in [late, *early])
    assert early[0].token_times[0] < late.token_times[0]


def test_startup_failures():
    with pytest.raises(StartupFailure) as exc:
        make_engine(["--num-blocks", "200"])
    assert exc.value.log_lines[-1] == "Application startup failed. Exiting."
    assert exc.value.log_lines[0].startswith("Error Code 2 in cudaMalloc")
    with pytest.raises(StartupFailure, match="block_size=128"):
        make_engine(["--num-blocks", "64", "--block-size", "128"])
    with pytest.raises(StartupFailure, match="MAX_NUM_BATCHED_TOKENS"):
        make_engine([], {"INFINILM_MAX_NUM_BATCHED_TOKENS": "512"})


def test_a_memory_cap_shrinks_the_simulated_card():
    """An H200 under --gpu-memory-cap 24GiB is a 24 GiB card to the server (the ballast holds
    the rest), so InfiniLM's default 512 x 256 pool of an 8B model cannot start; 64 x 256 can."""
    cap = {"TUNER_GPU_MEMORY_CAP_GIB": "24"}
    assert get_profile("h200", cap).memory_mib == 24576 < get_profile("h200").memory_mib
    assert get_profile("rtx4090", cap).memory_mib == 24564     # never above the card
    argv = ["--model", MODEL, "--enable-graph", "--num-blocks", "512"]
    simulate(MODEL, "h200", argv, {}, [])                       # the whole card: starts
    with pytest.raises(StartupFailure):
        simulate(MODEL, "h200", argv, cap, [])
    simulate(MODEL, "h200", argv[:-1] + ["64"], cap, [])
    with pytest.raises(UsageError, match="GiB"):
        get_profile("h200", {"TUNER_GPU_MEMORY_CAP_GIB": "lots"})


def test_bad_input_is_a_usage_error():
    with pytest.raises(UsageError, match="INFINILM_PREFILL_BATCH_CAP"):
        parse_config(["--model", MODEL], {"INFINILM_PREFILL_BATCH_CAP": "eight"})
    with pytest.raises(UsageError):
        parse_config(["--model", MODEL, "--no-such-flag"], {})
    with pytest.raises(UsageError, match="profile"):
        simulate(MODEL, "tpu9000", [], {}, [])


def test_argv_with_program_prefix_is_accepted():
    cfg = parse_config(["python", "-m", "tuner.sim", "--model", MODEL, "--num-blocks", "7"], {})
    assert cfg.num_blocks == 7


def _records(res):
    return [(r.send_time, tuple(r.token_times)) for c in res for r in c.records]


def test_deterministic_with_a_seed_and_jitter_changes_with_it():
    argv = ["--num-blocks", "64", "--max-batch-size", "64", "--jitter", "0.05"]
    cells = [Cell(4, 256, 64, 12), Cell(8, 32, 32, 16, request_rate=20.0)]
    a = simulate(MODEL, "rtx4090", argv, FINAL_ENV, cells, seed=3)
    b = simulate(MODEL, "rtx4090", argv, FINAL_ENV, cells, seed=3)
    c = simulate(MODEL, "rtx4090", argv, FINAL_ENV, cells, seed=4)
    assert _records(a) == _records(b) and _records(a) != _records(c)
    assert all(r.metrics["completed"] == r.cell.num_prompts for r in a)


def test_open_loop_and_duration_cells():
    argv = ["--num-blocks", "64", "--max-batch-size", "64"]
    res = simulate(MODEL, "rtx4090", argv, FINAL_ENV,
                   [Cell(4, 32, 16, 10, request_rate=5.0), Cell(2, 32, 16, duration_s=3.0)])
    assert res[0].metrics["completed"] == 10 and res[0].duration_s > 1.0
    assert res[1].metrics["completed"] >= 2 and all(r.send_time <= res[1].records[0].send_time + 3.0
                                                    for r in res[1].records)


def test_calibration_script_passes():
    mod = runpy.run_path(str(ROOT / "benchmarks" / "sim_calibration.py"))
    argv, sys.argv = sys.argv, ["sim_calibration.py"]
    try:
        assert mod["main"]() == 0
    finally:
        sys.argv = argv


def test_help_exits_0_and_a_bad_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_config(["--help"], {})
    assert exc.value.code == 0 and "--time-scale" in capsys.readouterr().out
    with pytest.raises(UsageError, match="bad simulator arguments: --bogus"):
        parse_config(["--bogus"], {})
