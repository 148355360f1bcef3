"""Warm starts (clip, seed configs, earlier Pareto sets) and the adaptive pipeline end to end."""

from pathlib import Path

import optuna
import pytest

from tuner.bench.records import Cell
from tuner.search.bounds import parse_size, resolve_space
from tuner.errors import UsageError
from tuner.search.model import load_model_info
from tuner.search.objectives import parse_objectives
from tuner.trial.pipeline import AdaptivePipeline
from tuner.trial.inprocess import InProcessRunner
from tuner.search.space_file import load_space
from tuner.study.objective import TrialObjective
from tuner.trial.context import TrialContext
from tuner.search.warmstart import clip_to_space, enqueue, load_seed_config, pareto_configs
from tuner.search.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "llama-3.1-8b")
M8B = load_model_info(MODEL)
CELLS = (Cell(4, 4096, 64, 4), Cell(16, 256, 64, 16))
SPACE = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), M8B,
                      parse_size("24564MiB"), CELLS)


def test_defaults_are_clipped_into_the_card():
    clipped = clip_to_space(SPACE, SPACE.default_params())
    assert clipped["kv_cache_tokens"] == SPACE.param("kv_cache_tokens").high < 131072
    assert clipped["block_size"] == 256 and clipped["max_batch_size"] == 8


def test_a_hand_config_never_loses_a_knob_to_an_unresolved_auto_bound(tmp_path):
    """Once, clipping into a space whose `high: auto` was not resolved dropped the KV knob
    silently, and a hand config ran with the server's default pool (the H200 side by side)."""
    raw = load_space(ROOT / "search_spaces" / "infinilm.yaml")    # kv high: auto, not resolved
    y = tmp_path / "seed.yaml"
    y.write_text("kv_cache_tokens: 16384\nblock_size: 256\n")
    with pytest.raises(UsageError, match="not resolved"):
        load_seed_config(raw, y)
    assert load_seed_config(SPACE, y) == {"kv_cache_tokens": 16384, "block_size": 256}


def test_seed_config_from_yaml_and_env_file(tmp_path):
    y = tmp_path / "seed.yaml"
    y.write_text("kv_cache_tokens: 16384\nblock_size: 256\nprefill_batch_cap: 8\n")
    assert load_seed_config(SPACE, y) == {"kv_cache_tokens": 16384, "block_size": 256,
                                          "prefill_batch_cap": 8}
    e = tmp_path / "best.env"
    e.write_text("TUNER_SERVER_ARGS=--num-blocks,64,--block-size,256,--enable-graph\n"
                 "INFINILM_DECODE_BATCH_CAP=24\nINFINILM_DECODE_FIRST_WHEN_RUNNING=1\n")
    got = load_seed_config(SPACE, e)
    assert got["kv_cache_tokens"] == 64 * 256 and got["enable_graph"] is True
    assert got["decode_batch_cap"] == 24 and got["decode_first_when_running"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text("no_such_knob: 1\n")
    with pytest.raises(UsageError, match="unknown knob"):
        load_seed_config(SPACE, bad)


def _pipeline_study(n: int, seed_params: list[dict]) -> optuna.Study:
    workload = Workload("t", 0, None, CELLS, ("max output_throughput",), {"p99_tpot_ms": 80.0})
    ctx = TrialContext(space=SPACE, workload=workload, model_dir=MODEL, simulate="rtx4090")
    objectives = parse_objectives(["max output_throughput"])
    pipe = AdaptivePipeline(ctx, objectives, M8B, parse_size("24564MiB"),
                            runner=InProcessRunner("rtx4090"), screen_cells=1, confirm=1)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed=0))
    enqueue(study, seed_params)
    study.optimize(TrialObjective(ctx, objectives, Path("/nonexistent"), n, pipeline=pipe), n_trials=n)
    return study


