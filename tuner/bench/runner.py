"""Drive workload cells against a server and collect per-request records and metrics.

Closed loop keeps `concurrency` requests in flight; open loop sends a Poisson stream of
`request_rate` requests per (simulated) second, at most `concurrency` in flight.  While a cell
runs, /health is polled and a stall watch looks at the streams: when the server dies, every open
stream is cancelled at once and the cell ends with what it measured, so 64 hung streams cost
about a second, not 64 timeouts.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from tuner.aio import cancel_and_wait
from tuner.bench.cell_errors import HTTP_ERROR_CELL, cell_duration, judge_cell
from tuner.bench.client import (
    ABORTED,
    CONNECTION_ERROR,
    HTTP_ERROR,
    PROTOCOL_ERROR,
    STREAM_ERROR,
    Activity,
    EventHook,
    StreamClient,
)
from tuner.bench.conversations import conversation_loop
from tuner.bench.health import HANG, SERVER_DIED, UNHEALTHY, HealthWatch, stall_watch
from tuner.bench.health import time_scale as sim_time_scale
from tuner.bench.metrics import cell_metrics
from tuner.bench.pacing import open_loop
from tuner.bench.payloads import Payloads, payloads
from tuner.bench.prompts import PromptMaker
from tuner.bench.records import Cell, CellResult, RequestRecord, Warmup

CUT_SHORT = "cut_short"  # a capacity step ended early by its watch: the server is fine
FATAL = (UNHEALTHY, SERVER_DIED, HANG)  # the server is gone: later cells are not run
# (records so far, waiting times in ms of those without a first token) -> end the cell now
CellWatch = Callable[[list[RequestRecord], list[float]], bool]


class _CellRun:
    """State shared by one cell's request loops and its watchers."""

    def __init__(self, client: StreamClient, cell: Cell, payloads: list[bytes],
                 health: HealthWatch | None, pbar: tqdm, arrivals: list[float] | None = None,
                 watch: CellWatch | None = None) -> None:
        self.client = client
        self.cell = cell
        self.payloads = payloads
        self.arrivals = arrivals  # a trace's offsets, seconds (else Poisson at request_rate)
        self.watch = watch
        self.wall_sent: list[float] = []
        self.health = health
        self.pbar = pbar
        self.records: list[RequestRecord] = []
        self.successes = 0
        self.error_class: str | None = None
        self.error = ""
        self.stop = asyncio.Event()

    def end(self, error_class: str, reason: str) -> None:
        if self.error_class is None:
            self.error_class, self.error = error_class, reason
        self.stop.set()

    def waiting_ms(self) -> list[float]:
        """How long each request without a first token has waited so far.  On a simulated
        server in simulated time, against the latest token time seen (a lower bound of its
        clock): wall ages there would multiply the client's own jitter by the time scale."""
        pending = [(r, w) for r, w in zip(self.records, self.wall_sent, strict=True)
                   if not r.token_times and r.error is None]
        sim_now = max((r.token_times[-1] for r in self.records if r.sim and r.token_times),
                      default=None)
        if sim_now is not None:
            return [(sim_now - r.send_time) * 1e3 for r, _ in pending if r.sim]
        now = time.perf_counter()
        return [(now - w) * 1e3 for _, w in pending]

    async def one(self, i: int) -> None:
        rec = RequestRecord(send_time=0.0)
        self.records.append(rec)
        self.wall_sent.append(time.perf_counter())
        max_tokens = self.cell.output_len if self.cell.source is None else None
        await self.client.request(self.payloads[i % len(self.payloads)], rec, max_tokens)
        self.pbar.update(1)
        if self.watch is not None and self.watch(self.records, self.waiting_ms()):
            self.end(CUT_SHORT, "the SLOs can no longer be met (capacity step cut short)")
        if rec.ok:
            self.successes += 1
        elif rec.error_class == HTTP_ERROR and self.successes == 0 and _refusal(rec):
            # the server refuses our requests (422 on ignore_eos, 400 on the model name): every
            # later one would fail the same way; a 5xx is the server's fault, not the request's
            self.end(HTTP_ERROR_CELL, rec.error or "")
        elif rec.error_class in (CONNECTION_ERROR, STREAM_ERROR, PROTOCOL_ERROR):
            if self.health is not None:
                self.health.kick()
            elif rec.error_class == CONNECTION_ERROR:
                self.end(SERVER_DIED, rec.error or "")


def _refusal(rec: RequestRecord) -> bool:
    """A 4xx answer: the request itself was refused (the client's "HTTP <status>: ..." text)."""
    return (rec.error or "").startswith("HTTP 4")


async def _closed_loop(run: _CellRun, deadline: float | None) -> None:
    counter = itertools.count()
    limit = run.cell.num_prompts

    async def worker() -> None:
        while not run.stop.is_set():
            i = next(counter)
            if (limit is not None and i >= limit) or (
                deadline is not None and time.perf_counter() >= deadline
            ):
                return
            await run.one(i)

    await asyncio.gather(*(worker() for _ in range(run.cell.concurrency)))


