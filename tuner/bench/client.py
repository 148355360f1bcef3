"""Streaming client for OpenAI-compatible /v1/chat/completions and /v1/completions.

Every number the tuner optimises comes from here, so the hot path is kept short: one
arrival stamp per network read, taken in the connection's `data_received` before any parsing
(see tuner.bench.http for why not in a task), a byte-level SSE split, and a full check of every
event against the protocol (tuner.bench.stream): `json.loads` for the first chunks, one regex
match for the token chunks that share their template (tuner.bench.frames).  A read that carries
several events stamps them all with the read's arrival time, which is when the tokens became
visible.

Simulated time (docs/architecture.md): a response header `X-Tuner-Sim-Arrival` and per-chunk
`sim_t` lists replace the wall-clock send and token times, so metrics come out in simulated
seconds whatever the wall-clock pacing and the client's own jitter.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from typing import Any

from tuner.bench.http import ConnectionPool
from tuner.bench.records import RequestRecord
from tuner.bench.stream import (
    ABORTED,
    CONNECTION_ERROR,
    HTTP_ERROR,
    PROTOCOL_ERROR,
    SIM_ARRIVAL_HEADER,
    STREAM_ERROR,
    EventHook,
    Stream,
    fail,
)

APIS = ("chat", "completions")
__all__ = ["ABORTED", "APIS", "CONNECTION_ERROR", "HTTP_ERROR", "PROTOCOL_ERROR",
           "SIM_ARRIVAL_HEADER", "STREAM_ERROR", "Activity", "EventHook", "StreamClient"]


def api_path(api: str) -> str:
    if api not in APIS:
        raise ValueError(f"api must be one of {APIS}, got {api!r}")
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def base_url(endpoint: str) -> str:
    """Accept either a server root or a full endpoint URL; the runner needs the root for /health."""
    url = endpoint.rstrip("/")
    for suffix in ("/v1/chat/completions", "/v1/completions", "/v1"):
        if url.endswith(suffix):
            return url[: -len(suffix)]
    return url


class Activity:
    """Wall-clock time of the last byte seen on any stream; the runner's stall watch reads it."""

    __slots__ = ("last", "open_streams")

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.open_streams = 0


class StreamClient:
    """Sends streaming requests over a keep-alive pool; share one instance across a run."""

    def __init__(
        self,
        endpoint: str,
        *,
        model_name: str,
        api: str = "chat",
        request_extra: Mapping[str, Any] | None = None,
        activity: Activity | None = None,
        on_event: EventHook | None = None,
    ) -> None:
        self.on_event = on_event
        self.pool = ConnectionPool(base_url(endpoint))
        self.path = api_path(api)
        self.api = api
        self.model_name = model_name
        self.request_extra = dict(request_extra or {})
        self.activity = activity or Activity()

    def close(self) -> None:
        self.pool.close()

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        """The request body; a `None` in request_extra removes a default field (e.g. stream_options
        for a server that rejects it)."""
        body: dict[str, Any] = {"model": self.model_name, "max_tokens": max_tokens, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        for key, value in self.request_extra.items():
            if value is None:
                body.pop(key, None)
            else:
                body[key] = value
        return body

    def prepare(self, prompt: str, max_tokens: int,
                headers: Mapping[str, str] | None = None) -> bytes:
        """The whole HTTP request, built before a cell starts: serialising a long prompt costs tens
        of microseconds, which at a wave of 256 new requests would delay stamping other streams."""
        body = json.dumps(self.body(prompt, max_tokens)).encode()
        return self.pool.request_bytes(self.path, body, headers)

    async def request(self, data: bytes, record: RequestRecord,
                      max_tokens: int | None = None) -> RequestRecord:
        """Send `data` (from `prepare`) and stream the answer into `record`, filled in place so a
        cancelled request keeps what it measured.  Never raises for server faults: they end up in
        `record.error`.  `max_tokens` (the request's) bounds the usage a server may report."""
        activity = self.activity
        activity.open_streams += 1
        record.send_time = activity.last = time.perf_counter()
        conn = None
        try:
            for attempt in (1, 2):
                conn, reused = await self.pool.acquire()
                stream = Stream(record, self.api == "chat", activity, conn.end_early,
                                self.on_event, max_tokens)
                # stamped after the connection is ready: pool waits and connects are the client's
                record.send_time = time.perf_counter()
                try:
                    await conn.start(data, stream.on_head, stream.on_body)
                    break
                except ConnectionResetError as exc:
                    if conn.got_response:  # the response had begun: a truncated stream
                        stream.cut(str(exc))
                        raise
                    # a keep-alive connection the server closed as we reused it (uvicorn drops idle
                    # ones after 5 s): nothing was processed, so send once more on a fresh one
                    if attempt == 2 or not reused:
                        raise
                    self.pool.release(conn)
            stream.finish()
            if stream.failed and conn is not None:
                conn.close()
        except asyncio.CancelledError:
            fail(record, ABORTED, "aborted by the runner")
            if conn is not None:
                conn.close()
            raise
        except (OSError, ValueError) as exc:
            fail(record, CONNECTION_ERROR, f"{type(exc).__name__}: {exc}")
            if conn is not None:
                conn.close()
        finally:
            activity.open_streams -= 1
            if conn is not None:
                self.pool.release(conn)
        return record
