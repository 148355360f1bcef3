"""What one request did, as seen by whoever measured it.

The HTTP client (`tuner.bench.client`) and the in-process simulator (`tuner.sim`) both produce
`RequestRecord`s, so one metrics function (`tuner.bench.metrics`) turns either into the same
per-cell figures.  Times are seconds on one clock per cell: the client's `time.perf_counter()`
for real servers, the simulator's clock when the server reports simulated time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.bench.sources import Source


@dataclass(frozen=True)
class Cell:
    """One point of the workload matrix.

    Closed loop (`request_rate is None`): `concurrency` requests are kept in flight.
    Open loop: requests arrive as a Poisson process of `request_rate` per second, at most
    `concurrency` in flight.  The cell ends after `num_prompts` requests or `duration_s`.
    """

    concurrency: int
    input_len: int
    output_len: int
    num_prompts: int | None = None
    duration_s: float | None = None
    request_rate: float | None = None
    source: Source | None = None

    @property
    def key(self) -> str:
        if self.source is not None:
            rate = f"_r{self.request_rate:g}" if self.request_rate else ""
            return f"{self.source.label}_c{self.concurrency}{rate}"
        return f"c{self.concurrency}_i{self.input_len}_o{self.output_len}"


@dataclass(frozen=True)
class Warmup:
    """Requests sent before the first cell and not measured: they pay for lazy allocation
    (transformers serve builds its KV cache on the first request), connection set-up and JIT."""

    requests: int
    input_len: int
    output_len: int


@dataclass
class RequestRecord:
    """Per-request timings and counts; `error` is None for a request that completed."""

    send_time: float
    token_times: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    error: str | None = None
    error_class: str | None = None
    sim: bool = False  # times are the server's simulated seconds, not the client's clock
    turn_of: tuple[int, int] | None = None  # multi-turn traffic: (conversation, turn)

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.token_times)

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.send_time if self.token_times else None

    @property
    def latency(self) -> float | None:
        return self.token_times[-1] - self.send_time if self.token_times else None

    @property
    def output_tokens(self) -> int:
        """Tokens generated: the server's own count when it sent one, else the chunks seen."""
        return (
            self.completion_tokens if self.completion_tokens is not None else len(self.token_times)
        )


@dataclass
class CellResult:
    """One cell's outcome.  `error_class` is None when every request completed; otherwise
    "unhealthy" / "server_died" / "hang" (the cell was cut short) or "http_error" (requests
    failed while the server stayed up: "http_error" when none succeeded, "partial" when some
    did).  `health_flaps`: times /health answered 5xx and then recovered while the cell ran.
    `peak_bytes`: the device memory the server held at its highest from start-up to the end of
    this cell, over the card's idle baseline (`tuner.server.memwatch`); None where unread."""

    cell: Cell
    records: list[RequestRecord]
    duration_s: float
    metrics: dict[str, float]
    error_class: str | None = None
    error: str = ""
    health_flaps: int = 0
    peak_bytes: int | None = None

    def to_dict(self, time_scale: float = 1.0) -> dict[str, Any]:
        """The JSON row: the cell's shape, then vllm-named metrics.  `duration` (seconds) is
        what was measured, on the clock `duration_clock` names; `duration_limit_s`, the cell's
        time cap, appears only when the cell had one."""
        c = self.cell
        row: dict[str, Any] = {"concurrency": c.concurrency, "input_len": c.input_len,
                               "output_len": c.output_len, "num_prompts": c.num_prompts,
                               "request_rate": c.request_rate}
        if c.duration_s is not None:
            row["duration_limit_s"] = c.duration_s
        if c.source is not None:
            row["source"] = c.source.label
        row.update(self.metrics)
        row["duration_clock"] = duration_clock(self.records, time_scale)
        row["error_class"] = self.error_class
        row["error"] = self.error
        return row


def duration_clock(records: list[RequestRecord], time_scale: float) -> str:
    """Which clock a cell's `duration` (and every latency) was read on: a simulated server
    reports its own clock; otherwise the wall clock, rescaled when a time scale applied."""
    if any(r.sim for r in records):
        return "simulated: the simulator's own clock, not the wall clock"
    if time_scale != 1.0:
        return f"wall clock x {time_scale:g} (the simulator's time scale)"
    return "wall clock"
