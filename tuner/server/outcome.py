"""Turn what a trial saw into one outcome the sampler can learn from.

The evidence is scattered: a log line (`cudaMalloc failed`), an exit status, a /health that
turned 503, streams that stopped.  Only an OOM found in the log proves a memory failure, so log
patterns from the search space are checked first; the other signals say how the server failed
when the log is silent (a native crash prints nothing).  `protocol`: the server stayed up but its
accepted streams broke the SSE / OpenAI protocol or carried error events (tuner.bench.stream), so
nothing it was measured at can be trusted: infeasible like every failure, never exportable.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tuner.server.process import PORT_TAKEN

OK = "ok"
FAILED_OUTCOMES = ("oom", "startup", "crash", "unhealthy", "hang", "protocol", "flaky")
# Not the config's doing: the trial is failed (Optuna FAIL, not counted) and run again.
RETRY_OUTCOMES = ("gpu_busy",)
ALL_OUTCOMES = (OK, *FAILED_OUTCOMES, "rejected", "slo", "skipped", *RETRY_OUTCOMES)


@dataclass(frozen=True)
class Evidence:
    """Everything a trial observed about the server's fate."""

    log_text: str
    became_healthy: bool
    exit_code: int | None          # None while the process is still running
    health_failed: bool            # /health answered non-200 or stopped answering during the run
    cell_errors: tuple[str, ...]   # error classes of the cells that ended early
    first_error: str = ""          # the first request error message seen, for the reason
    health_flaps: int = 0          # /health answered 5xx and recovered, this many times
    foreign_pids: tuple[int, ...] = ()  # other processes found on the GPU after the run


@dataclass(frozen=True)
class Outcome:
    kind: str
    reason: str

    @property
    def feasible(self) -> bool:
        return self.kind == OK


def first_match(log_text: str, patterns: Iterable[str]) -> str | None:
    """The first log line matching any pattern, stripped, or None."""
    compiled = [re.compile(p) for p in patterns]
    for line in log_text.splitlines():
        if any(c.search(line) for c in compiled):
            return line.strip()[:300]
    return None


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def classify(ev: Evidence, patterns: Mapping[str, Iterable[str]]) -> Outcome:  # noqa: C901, PLR0911
    """Classify a trial; the order of checks is the order of certainty."""
    if ev.foreign_pids:
        return Outcome("gpu_busy", f"process(es) {list(ev.foreign_pids)} took the GPU during the "
                       "trial, so its figures (or its failure) are not the config's; run again")
    oom_line = first_match(ev.log_text, patterns.get("oom", ()))
    if oom_line:
        when = "at start-up" if not ev.became_healthy else "under load"
        return Outcome("oom", f"out of memory {when}: {oom_line}")
    if not ev.became_healthy:
        taken = first_match(ev.log_text, [PORT_TAKEN.pattern])
        if taken and ev.exit_code is not None:
            return Outcome("startup", "another process kept taking the server's port between "
                           f"the check and the launch (every attempt): {taken}")
        line = first_match(ev.log_text, patterns.get("startup", ())) or \
            first_match(ev.log_text, patterns.get("crash", ()))
        how = _exit_text(ev.exit_code) if ev.exit_code is not None else \
            "no healthy answer within the start-up timeout; a slow server needs --startup-timeout"
        return Outcome(
            "startup", f"server never became healthy ({how})" + (f": {line}" if line else "")
        )
    crash_line = first_match(ev.log_text, patterns.get("crash", ()))
    if ev.exit_code is not None or crash_line:
        how = _exit_text(ev.exit_code) if ev.exit_code is not None else "crash in log"
        return Outcome(
            "crash",
            f"server died during the run ({how})" + (f": {crash_line}" if crash_line else ""),
        )
    unhealthy_line = first_match(ev.log_text, patterns.get("unhealthy", ()))
    if ev.health_failed or unhealthy_line or "unhealthy" in ev.cell_errors:
        return Outcome("unhealthy", "server turned unhealthy during the run"
                       + (f": {unhealthy_line}" if unhealthy_line else ""))
    if "hang" in ev.cell_errors:
        return Outcome("hang", "no token arrived within the stall timeout")
    if "protocol" in ev.cell_errors:
        return Outcome("protocol", "the server's streams broke the protocol while it stayed healthy"
                       + (f": {ev.first_error}" if ev.first_error else ""))
    if "http_error" in ev.cell_errors:
        return Outcome("rejected", "the server refused requests of this workload (HTTP 4xx/5xx)"
                       + (f": {ev.first_error}" if ev.first_error else ""))
    if "partial" in ev.cell_errors:
        return Outcome("flaky", "the server failed some requests and answered the rest"
                       + (f": {ev.first_error}" if ev.first_error else ""))
    if ev.cell_errors:
        return Outcome("crash", f"requests failed: {', '.join(sorted(set(ev.cell_errors)))}")
    if ev.health_flaps:
        return Outcome("flaky", "/health answered 5xx and then recovered while every request "
                       "completed")
    return Outcome(OK, "all cells completed")