def test_pipeline_skips_runs_confirms_and_warm_starts_a_later_study():
    good = {"kv_cache_tokens": 16384, "block_size": 256, "max_batch_size": 32, "enable_graph": True,
            "prefill_batch_cap": 8, "decode_batch_cap": 24, "long_context_threshold": 4096,
            "long_context_max_batch": 1, "decode_first_when_running": True}
    hopeless = dict(good, kv_cache_tokens=SPACE.param("kv_cache_tokens").high)
    study = _pipeline_study(3, [hopeless, good])
    skipped, ran = study.trials[0], study.trials[1]
    assert skipped.state.name == "COMPLETE" and skipped.user_attrs["outcome"] == "skipped"
    assert skipped.constraints["feasible"] > 0 and skipped.user_attrs["predicted_peak_bytes"] > \
        skipped.user_attrs["capacity_bytes"]
    assert skipped.constraints["memory"] > 0 and ran.constraints["memory"] < 0
    assert ran.user_attrs["outcome"] == "ok" and ran.user_attrs["stage"] == "full"
    assert len(ran.user_attrs["repeats"]) == 2           # first run + 1 confirmation
    assert ran.user_attrs["cell_order"][0] == CELLS[0].key
    front = pareto_configs(study, SPACE)
    ok = [t for t in study.trials if t.user_attrs["outcome"] == "ok"]
    assert front == [clip_to_space(SPACE, max(ok, key=lambda t: t.values[0]).params)]
    fresh = optuna.create_study(direction="maximize")
    assert enqueue(fresh, front + front) == len(front)  # duplicates are not queued twice


def test_in_process_runner_sees_the_memory_cap_as_a_server_does(tmp_path):
    """run_trial hands ctx.extra_env (the cap) to the server; the in-process runner must too, or
    an H200 study under --gpu-memory-cap 24GiB is simulated on the whole 141 GB card."""
    workload = Workload("t", 0, None, CELLS[:1], ("max output_throughput",))
    default_pool = {"kv_cache_tokens": 131072, "block_size": 256}
    h200 = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), M8B,
                         parse_size("140GiB"), CELLS)
    whole = TrialContext(space=h200, workload=workload, model_dir=MODEL, simulate="h200")
    capped = TrialContext(space=h200, workload=workload, model_dir=MODEL, simulate="h200",
                          extra_env={"TUNER_GPU_MEMORY_CAP_GIB": "24"})
    assert InProcessRunner("h200")(whole, default_pool, tmp_path).outcome.kind == "ok"
    res = InProcessRunner("h200")(capped, default_pool, tmp_path)
    assert res.outcome.kind == "oom" and "start-up" in res.outcome.reason


def test_the_budget_range_ends_at_a_short_context(tmp_path):
    """InfiniLM refuses a prefill token budget over the model's context length at start-up.
    infinilm.yaml's budget range tops out at 32768: on an 8k-context model every budget over
    8k was a failed launch until `within_context`."""
    import json
    cfg = json.loads((ROOT / "models" / "llama-3.1-8b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "max_position_embeddings": 8192}))
    model = load_model_info(tmp_path)
    cells = (Cell(2, 1024, 64, 2),)
    space = resolve_space(load_space(ROOT / "search_spaces" / "infinilm.yaml"), model,
                          parse_size("24GiB"), cells)
    assert space.param("max_num_batched_tokens").bounds == (1024, 8192)
    top = {**clip_to_space(space, space.default_params()), "kv_cache_tokens": 16384,
           "max_num_batched_tokens": 8192}
    ctx = TrialContext(space=space, workload=Workload("w", 0, None, cells,
                                                      ("max output_throughput",), {}),
                       model_dir=str(tmp_path), simulate="rtx4090")
    assert InProcessRunner("rtx4090")(ctx, top, tmp_path / "t").outcome.kind == "ok"
    over = {**top, "max_num_batched_tokens": 8193}
    assert InProcessRunner("rtx4090")(ctx, over, tmp_path / "u").outcome.kind == "startup"


def test_within_context_is_refused_off_an_int_knob(tmp_path):
    y = tmp_path / "s.yaml"
    raw = (ROOT / "search_spaces" / "infinilm.yaml").read_text()
    y.write_text(raw.replace("role: long_use_total_len,", "role: long_use_total_len, within_context: true,"))
    with pytest.raises(UsageError, match="within_context"):
        load_space(y)
