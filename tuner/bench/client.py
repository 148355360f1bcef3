"""Streaming client for OpenAI-compatible /v1/chat/completions and /v1/completions.

Every number the tuner optimises comes from here, so the hot path is kept short: one
`perf_counter()` per network read (taken before any parsing, so parsing cost never shifts a
stamp), a byte-level SSE split, one `json.loads` per event.  A read that carries several events
stamps them all with the read's arrival time, which is when the tokens became visible.

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

import aiohttp

from tuner.bench.records import RequestRecord
from tuner.bench.sse import SSEParser

SIM_ARRIVAL_HEADER = "X-Tuner-Sim-Arrival"
APIS = ("chat", "completions")
# Record-level error classes (the cell-level ones are in tuner.bench.runner).
HTTP_ERROR = "http_error"        # non-200 status: the server refused the request
STREAM_ERROR = "stream_error"    # `data: {"error": ...}` inside an accepted stream
CONNECTION_ERROR = "connection"  # reset, refused, closed before any token
ABORTED = "aborted"              # cancelled by the runner (health, stall, cell end)


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
    """Sends one streaming request at a time per call; share one instance across a cell."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        endpoint: str,
        *,
        model_name: str,
        api: str = "chat",
        request_extra: Mapping[str, Any] | None = None,
        activity: Activity | None = None,
    ) -> None:
        self.session = session
        self.url = base_url(endpoint) + api_path(api)
        self.api = api
        self.model_name = model_name
        self.request_extra = dict(request_extra or {})
        self.activity = activity or Activity()

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

    async def request(self, prompt: str, max_tokens: int, record: RequestRecord) -> RequestRecord:
        """Stream one request into `record`, filled in place so a cancelled request keeps what it
        measured.  Never raises for server faults: they end up in `record.error`."""
        payload = json.dumps(self.body(prompt, max_tokens)).encode()
        activity = self.activity
        activity.open_streams += 1
        record.send_time = activity.last = time.perf_counter()
        try:
            async with self.session.post(
                self.url, data=payload, headers={"Content-Type": "application/json"}
            ) as resp:
                if resp.status != 200:
                    text = (await resp.text(errors="replace"))[:300].replace("\n", " ")
                    _fail(record, HTTP_ERROR, f"HTTP {resp.status}: {text}")
                    return record
                sim_arrival = resp.headers.get(SIM_ARRIVAL_HEADER)
                if sim_arrival is not None:
                    record.send_time = float(sim_arrival)
                    record.sim = True
                await self._read_stream(resp, record)
        except asyncio.CancelledError:
            _fail(record, ABORTED, "aborted by the runner")
            raise
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            _fail(record, CONNECTION_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            activity.open_streams -= 1
        return record

    async def _read_stream(self, resp: aiohttp.ClientResponse, record: RequestRecord) -> None:
        parser = SSEParser()
        content = resp.content
        token_times = record.token_times
        perf = time.perf_counter
        activity = self.activity
        chat = self.api == "chat"
        sim = record.sim
        done = False
        while not done:
            chunk = await content.readany()
            now = perf()
            activity.last = now
            if not chunk:
                events = parser.close()
                done = True
            else:
                events = parser.feed(chunk)
            for data in events:
                if data == "[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(data)
                except ValueError:
                    _fail(record, STREAM_ERROR, f"malformed event: {data[:200]}")
                    return
                if "error" in obj and obj["error"]:
                    _fail(record, STREAM_ERROR, _error_text(obj["error"]))
                    return
                usage = obj.get("usage")
                if usage:
                    record.prompt_tokens = usage.get("prompt_tokens", record.prompt_tokens)
                    record.completion_tokens = usage.get("completion_tokens", record.completion_tokens)
                if sim:
                    sim_t = obj.get("sim_t")
                    if sim_t:
                        token_times.extend(sim_t)
                    continue
                choices = obj.get("choices")
                if not choices:
                    continue
                choice = choices[0]
                if chat:
                    delta = choice.get("delta") or {}
                    text = delta.get("content") or delta.get("reasoning_content")
                else:
                    text = choice.get("text")
                if text:
                    token_times.append(now)
        if not token_times:
            _fail(record, CONNECTION_ERROR, "stream ended without a token")


def _fail(record: RequestRecord, error_class: str, message: str) -> None:
    if record.error is None:
        record.error = message
        record.error_class = error_class


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    return str(error)[:300]
