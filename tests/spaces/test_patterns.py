"""Each shipped space's failure patterns classify the servers' own messages the way a trial should.

The lines are the messages in the named releases' sources (vllm 0.33.0, sglang 0.5.23,
transformers 5.17.0), with the logger prefixes those servers print; the benign lines are ones they
print in normal operation and must not be taken for failures.
"""

from __future__ import annotations

import re

import pytest

from tests.targets_data import SPACES_DIR
from tuner.server.outcome import Evidence, classify
from tuner.search.space_file import load_space

CASES = [
    # space, log line, became_healthy, exit_code, expected outcome
    ("vllm", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
             "total capacity of 23.53 GiB of which 1.02 GiB is free.", True, None, "oom"),
    ("vllm", "ValueError: No available memory for the cache blocks. Try increasing "
             "`gpu_memory_utilization` when initializing the engine", False, 1, "oom"),
    ("vllm", "ValueError: To serve at least one request with the model's max seq len (131072), "
             "(16.00 GiB KV cache is needed, which is larger than the available KV cache memory "
             "(9.50 GiB).", False, 1, "oom"),
    ("vllm", "ERROR 11-30 02:00:00 [core.py:1584] EngineCore failed to start.", False, 1, "startup"),
    ("vllm", "ERROR 11-30 02:00:00 [core.py:1586] EngineCore encountered a fatal error.",
     True, None, "unhealthy"),
    ("vllm", "INFO 11-30 02:00:00 [gpu_worker.py:300] Available KV cache memory: 9.50 GiB",
     True, None, "ok"),
    ("sglang", "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
     False, 1, "oom"),
    ("sglang", "RuntimeError: Prefill out of memory. Try to lower your batch size.", True, None, "oom"),
    ("sglang", "[2026-11-30 02:00:00] Scheduler hit an exception: Traceback (most recent call last):",
     True, None, "unhealthy"),
    ("sglang", "[2026-11-30 02:00:00] Received sigquit from a child process. It usually means the "
               "child failed.", True, -9, "crash"),
    ("sglang", "[2026-11-30 02:00:00] Initialization failed. warmup error: ...", False, 1, "startup"),
    ("sglang", "[2026-11-30 02:00:00] KV cache pool is full. Retract requests. #retracted_reqs: 2",
     True, None, "ok"),
    ("transformers", "ERROR:transformers.generation.continuous_batching.continuous_api:Error in "
                     "generation loop: CUDA out of memory. Tried to allocate 32.00 MiB.", True, None, "oom"),
    ("transformers", "torch.OutOfMemoryError: CUDA out of memory.", False, None, "oom"),
    ("transformers", "MemoryError: Memory footprint 80.5 GiB is more than available memory 70.1 GiB",
     True, None, "oom"),
    ("transformers", "Error in generation loop: index out of range", True, None, "unhealthy"),
    ("transformers", "INFO:     127.0.0.1:50000 - \"GET /health HTTP/1.1\" 200 OK", True, None, "ok"),
]


@pytest.mark.parametrize("space, line, healthy, exit_code, expected", CASES)
def test_server_messages_classify(space, line, healthy, exit_code, expected):
    patterns = load_space(SPACES_DIR / f"{space}.yaml").failure_patterns
    ev = Evidence(log_text=f"starting\n{line}\n", became_healthy=healthy, exit_code=exit_code,
                  health_failed=False, cell_errors=())
    assert classify(ev, patterns).kind == expected


@pytest.mark.parametrize("space", ["vllm", "sglang", "transformers"])
def test_patterns_are_valid_regexes(space):
    for pats in load_space(SPACES_DIR / f"{space}.yaml").failure_patterns.values():
        for p in pats:
            re.compile(p)
