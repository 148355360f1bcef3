"""`tuner bench` end to end against the fake server: table, JSON, CSV, exit status."""

import argparse
import csv
import json

import pytest
from tests.bench_fakeserver import Behaviour, FakeServer

from tuner.commands import bench
from tuner.errors import UsageError


def parse(argv):
    parser = argparse.ArgumentParser(prog="tuner")
    bench.add_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def test_single_cell_writes_table_json_and_csv(tmp_path, capsys):
    out = tmp_path / "res.json"
    with FakeServer(Behaviour(tokens=3)) as srv:
        rc = bench.run(parse(["--url", srv.url, "--model", "m", "--concurrency", "2", "--input-len", "5",
                              "--output-len", "3", "--num-prompts", "4", "-o", str(out), "--no-progress",
                              "--extra-body", '{"ignore_eos": true}']))
    assert rc == 0
    printed = capsys.readouterr().out
    assert "TTFT mean" in printed and "out tok/s" in printed
    [row] = json.loads(out.read_text())
    assert (row["concurrency"], row["input_len"], row["output_len"]) == (2, 5, 3)
    assert row["completed"] == 4 and row["total_output_tokens"] == 12 and "p99_tpot_ms" in row
    [csv_row] = list(csv.DictReader((tmp_path / "res.csv").open()))
    assert csv_row["completed"] == "4"


def test_workload_file_and_failed_cell_exit_1(tmp_path):
    wl = tmp_path / "w.yaml"
    wl.write_text("warmup: null\ncells: [{concurrency: 2, input_len: 4, output_len: 4, num_prompts: 2}]\n")
    with FakeServer(Behaviour(status=422)) as srv:
        assert bench.run(parse(["--url", srv.url, "--model", "m", "--workload", str(wl), "--no-progress"])) == 1


@pytest.mark.parametrize("argv, msg", [
    (["--concurrency", "1"], "--workload FILE"),
    (["--concurrency", "0", "--input-len", "1", "--output-len", "1"], "--concurrency"),
    (["--concurrency", "1", "--input-len", "1", "--output-len", "1", "--extra-body", "{"], "--extra-body"),
])
def test_usage_errors(argv, msg):
    with pytest.raises(UsageError, match=msg):
        bench.run(parse(["--url", "http://127.0.0.1:9", "--model", "m", *argv]))


def test_unreachable_server_is_a_usage_error():
    with FakeServer(Behaviour()) as srv:
        url = srv.url
    with pytest.raises(UsageError, match="cannot reach"):
        bench.run(parse(["--url", url, "--model", "m", "--concurrency", "1", "--input-len", "1",
                         "--output-len", "1"]))
