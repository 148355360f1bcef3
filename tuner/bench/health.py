"""Watches a server while a cell runs: the only way to notice an engine that died silently.

InfiniLM's in-flight streams hang with no error when its step loop dies; only /health (503) says
so.  A refused connection means the process is gone.  Probes run on their own connection pool so
that a cell's streams never delay them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from tuner.aio import wait_event

UNHEALTHY = "unhealthy"
SERVER_DIED = "server_died"
HANG = "hang"

POLL_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 2.0
MAX_PROBE_TIMEOUTS = 3  # a /health that stops answering altogether is a hang
# A 5xx is believed when this many probes in a row say so (one poll interval apart); a 5xx
# followed by a 200 is a flap, counted in `flaps`: the run goes on, the trial is judged flaky.
UNHEALTHY_PROBES = 3


class HealthWatch:
    """Polls `url` every POLL_INTERVAL_S, or at once after `kick()` (a stream just failed)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._session: aiohttp.ClientSession | None = None
        self._kick = asyncio.Event()
        self.flaps = 0

    async def __aenter__(self) -> HealthWatch:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=2, force_close=True),
            timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    def kick(self) -> None:
        self._kick.set()

    async def probe(self) -> tuple[str | None, str, dict]:
        """-> (error class or None, one-line reason, the JSON body when there was one)."""
        assert self._session is not None
        try:
            async with self._session.get(self.url) as resp:
                try:
                    body = await resp.json(content_type=None)
                except ValueError:
                    body = {}
                if resp.status >= 500:
                    return UNHEALTHY, f"GET {self.url} -> {resp.status} {body}", body
                return None, "", body if isinstance(body, dict) else {}
        except asyncio.TimeoutError:
            return HANG, f"GET {self.url} did not answer within {PROBE_TIMEOUT_S} s", {}
        except (aiohttp.ClientConnectionError, OSError) as exc:
            return SERVER_DIED, f"GET {self.url}: {type(exc).__name__}: {exc}", {}

    async def sim(self) -> dict | None:
        """The simulated-time block of /health ("sim"), None for a real server."""
        _, _, body = await self.probe()
        sim = body.get("sim") if isinstance(body, dict) else None
        return sim if isinstance(sim, dict) else None


    async def watch(self, end: Callable[[str, str], None]) -> None:
        """Call `end(error_class, reason)` once the server is bad, then return.  A 5xx not yet
        confirmed when the watch is cancelled (the cell ended) counts as a flap."""
        timeouts = bad = 0
        try:
            while True:
                cls, reason, _ = await self.probe()
                if cls == HANG:
                    timeouts += 1
                    if timeouts >= MAX_PROBE_TIMEOUTS:
                        end(HANG, reason)
                        return
                elif cls == UNHEALTHY:
                    bad += 1
                    if bad >= UNHEALTHY_PROBES:
                        bad = 0
                        end(cls, reason)
                        return
                    await asyncio.sleep(POLL_INTERVAL_S)
                    continue
                elif cls is not None:
                    end(cls, reason)
                    return
                else:
                    self.flaps += int(bad > 0)
                    timeouts = bad = 0
                await wait_event(self._kick, POLL_INTERVAL_S)
                self._kick.clear()
        finally:
            self.flaps += int(bad > 0)


def time_scale(sim: dict | None) -> float:
    """Simulated seconds per wall second from /health's "sim" block: 1 for real servers."""
    try:
        return float(sim["time_scale"]) if sim is not None else 1.0
    except (KeyError, TypeError, ValueError):
        return 1.0


async def stall_watch(activity, stall_timeout_s: float, end: Callable[[str, str], None]) -> None:
    """No byte on any open stream for stall_timeout_s: the server hangs without saying so."""
    period = min(1.0, stall_timeout_s / 4)
    while True:
        await asyncio.sleep(period)
        idle = time.perf_counter() - activity.last
        if activity.open_streams > 0 and idle > stall_timeout_s:
            end(HANG, f"no token on any of {activity.open_streams} open streams for {idle:.1f} s")
            return
