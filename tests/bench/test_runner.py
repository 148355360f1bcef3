"""The runner against a tiny real HTTP server on 127.0.0.1: streaming, sim time, failures."""

import time

import pytest
from tests.bench_fakeserver import Behaviour, FakeServer

from tuner.bench.records import Cell, Warmup
from tuner.bench.runner import run_cells


def run(srv: FakeServer, cells, **kw):
    kw.setdefault("health_url", srv.url + "/health")
    return run_cells(srv.url, cells, model_name="m", **kw)


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_closed_loop_records_every_token_and_usage(api):
    b = Behaviour(tokens=5)
    with FakeServer(b) as srv:
        [res] = run(srv, [Cell(concurrency=3, input_len=8, output_len=5, num_prompts=7)], api=api,
                    request_extra={"ignore_eos": True}, warmup=Warmup(2, 4, 2))
    assert res.error_class is None
    assert res.metrics["completed"] == 7 and res.metrics["failed"] == 0
    assert res.metrics["total_output_tokens"] == 35 and res.metrics["total_input_tokens"] == 49
    assert all(len(r.token_times) == 5 and r.send_time < r.token_times[0] for r in res.records)
    assert len(b.bodies) == 9  # 2 warm-up + 7
    body = b.bodies[-1]
    assert body["ignore_eos"] is True and body["max_tokens"] == 5 and body["stream"] is True
    prompt = body["messages"][0]["content"] if api == "chat" else body["prompt"]
    assert len(prompt.split()) == 8  # no tokenizer: one word per token


def test_sim_time_protocol_replaces_wall_clock():
    with FakeServer(Behaviour(tokens=3, sim_time=True)) as srv:
        [res] = run(srv, [Cell(concurrency=2, input_len=4, output_len=3, num_prompts=2)])
    for r in res.records:
        assert r.sim and r.send_time == 100.0
        assert r.token_times == pytest.approx([100.5, 100.6, 100.7])
    assert res.metrics["mean_ttft_ms"] == pytest.approx(500.0)
    assert res.metrics["mean_itl_ms"] == pytest.approx(100.0)
    assert res.duration_s == pytest.approx(0.7)  # simulated seconds, not wall


def test_open_loop_poisson_sends_num_prompts():
    with FakeServer(Behaviour(tokens=2)) as srv:
        [res] = run(srv, [Cell(concurrency=4, input_len=4, output_len=2, num_prompts=6, request_rate=200.0)])
    assert res.error_class is None and res.metrics["completed"] == 6


def test_hung_streams_end_within_seconds_when_health_turns_503():
    with FakeServer(Behaviour(tokens=10, hang_after=2)) as srv:
        t0 = time.perf_counter()
        results = run(srv, [Cell(concurrency=64, input_len=4, output_len=10, num_prompts=128),
                            Cell(concurrency=1, input_len=4, output_len=10, num_prompts=1)],
                      stall_timeout_s=60)
        elapsed = time.perf_counter() - t0
    assert elapsed < 3.0
    assert len(results) == 1  # the server is gone: the second cell is not run
    res = results[0]
    assert res.error_class == "unhealthy" and "503" in res.error
    assert res.metrics["completed"] == 0 and res.metrics["failed"] == 64
    assert all(r.error_class == "unhealthy" and len(r.token_times) == 2 for r in res.records)


def test_stall_without_health_endpoint_is_a_hang():
    with FakeServer(Behaviour(tokens=10, hang_after=1, unhealthy_after_s=3600)) as srv:
        t0 = time.perf_counter()
        [res] = run(srv, [Cell(concurrency=4, input_len=4, output_len=10, num_prompts=4)],
                    health_url=None, stall_timeout_s=0.5)
        assert time.perf_counter() - t0 < 3.0
    assert res.error_class == "hang"


def test_refused_requests_end_the_cell_as_http_error():
    with FakeServer(Behaviour(status=422)) as srv:
        [res] = run(srv, [Cell(concurrency=4, input_len=4, output_len=4, num_prompts=100)])
    assert res.error_class == "http_error" and "422" in res.error
    assert res.metrics["failed"] <= 4


def test_error_chunk_mid_stream_is_recorded():
    with FakeServer(Behaviour(tokens=5, error_after=2)) as srv:
        [res] = run(srv, [Cell(concurrency=2, input_len=4, output_len=5, num_prompts=2)])
    assert res.error_class == "protocol" and "engine died" in res.error
    assert all(r.error_class == "stream_error" and "engine died" in r.error for r in res.records)


def test_dead_server_is_server_died():
    with FakeServer(Behaviour()) as srv:
        url = srv.url
    [res] = run_cells(url, [Cell(concurrency=2, input_len=4, output_len=4, num_prompts=2)],
                      model_name="m", health_url=url + "/health")
    assert res.error_class == "server_died"


def test_a_request_loop_that_crashes_raises_instead_of_a_clean_partial_cell(monkeypatch):
    import tuner.bench.runner as runner

    async def crashing_loop(run, deadline):
        await run.one(0)
        raise KeyError("a bug in the request loop")

    monkeypatch.setattr(runner, "_closed_loop", crashing_loop)
    with FakeServer(Behaviour(tokens=2)) as srv, pytest.raises(KeyError, match="a bug"):
        run(srv, [Cell(concurrency=2, input_len=4, output_len=2, num_prompts=4)])
