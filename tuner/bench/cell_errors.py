"""How a cell that ran to its end is judged from its records, and how long it took.

A server that stays healthy while some requests fail is not measured as if they had not: the
cell carries an error class that tuner.server.outcome turns into the trial's outcome.
"""

from __future__ import annotations

from collections.abc import Sequence

from tuner.bench.records import RequestRecord
from tuner.bench.stream import PROTOCOL_ERROR, STREAM_ERROR

HTTP_ERROR_CELL = "http_error"  # requests failed and none succeeded: the workload is refused
PARTIAL_CELL = "partial"        # some requests failed while others succeeded: a flaky server
# requests failed inside accepted streams (a broken stream or an error event) while the server
# stayed healthy: its figures cannot be trusted
PROTOCOL_CELL = "protocol"


def failed_requests(records: Sequence[RequestRecord],
                    failed: list[RequestRecord]) -> tuple[str, str]:
    """The cell's error when requests failed while the server stayed up: "protocol" when any
    failed inside an accepted stream; else "partial" (a flaky server) when others succeeded, and
    "http_error" (refused) when none did.  The reason names the first failure of that kind."""
    broken = [r for r in failed if r.error_class in (PROTOCOL_ERROR, STREAM_ERROR)]
    if broken:
        cls = PROTOCOL_CELL
    else:
        cls = PARTIAL_CELL if len(failed) < len(records) else HTTP_ERROR_CELL
    first = (broken or failed)[0]
    return cls, f"{len(failed)} of {len(records)} requests failed; first: {first.error}"


def judge_cell(records: Sequence[RequestRecord], error_class: str | None,
               error: str) -> tuple[str | None, str]:
    """The cell's (error class, error): the one the run already has (a dead server, a hang),
    else `failed_requests` when any request failed, else none.  Over HTTP and in-process."""
    failed = [r for r in records if not r.ok]
    if error_class is None and failed:
        return failed_requests(records, failed)
    return error_class, error


def cell_duration(records: Sequence[RequestRecord], wall_s: float) -> float:
    """Simulated records measure the cell on the simulator's clock, otherwise the wall clock."""
    sim = [r for r in records if r.sim and r.token_times]
    if sim:
        return max(r.token_times[-1] for r in sim) - min(r.send_time for r in sim)
    return wall_s
