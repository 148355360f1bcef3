"""`tuner bench`: measure an already running OpenAI-compatible server, standalone.

Uses the same runner as the tuner's trials, so a number seen here is the number a trial would
record for the same cell.  Exit status: 0 when every request of every cell completed, 1 when a
cell failed (the table and files still hold what was measured), 2 for usage errors.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path
from typing import Any

import requests

from tuner.bench import vllm_result
from tuner.bench.capacity import CapacityResult
from tuner.bench.capacity_http import http_capacity
from tuner.bench.client import APIS, base_url
from tuner.bench.health import time_scale
from tuner.bench.lengths import has_tokenizer, length_warning, tokenizer_dir
from tuner.bench.records import Cell
from tuner.bench.report import format_table, write_results
from tuner.bench.runner import CellResult, run_cells
from tuner.bench.texts import TextCollector
from tuner.bench.vllm_result import RunInfo, default_path, result_doc
from tuner.errors import UsageError
from tuner.search.workload import DEFAULT_WARMUP, Workload, load_workload, parse_workload


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="benchmark a running OpenAI-compatible server",
        description="Stream requests to a running server and report metrics named as vllm bench "
                    "serve names them.",
    )
    p.add_argument("--url", required=True, help="server root, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", required=True, help="model name sent in each request")
    p.add_argument("--workload", help="workload YAML (cells, warm-up, seed)")
    p.add_argument("--concurrency", type=int, help="closed-loop concurrency of a single cell")
    p.add_argument("--input-len", type=int, help="prompt tokens of a single cell")
    p.add_argument("--output-len", type=int, help="output tokens (max_tokens) of a single cell")
    p.add_argument(
        "--num-prompts", type=int, help="requests of a single cell (default 4 x concurrency)"
    )
    p.add_argument("--request-rate", type=float, help="open loop: Poisson arrivals per second")
    p.add_argument("--dataset", help="ShareGPT JSON or JSONL of {prompt | input_len, output_len} "
                   "to sample prompts from (with --concurrency or --request-rate)")
    p.add_argument("--trace", help="JSONL of {timestamp (ms), input_length, output_length}: "
                   "replayed open loop at its own arrival times")
    p.add_argument("--trace-time-scale", type=float, default=1.0,
                   help="replay the trace this many times faster (default 1)")
    p.add_argument("--capacity", action="store_true",
                   help="after the cells, search the highest request rate that meets the "
                        "workload's SLOs (needs a workload with a capacity: section)")
    p.add_argument(
        "-o", "--output", help="results JSON; a CSV with the same stem is written beside it"
    )
    p.add_argument("--save-result", nargs="?", const="", metavar="FILE",
                   help="also write the result as vllm bench serve --save-result does (its "
                        "field names and per-request arrays; one JSON object per cell and line); "
                        "without FILE, vllm's file name in the current folder")
    p.add_argument("--api", choices=APIS, default="chat")
    p.add_argument(
        "--extra-body",
        default="{}",
        help="JSON merged into every request, e.g. '{\"ignore_eos\": true}'; null removes a field",
    )
    p.add_argument("--tokenizer", help="dir with tokenizer.json for exact prompt lengths "
                   "(default: the --model folder when it holds one; without, lengths are "
                   "approximate and a warning says by how much)")
    p.add_argument("--health-path", default="/health", help="polled during cells; '' disables")
    p.add_argument(
        "--stall-timeout", type=float, default=30.0, help="seconds without a token -> hang"
    )
    p.add_argument("--seed", type=int, help="prompt/arrival seed (default: the workload's, else 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _source_workload(args: argparse.Namespace) -> Workload:
    """One cell from --dataset or --trace, read (and checked line by line) before any request."""
    if args.input_len is not None or args.output_len is not None:
        raise UsageError("--input-len/--output-len come from the --dataset or --trace file")
    if args.trace_time_scale <= 0:
        raise UsageError("--trace-time-scale must be > 0")
    if args.dataset:
        if args.concurrency is None and args.request_rate is None:
            raise UsageError("--dataset needs --concurrency or --request-rate")
        spec: dict[str, Any] = {"path": args.dataset}
        key = "dataset"
    else:
        if args.request_rate is not None:
            raise UsageError("--request-rate does not apply to --trace (its timestamps set the "
                             "arrivals; --trace-time-scale speeds them up)")
        spec = {"path": args.trace, "time_scale": args.trace_time_scale}
        key = "trace"
    if args.num_prompts is not None:
        spec["num_prompts"] = args.num_prompts
    cell: dict[str, Any] = {"source": {key: spec}, "concurrency": args.concurrency or 100_000}
    if args.request_rate is not None:
        cell["request_rate"] = args.request_rate
    return parse_workload({"name": "cli", "cells": [cell]}, "(command line)")


def _workload(args: argparse.Namespace) -> Workload:
    single = [args.concurrency, args.input_len, args.output_len]
    if args.dataset and args.trace:
        raise UsageError("give --dataset or --trace, not both")
    if args.workload:
        if any(v is not None for v in single + [args.num_prompts, args.request_rate,
                                                args.dataset, args.trace]):
            raise UsageError(
                "give either --workload or --concurrency/--input-len/--output-len, not both"
            )
        return load_workload(args.workload)
    if args.dataset or args.trace:
        return _source_workload(args)
    if any(v is None for v in single):
        raise UsageError("give --workload FILE, or --concurrency, --input-len and --output-len")
    if args.concurrency < 1 or args.input_len < 0 or args.output_len < 1:
        raise UsageError("--concurrency and --output-len must be >= 1, --input-len >= 0")
    if args.num_prompts is not None and args.num_prompts < 1:
        raise UsageError("--num-prompts must be >= 1")
    if args.request_rate is not None and not args.request_rate > 0:
        raise UsageError("--request-rate must be > 0")
    num = args.num_prompts if args.num_prompts is not None else 4 * args.concurrency
    cell = Cell(
        args.concurrency, args.input_len, args.output_len, num, request_rate=args.request_rate
    )
    return Workload("cli", 0, DEFAULT_WARMUP, (cell,))


def _health_url(url: str, path: str) -> tuple[str | None, float]:
    """The health URL to watch and the simulator's time scale (1 for a real server).  A server
    without /health (404) is benched without the watch rather than refused."""
    if not path:
        return None, 1.0
    health = base_url(url) + path
    try:
        resp = requests.get(health, timeout=5)
    except requests.RequestException as exc:
        raise UsageError(f"cannot reach {health}: {type(exc).__name__}") from None
    if resp.status_code == 404:
        print(f"note: {health} is 404; running without the health watch", file=sys.stderr)
        return None, 1.0
    if resp.status_code != 200:
        raise UsageError(f"{health} answered {resp.status_code}: the server is not healthy")
    try:
        body = resp.json()
    except ValueError:
        body = None
    return health, time_scale(body.get("sim") if isinstance(body, dict) else None)


def _capacity(args: argparse.Namespace, workload: Workload, extra: dict[str, Any],
              health: str | None, seed: int) -> CapacityResult:
    spec = workload.capacity
    assert spec is not None
    result = http_capacity(args.url, workload.cells[spec.cell], spec, workload.slo, seed=seed,
                           model_name=args.model, api=args.api, request_extra=extra,
                           tokenizer_dir=args.tokenizer, health_url=health,
                           stall_timeout_s=args.stall_timeout)
    for step in result.steps:
        print("capacity step: " + " ".join(f"{k}={v}" for k, v in step.row().items()))
    bound = " (max_rate: at least)" if result.at_bound else ""
    print(f"capacity: {result.capacity_rps:.3g} req/s{bound} in {len(result.steps)} load steps")
    return result


def _extra_body(args: argparse.Namespace) -> dict[str, Any]:
    """--extra-body as a dict; the option checks that need no server."""
    try:
        extra = json.loads(args.extra_body)
    except ValueError as exc:
        raise UsageError(f"--extra-body: not JSON: {exc}") from None
    if not isinstance(extra, dict):
        raise UsageError("--extra-body: must be a JSON object")
    if args.stall_timeout <= 0:
        raise UsageError("--stall-timeout must be > 0")
    return extra


def _save_result(args: argparse.Namespace, results: list[CellResult], scale: float,
                 texts: TextCollector | None) -> None:
    """The --save-result file (vllm's format)."""
    tokenizer = args.tokenizer if has_tokenizer(args.tokenizer) else None
    info = RunInfo(args.api, args.model, tokenizer, scale,
                   _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    path = Path(args.save_result) if args.save_result else default_path(info, results)
    docs = [result_doc(r, info, texts.texts() if texts else None) for r in results]
    print(f"wrote {vllm_result.write(path, docs)} (vllm bench serve --save-result format)")


def run(args: argparse.Namespace) -> int:
    extra = _extra_body(args)
    workload = _workload(args)
    if args.capacity and (workload.capacity is None or not workload.slo):
        raise UsageError("--capacity needs a --workload with capacity: and slo: sections")
    args.tokenizer = tokenizer = tokenizer_dir(args.tokenizer, args.model)
    if any(c.source is not None for c in workload.cells) and not has_tokenizer(tokenizer):
        print("note: no tokenizer.json (--tokenizer): prompt lengths are approximate "
              "(one word per token); the server's usage counts are reported", file=sys.stderr)
    health, scale = _health_url(args.url, args.health_path)
    texts = TextCollector() if args.save_result is not None else None
    seed = args.seed if args.seed is not None else workload.seed

    def show(result: CellResult) -> None:
        if result.error_class:
            print(f"cell {result.cell.key}: {result.error_class}: {result.error}", file=sys.stderr)

    results = run_cells(
        args.url, list(workload.cells), model_name=args.model, api=args.api, request_extra=extra,
        tokenizer_dir=tokenizer, health_url=health, seed=seed, warmup=workload.warmup,
        stall_timeout_s=args.stall_timeout, slo_ms=workload.goodput_slo_ms() or None,
        on_cell=show, progress=not args.no_progress, on_event=texts)
    print(format_table(results))
    if not has_tokenizer(tokenizer) and any(c.source is None for c in workload.cells):
        print(length_warning(results, args.api), file=sys.stderr)
    capacity = None
    if args.capacity and len(results) == len(workload.cells) and \
            not any(r.error_class for r in results):
        capacity = _capacity(args, workload, extra, health, seed)
    if args.save_result is not None:
        _save_result(args, results, scale, texts)
    if args.output:
        json_path, csv_path = write_results(results, args.output, scale)
        if capacity is not None:
            cap_path = json_path.with_suffix(".capacity.json")
            cap_path.write_text(json.dumps(capacity.record(), indent=1))
        print(f"wrote {json_path} and {csv_path}")
    complete = len(results) == len(workload.cells) and all(r.error_class is None for r in results)
    return 0 if complete else 1