def _raise_crash(tasks: list[asyncio.Task]) -> None:
    """A request loop or a watch that died of an exception is a bug of this client: raise it
    rather than report the records gathered so far as a clean (partial) cell."""
    for task in tasks:
        exc = task.exception() if task.done() and not task.cancelled() else None
        if exc is not None:
            raise exc


async def _run_cell(client: StreamClient, cell: Cell, payloads: Payloads, *,  # noqa: PLR0913
                    health: HealthWatch | None, rng: random.Random, time_scale: float,
                    stall_timeout_s: float, slo_ms: Mapping[str, float] | None, progress: bool,
                    label: str | None = None, watch: CellWatch | None = None) -> CellResult:
    with tqdm(total=cell.num_prompts, desc=label or cell.key, unit="req", file=sys.stderr,
              disable=not progress, leave=True) as pbar:
        run = _CellRun(client, cell, payloads[0], health, pbar, payloads[1], watch)
        flaps_before = health.flaps if health is not None else 0
        start = time.perf_counter()
        deadline = start + cell.duration_s / time_scale if cell.duration_s is not None else None
        if payloads[2] is not None:
            driver = asyncio.create_task(conversation_loop(run, payloads[2], deadline, rng,
                                                           time_scale))
        elif cell.request_rate is None and payloads[1] is None:
            driver = asyncio.create_task(_closed_loop(run, deadline))
        else:
            driver = asyncio.create_task(open_loop(run, deadline, rng, time_scale))
        client.activity.last = start
        helpers = [asyncio.create_task(run.stop.wait()),
                   asyncio.create_task(stall_watch(client.activity, stall_timeout_s, run.end))]
        if health is not None:
            helpers.append(asyncio.create_task(health.watch(run.end)))
        try:
            await asyncio.wait([driver, helpers[0]], return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait([driver, *helpers])
        _raise_crash([driver, *helpers])
        wall = time.perf_counter() - start
    records = run.records
    for rec in records:
        if rec.error_class == ABORTED and run.error_class is not None:
            rec.error_class = run.error_class
            rec.error = f"aborted: {run.error}"
    error_class, error = judge_cell(records, run.error_class, run.error)
    duration = cell_duration(records, wall * time_scale)
    flaps = health.flaps - flaps_before if health is not None else 0
    return CellResult(cell, records, duration, cell_metrics(records, duration, slo_ms), error_class,
                      error, health_flaps=flaps)


async def run_cells_async(  # noqa: PLR0913
    endpoint: str,
    cells: Sequence[Cell],
    *,
    model_name: str,
    api: str = "chat",
    request_extra: Mapping[str, Any] | None = None,
    tokenizer_dir: str | None = None,
    health_url: str | None = None,
    seed: int = 0,
    warmup: Warmup | None = None,
    stall_timeout_s: float = 30.0,
    slo_ms: Mapping[str, float] | None = None,
    on_cell: Callable[[CellResult], None] | None = None,
    progress: bool = False,
    on_event: EventHook | None = None,
    watch: Callable[[], CellWatch] | None = None,
) -> list[CellResult]:
    """`run_cells` inside a running event loop.  `on_event` sees every parsed SSE event;
    `watch()` makes each measured cell's CellWatch, which may end it early (capacity steps)."""
    maker = PromptMaker(tokenizer_dir)
    client = StreamClient(endpoint, model_name=model_name, api=api, request_extra=request_extra,
                          activity=Activity(), on_event=on_event)
    health = HealthWatch(health_url) if health_url else None
    results: list[CellResult] = []
    try:
        if health is not None:
            await health.__aenter__()
        sim = await health.sim() if health is not None else None
        run = functools.partial(_run_cell, client, health=health, time_scale=sim_time_scale(sim),
                                stall_timeout_s=stall_timeout_s, slo_ms=slo_ms, progress=progress)
        build = functools.partial(payloads, client, maker, sim=sim is not None)
        if warmup is not None and warmup.requests > 0:
            wcell = Cell(warmup.requests, warmup.input_len, warmup.output_len,
                         num_prompts=warmup.requests)
            wrng = random.Random(f"{seed}:warmup")
            await run(wcell, build(wcell, wrng), rng=wrng, label="warm-up")
        for index, cell in enumerate(cells):
            rng = random.Random(f"{seed}:{index}")
            results.append(await run(cell, build(cell, rng, seed + index), rng=rng,
                                     watch=watch() if watch else None))
            if on_cell is not None:
                on_cell(results[-1])
            if results[-1].error_class in FATAL:
                break
    finally:
        client.close()
        if health is not None:
            await health.__aexit__(None, None, None)
    return results


def run_cells(endpoint: str, cells: Sequence[Cell], **options: Any) -> list[CellResult]:
    """Run `cells` in order against `endpoint` (server root or full /v1/... URL) and return one
    CellResult per cell run; `options` are `run_cells_async`'s.  After a cell that ends
    "unhealthy", "server_died" or "hang" the server is gone, so the remaining cells are not run
    (the list is shorter).  `health_url` None disables the health watch (a connection error then
    ends the cell as "server_died").  `slo_ms` ({"ttft": ms, "tpot": ms, "e2el": ms}) adds
    `request_goodput`.
    """
    return asyncio.run(run_cells_async(endpoint, cells, **options))
