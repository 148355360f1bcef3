"""The Pareto alternatives `tune` and `inspect` list under the pick."""

from tuner.output.result import _alternatives


def test_alternatives_printed_alike_are_one_line_and_copies_of_the_pick_are_named():
    pick = {"output_throughput": 260.3, "p99_ttft_ms": 3454.9}
    other = {"output_throughput": 260.0, "p99_ttft_ms": 5491.9}
    near = {"output_throughput": 260.0001, "p99_ttft_ms": 5491.9002}   # the same as printed
    lines = _alternatives(pick, [(3, other), (14, dict(pick)), (16, near),
                                 (18, dict(pick)), (19, {"output_throughput": 212.5,
                                                         "p99_ttft_ms": 3454.9})])
    assert lines == [
        "    trials 3, 16: output_throughput 260.0 tok/s, p99_ttft_ms 5,491.9 ms",
        "    trials 14, 18: the pick's values (they differ from it in knobs that made no "
        "difference)",
        "    trial 19: output_throughput 212.5 tok/s, p99_ttft_ms 3,454.9 ms",
    ]
