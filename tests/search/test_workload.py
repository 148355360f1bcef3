"""Workload YAML loading: defaults, and errors that name the file and the key."""

import pytest

from tuner.bench.records import Cell, Warmup
from tuner.errors import UsageError
from tuner.search.workload import load_workload

GOOD = """
name: quick
seed: 3
warmup: {requests: 2, input_len: 16, output_len: 4}
defaults: {num_prompts_per_concurrency: 2}
cells:
  - {concurrency: 4, input_len: 4096, output_len: 64, num_prompts: 8}
  - {concurrency: 16, input_len: 256, output_len: 128}
  - {concurrency: 8, input_len: 0, output_len: 1, duration_s: 30, request_rate: 2.5}
objectives: ["max output_throughput", "min p99_ttft_ms"]
slo: {p99_ttft_ms: 2000, p99_tpot_ms: 50, output_throughput: 100}
"""


def write(tmp_path, text):
    p = tmp_path / "w.yaml"
    p.write_text(text)
    return p


def test_good_file(tmp_path):
    w = load_workload(write(tmp_path, GOOD))
    assert w.name == "quick" and w.seed == 3 and w.warmup == Warmup(2, 16, 4)
    assert w.cells == (Cell(4, 4096, 64, 8), Cell(16, 256, 128, 32),
                       Cell(8, 0, 1, None, 30.0, 2.5))
    assert w.objectives == ("max output_throughput", "min p99_ttft_ms")
    assert w.goodput_slo_ms() == {"ttft": 2000.0, "tpot": 50.0}


def test_minimal_file_gets_defaults(tmp_path):
    w = load_workload(write(tmp_path, "cells: [{concurrency: 2, input_len: 8, output_len: 8}]"))
    assert w.name == "w" and w.seed == 0 and w.warmup == Warmup(1, 16, 4)
    assert w.cells[0].num_prompts == 8 and w.objectives == () and w.slo == {}


@pytest.mark.parametrize("text, where", [
    ("cells: [{concurrency: 0, input_len: 8, output_len: 8}]", "cells[0].concurrency"),
    ("cells: [{concurrency: -3, input_len: 8, output_len: 8}]", "cells[0].concurrency"),
    ("cells: [{concurrency: 1, input_len: -1, output_len: 8}]", "cells[0].input_len"),
    ("cells: [{concurrency: 1, input_len: 1, output_len: -8}]", "cells[0].output_len"),
    ("cells: [{concurrency: 1, input_len: 1, output_len: 8, colour: red}]", "cells[0].colour"),
    ("cells: [{concurrency: true, input_len: 1, output_len: 8}]", "cells[0].concurrency"),
    ("cells: [{concurrency: 1, input_len: 1, output_len: 8, request_rate: 0}]", "cells[0].request_rate"),
    ("cells: [{input_len: 1, output_len: 8}]", "cells[0].concurrency"),
    ("cells: []", "cells"),
    ("celss: []", "celss"),
    ("warmup: {requests: 1, input_len: 1, output_len: 1, x: 1}\ncells: [{concurrency: 1, input_len: 1, output_len: 1}]",
     "warmup.x"),
    ("objectives: [maximise throughput]\ncells: [{concurrency: 1, input_len: 1, output_len: 1}]", "objectives[0]"),
    ("slo: {p99_ttft_ms: -1}\ncells: [{concurrency: 1, input_len: 1, output_len: 1}]", "slo.p99_ttft_ms"),
    ("cells: [{concurrency: 1, input_len: 1\n", "malformed YAML"),
    ("- just a list", "(top level)"),
])
def test_errors_name_file_and_key(tmp_path, text, where):
    path = write(tmp_path, text)
    with pytest.raises(UsageError) as exc:
        load_workload(path)
    assert str(exc.value).startswith(f"{path}: {where}")


def test_study_loader_may_own_extra_keys(tmp_path):
    path = write(tmp_path, "space: x.yaml\ncells: [{concurrency: 1, input_len: 1, output_len: 1}]")
    assert load_workload(path, extra_keys=["space"]).cells[0].concurrency == 1


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="cannot read"):
        load_workload(tmp_path / "nope.yaml")
