"""Metric math against figures computed by hand (vllm bench serve's definitions)."""

import pytest

from tuner.bench.metrics import cell_metrics
from tuner.bench.records import RequestRecord


def records() -> list[RequestRecord]:
    # A: sent at 0, tokens at 0.1, 0.2, 0.4 -> TTFT 100, E2E 400, TPOT (400-100)/2 = 150, ITL 100, 200
    # B: sent at 1, tokens at 1.3, 1.4 (usage says 3 tokens) -> TTFT 300, E2E 400, TPOT 100/2 = 50, ITL 100
    # C: failed
    return [
        RequestRecord(0.0, [0.1, 0.2, 0.4], prompt_tokens=10, completion_tokens=3),
        RequestRecord(1.0, [1.3, 1.4], prompt_tokens=20, completion_tokens=3),
        RequestRecord(2.0, [], error="HTTP 500", error_class="http_error"),
    ]


def test_counts_and_throughput():
    m = cell_metrics(records(), duration_s=2.0)
    assert m["completed"] == 2 and m["failed"] == 1
    assert m["total_input_tokens"] == 30 and m["total_output_tokens"] == 6
    assert m["request_throughput"] == pytest.approx(1.0)
    assert m["output_throughput"] == pytest.approx(3.0)
    assert m["total_token_throughput"] == pytest.approx(18.0)


def test_latency_statistics():
    m = cell_metrics(records(), duration_s=2.0)
    assert m["mean_ttft_ms"] == pytest.approx(200.0)
    assert m["median_ttft_ms"] == pytest.approx(200.0)
    assert m["p90_ttft_ms"] == pytest.approx(100 + 0.9 * 200)   # linear interpolation
    assert m["mean_tpot_ms"] == pytest.approx(100.0)
    assert m["p99_tpot_ms"] == pytest.approx(50 + 0.99 * 100)
    assert m["mean_itl_ms"] == pytest.approx(400 / 3)
    assert m["median_itl_ms"] == pytest.approx(100.0)
    assert m["mean_e2el_ms"] == pytest.approx(400.0)
    assert "request_goodput" not in m


def test_goodput_counts_requests_meeting_every_slo():
    m = cell_metrics(records(), duration_s=2.0, slo_ms={"ttft": 200, "tpot": 200})
    assert m["request_goodput"] == pytest.approx(0.5)  # only A has TTFT <= 200


def test_empty_cell_gives_zeros_not_nans():
    m = cell_metrics([], duration_s=0.0)
    assert m["completed"] == 0 and m["mean_ttft_ms"] == 0.0 and m["output_throughput"] == 0.0
