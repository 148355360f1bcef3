"""`python -m tuner.sim` as a real process on loopback: protocol, OOM over HTTP, start-up failure.

Every process is started in its own process group and killed (group SIGKILL) in a finally.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
MODEL = str(ROOT / "models" / "llama-3.1-8b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, log_path, env=None):
    full_env = dict(os.environ, PYTHONPATH=str(ROOT), **(env or {}))
    log = open(log_path, "w")
    proc = subprocess.Popen([sys.executable, "-m", "tuner.sim", "--model", MODEL, *argv],
                            env=full_env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    return proc


def stop(proc):
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(5)


def wait_health(url, proc, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "server exited"
        try:
            return requests.get(url + "/health", timeout=1)
        except requests.ConnectionError:
            time.sleep(0.05)
    pytest.fail("no /health")


def sse_events(resp):
    for line in resp.iter_lines():
        if line.startswith(b"data: "):
            yield line[6:]


def read_until_hang(resp):
    """Events of a stream that stops sending without ending (the read times out)."""
    events = []
    try:
        for event in sse_events(resp):
            events.append(event)
    except requests.exceptions.ConnectionError:
        return events
    pytest.fail(f"stream ended: {events[-1:]}")


def chat(url, words, max_tokens, stream=True, timeout=5, word="w"):
    body = {"model": "anything", "messages": [{"role": "user", "content": f"{word} " * words}],
            "max_tokens": max_tokens, "stream": stream}
    return requests.post(url + "/v1/chat/completions", json=body, stream=stream, timeout=timeout)


def test_serves_streams_then_dies_like_infinilm_on_oom(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = start(["--port", str(port), "--num-blocks", "64", "--max-batch-size", "64",
                  "--enable-graph", "--time-scale", "100"], tmp_path / "server.log")
    try:
        health = wait_health(url, proc)
        assert health.status_code == 200
        assert health.json() == {"status": "healthy",
                                 "sim": {"time_scale": 100.0, "late_arrivals": 0}}
        assert requests.get(url + "/v1/models").json()["data"][0]["id"] == "llama-3.1-8b"

        resp = chat(url, 32, 40)
        arrival = float(resp.headers["X-Tuner-Sim-Arrival"])
        events = list(sse_events(resp))
        assert events[-1] == b"[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        times = [t for c in chunks for t in c.get("sim_t", [])]
        assert len(times) == 40 and times == sorted(times) and times[0] > arrival
        assert chunks[-1]["usage"] == {"prompt_tokens": 68, "completion_tokens": 40,
                                       "total_tokens": 108}
        ttft_ms = (times[0] - arrival) * 1000
        assert 25 < ttft_ms < 60  # one 68-token prefill, in simulated time
        plain = chat(url, 8, 3, stream=False).json()
        assert plain["usage"]["completion_tokens"] == 3 and len(plain["sim_t"]) == 3

        # Two 4096-word prompts at once: a prefill the 4090 cannot hold beside 64 blocks (distinct
        # words: identical prompts would share their blocks through the prefix cache).
        streams = [chat(url, 4096, 64, timeout=(2, 0.5), word=f"w{i}") for i in range(2)]
        deadline = time.monotonic() + 5
        while requests.get(url + "/health").status_code != 503:
            assert time.monotonic() < deadline, "server never turned unhealthy"
            time.sleep(0.02)
        assert requests.get(url + "/health").json()["status"] == "unhealthy"
        log = (tmp_path / "server.log").read_text()
        assert "[rank 0] exception during forward: cudaMalloc failed: out of memory" in log
        assert "RankWorker stopped during run" in log
        assert "infinilm.llm.llm - ERROR - Error in step loop:" in log
        for s in streams:  # in-flight streams hang: no error chunk, no [DONE], no end
            events = read_until_hang(s)
            assert all(b"error" not in e for e in events)
        assert proc.poll() is None  # the process stays up
        late = chat(url, 8, 4, timeout=(2, 0.3))  # accepted, then hangs too
        assert late.status_code == 200
        assert read_until_hang(late) == []
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(5) == 0  # unlike InfiniLM, SIGTERM exits promptly despite hung streams
    finally:
        stop(proc)


def test_kv_pool_overflow_exits_3_with_infinilm_lines(tmp_path):
    proc = start(["--port", str(free_port()), "--num-blocks", "512", "--time-scale", "1000"],
                 tmp_path / "server.log")
    try:
        assert proc.wait(10) == 3
        lines = (tmp_path / "server.log").read_text().splitlines()
        assert lines[-3].startswith("Error Code 2 in cudaMalloc")
        assert lines[-2:] == ["RankWorker failed to initialize", "Application startup failed. Exiting."]
    finally:
        stop(proc)
