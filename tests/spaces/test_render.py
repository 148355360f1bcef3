"""Each shipped space renders a sampled config into the exact argv and environment the server gets.

One hand-checked config per space (the values a trial could sample), compared with the literal
command line; then many configs drawn from the space's own distributions, checked for shape:
every flag knob once with a value in range, bool flags as presence, env knobs as strings.
"""

from __future__ import annotations

import sys
from pathlib import Path

import optuna
import pytest

from tests.targets_data import SPACES_DIR
from tuner.search.bounds import resolve_space
from tuner.search.model import load_model_info
from tuner.search.space_file import load_space

KW = {"model": "/models/llama", "host": "127.0.0.1", "port": 8123, "max_output_len": 256}
PY = sys.executable
MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / "llama-3.1-8b"


def _space(name: str):
    return load_space(SPACES_DIR / f"{name}.yaml")


def test_vllm_renders_exact_argv():
    params = {"num_gpu_blocks": 900, "max_num_seqs": 96, "max_num_batched_tokens": 4096,
              "block_size": 32, "disable_chunked_prefill": False, "long_prefill_token_threshold": 1024,
              "enforce_eager": True, "max_cudagraph_capture_size": 256}
    argv, env = _space("vllm").render(params, **KW)
    assert argv == ["vllm", "serve", "/models/llama", "--host", "127.0.0.1", "--port", "8123",
                    "--tensor-parallel-size", "1", "--seed", "0", "--disable-uvicorn-access-log",
                    "--gpu-memory-utilization", "0.95", "--num-gpu-blocks-override", "900",
                    "--max-num-seqs", "96", "--max-num-batched-tokens", "4096", "--block-size", "32",
                    "--long-prefill-token-threshold", "1024", "--enforce-eager",
                    "--max-cudagraph-capture-size", "256"]
    assert env == {}
    argv, _ = _space("vllm").render({**params, "disable_chunked_prefill": True,
                                     "enforce_eager": False}, **KW)
    assert "--disable-chunked-prefill" in argv and "--enforce-eager" not in argv


def test_sglang_renders_exact_argv():
    params = {"max_total_tokens": 60000, "max_running_requests": 128, "chunked_prefill_size": 2048,
              "schedule_policy": "lpm", "schedule_conservativeness": 0.7, "cuda_graph_max_bs_decode": 64}
    argv, env = _space("sglang").render(params, **KW)
    assert argv == [PY, "-m", "sglang.launch_server", "--model-path", "/models/llama",
                    "--host", "127.0.0.1", "--port", "8123", "--tp-size", "1", "--random-seed", "0",
                    "--mem-fraction-static", "0.95", "--max-total-tokens", "60000",
                    "--max-running-requests", "128", "--chunked-prefill-size", "2048",
                    "--schedule-policy", "lpm",
                    "--schedule-conservativeness", "0.7", "--cuda-graph-max-bs-decode", "64"]
    assert env == {}


def test_transformers_renders_exact_argv_and_launcher_env():
    params = {"cb_num_blocks": 2200, "cb_block_size": 256, "cb_max_batch_tokens": 4096,
              "cb_max_memory_percent": 0.9, "cb_use_cuda_graph": True,
              "scheduler_type": "prefill_first", "max_requests_per_batch": 64}
    argv, env = _space("transformers").render(params, **KW)
    assert argv == [PY, "-m", "tuner.server.launchers.transformers_serve", "serve", "/models/llama",
                    "--continuous-batching", "--host", "127.0.0.1", "--port", "8123",
                    "--device", "cuda:0", "--dtype", "bfloat16",
                    "--cb-num-blocks", "2200", "--cb-block-size", "256", "--cb-max-batch-tokens", "4096",
                    "--cb-max-memory-percent", "0.9", "--cb-use-cuda-graph"]
    assert env == {"HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_UPDATE_CHECK": "1",
                   "TUNER_CB_SCHEDULER_TYPE": "prefill_first", "TUNER_CB_MAX_REQUESTS_PER_BATCH": "64"}


def test_transformers_server_contract():
    server = _space("transformers").server
    assert server.warmup_before_health is True
    assert server.request_extra == {}            # transformers serve answers 422 to ignore_eos
    assert server.health_path == "/health"


def test_infinilm_renders_exact_argv_and_seed_env():
    params = {"kv_cache_tokens": 64 * 256, "block_size": 256, "max_batch_size": 24, "enable_graph": True,
              "max_num_batched_tokens": 8192, "prefill_batch_cap": 8, "decode_batch_cap": 24,
              "long_context_threshold": 4096, "long_context_max_batch": 1,
              "long_context_use_total_len": False, "decode_first_when_running": True}
    argv, env = _space("infinilm").render(params, **KW)
    assert argv == [PY, "-m", "infinilm.server.inference_server", "--model", "/models/llama",
                    "--host", "127.0.0.1", "--port", "8123", "--device", "nvidia", "--tp", "1",
                    "--max-new-tokens", "256", "--enable-paged-attn",
                    "--ignore-eos", "--dtype", "bfloat16", "--num-blocks", "64", "--block-size", "256",
                    "--max-batch-size", "24", "--enable-graph"]
    assert env == {"INFINILM_MAX_NUM_BATCHED_TOKENS": "8192", "INFINILM_PREFILL_BATCH_CAP": "8",
                   "INFINILM_DECODE_BATCH_CAP": "24", "INFINILM_LONG_CONTEXT_THRESHOLD": "4096",
                   "INFINILM_LONG_CONTEXT_MAX_BATCH": "1", "INFINILM_LONG_CONTEXT_USE_TOTAL_LEN": "0",
                   "INFINILM_DECODE_FIRST_WHEN_RUNNING": "1"}


@pytest.mark.parametrize("name", ["vllm", "sglang", "transformers", "infinilm"])
def test_sampled_configs_render_every_knob_once_in_range(name):
    space = _space(name)
    if any(p.high_auto for p in space.parameters):  # infinilm: KV capacity sized for a 24 GiB card
        model = load_model_info(MODEL_DIR)
        space = resolve_space(space, model, 24 * 2**30, [])
    dists = space.distributions()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    head_len = len(space.render({}, **KW)[0])
    for _ in range(25):
        params = study.ask(dists).params
        argv, env = space.render(params, **KW)
        tail = argv[head_len:]
        for p in space.parameters:
            value = params[p.name]
            assert dists[p.name]._contains(dists[p.name].to_internal_repr(value))
            if p.env:
                assert env[p.env] == p.render_value(value)
            elif p.type == "bool":
                assert tail.count(p.flag) == (1 if value else 0)
            else:
                assert tail.count(p.flag) == 1
                shown = value // params[p.divide_by] if p.divide_by else value
                assert tail[tail.index(p.flag) + 1] == p.render_value(shown)


# infinilm.yaml keeps the server's default num_blocks (512) outside its range on purpose: that
# default is the seed's known OOM on a 24 GB card.
@pytest.mark.parametrize("name", ["vllm", "sglang", "transformers"])
def test_default_config_is_inside_the_space(name):
    space = resolve_space(_space(name), load_model_info(MODEL_DIR), 24 * 2 ** 30, ())
    dists = space.distributions()
    for key, value in space.default_params().items():
        assert dists[key]._contains(dists[key].to_internal_repr(value)), (key, value)
    argv, _ = space.render(space.default_params(), **KW)
    assert argv[:len(space.server.command)] == [a.format(python=PY, **KW) for a in space.server.command]
