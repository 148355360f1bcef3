"""Streaming client for OpenAI-compatible /v1/chat/completions and /v1/completions.

Every number the tuner optimises comes from here, so the hot path is kept short: one
`perf_counter()` per network read, taken in the connection's `data_received` before any parsing
(see tuner.bench.http for why not in a task), a byte-level SSE split, and a regex per ordinary
token event (`json.loads` only for events that may carry usage, an error or simulated times).
A read that carries several events stamps them all with the read's arrival time, which is when
the tokens became visible.

Simulated time (docs/architecture.md): a response header `X-Tuner-Sim-Arrival` and per-chunk
`sim_t` lists replace the wall-clock send and token times, so metrics come out in simulated
seconds whatever the wall-clock pacing and the client's own jitter.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

from tuner.bench.http import ConnectionPool
from tuner.bench.records import RequestRecord
from tuner.bench.sse import SSEParser

SIM_ARRIVAL_HEADER = "X-Tuner-Sim-Arrival"
APIS = ("chat", "completions")
# Record-level error classes (the cell-level ones are in tuner.bench.runner).
HTTP_ERROR = "http_error"        # non-200 status: the server refused the request
STREAM_ERROR = "stream_error"    # `data: {"error": ...}` inside an accepted stream
CONNECTION_ERROR = "connection"  # reset, refused, closed before any token
ABORTED = "aborted"              # cancelled by the runner (health, stall, cell end)
# (record, raw SSE data, arrival time): lets a caller read fields the client does not know, e.g. a
# reference server's own write stamps
EventHook = Callable[[RequestRecord, str, float], None]
# A token chunk: a non-empty string value for the generated text (a quote right before the key
# name, so escaped text inside a value cannot match).
_CHAT_TOKEN = re.compile(r'"(?:content|reasoning_content)":\s*"(?!")')
_TEXT_TOKEN = re.compile(r'"text":\s*"(?!")')


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

    def prepare(self, prompt: str, max_tokens: int) -> bytes:
        """The whole HTTP request, built before a cell starts: serialising a long prompt costs tens
        of microseconds, which at a wave of 256 new requests would delay stamping other streams."""
        return self.pool.request_bytes(self.path, json.dumps(self.body(prompt, max_tokens)).encode())

    async def request(self, data: bytes, record: RequestRecord) -> RequestRecord:
        """Send `data` (from `prepare`) and stream the answer into `record`, filled in place so a
        cancelled request keeps what it measured.  Never raises for server faults: they end up in
        `record.error`."""
        activity = self.activity
        activity.open_streams += 1
        record.send_time = activity.last = time.perf_counter()
        conn = None
        try:
            for attempt in (1, 2):
                conn, reused = await self.pool.acquire()
                stream = _Stream(record, self.api == "chat", activity, conn.end_early, self.on_event)
                # stamped after the connection is ready: pool waits and connects are the client's
                record.send_time = time.perf_counter()
                try:
                    await conn.start(data, stream.on_head, stream.on_body)
                    break
                except ConnectionResetError:
                    # a keep-alive connection the server closed as we reused it (uvicorn drops idle
                    # ones after 5 s): nothing was processed, so send once more on a fresh one
                    if attempt == 2 or not reused or conn.got_response:
                        raise
                    self.pool.release(conn)
            stream.finish()
            if stream.failed:
                conn.close()
        except asyncio.CancelledError:
            _fail(record, ABORTED, "aborted by the runner")
            if conn is not None:
                conn.close()
            raise
        except (OSError, ValueError) as exc:
            _fail(record, CONNECTION_ERROR, f"{type(exc).__name__}: {exc}")
            if conn is not None:
                conn.close()
        finally:
            activity.open_streams -= 1
            if conn is not None:
                self.pool.release(conn)
        return record


class _Stream:
    """One response's SSE handling, run from the connection's data_received."""

    __slots__ = ("record", "chat", "activity", "end_early", "on_event", "parser", "status", "error_body",
                 "failed", "sim")

    def __init__(self, record: RequestRecord, chat: bool, activity: Activity,
                 end_early: Callable[[], None], on_event: EventHook | None) -> None:
        self.record = record
        self.on_event = on_event
        self.end_early = end_early
        self.chat = chat
        self.activity = activity
        self.parser = SSEParser()
        self.status = 0
        self.error_body = b""
        self.failed = False
        self.sim = False

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        sim_arrival = headers.get(SIM_ARRIVAL_HEADER.lower())
        if status == 200 and sim_arrival is not None:
            self.record.send_time = float(sim_arrival)
            self.record.sim = self.sim = True

    def on_body(self, data: bytes, now: float) -> None:
        self.activity.last = now
        if self.status != 200:
            self.error_body += data
            return
        if not self.failed:
            self._events(self.parser.feed(data), now)

    def finish(self) -> None:
        rec = self.record
        if self.status != 200:
            text = self.error_body[:300].decode("utf-8", "replace").replace("\n", " ")
            _fail(rec, HTTP_ERROR, f"HTTP {self.status}: {text}")
            self.failed = True
            return
        if not self.failed:
            self._events(self.parser.close(), time.perf_counter())
        if not rec.token_times:
            _fail(rec, CONNECTION_ERROR, "stream ended without a token")

    def _events(self, events: list[str], now: float) -> None:
        rec = self.record
        token = _CHAT_TOKEN if self.chat else _TEXT_TOKEN
        for data in events:
            if data == "[DONE]":
                continue
            if self.on_event is not None:
                self.on_event(rec, data, now)
            if not self.sim and '"usage"' not in data and '"error"' not in data:
                # the common token chunk: a regex is ~10x cheaper than json.loads, and anything
                # that could carry usage, an error or a sim field takes the full path below
                if token.search(data):
                    rec.token_times.append(now)
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                self._error(f"malformed event: {data[:200]}")
                return
            if obj.get("error"):
                self._error(_error_text(obj["error"]))
                return
            usage = obj.get("usage")
            if usage:
                rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
                rec.completion_tokens = usage.get("completion_tokens", rec.completion_tokens)
            if self.sim:
                sim_t = obj.get("sim_t")
                if sim_t:
                    rec.token_times.extend(sim_t)
                continue
            choices = obj.get("choices")
            if not choices:
                continue
            choice = choices[0]
            if self.chat:
                delta = choice.get("delta") or {}
                text = delta.get("content") or delta.get("reasoning_content")
            else:
                text = choice.get("text")
            if text:
                rec.token_times.append(now)

    def _error(self, message: str) -> None:
        _fail(self.record, STREAM_ERROR, message)
        self.failed = True
        self.end_early()  # a server may keep the stream open after its error: do not wait for it


def _fail(record: RequestRecord, error_class: str, message: str) -> None:
    if record.error is None:
        record.error = message
        record.error_class = error_class


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    return str(error)[:300]
