"""One streamed response, checked against the SSE and OpenAI streaming protocol as it arrives.

Every number the tuner optimises is counted here, so a stream that breaks the protocol fails its
request (error class "protocol", with the reason) instead of being measured: a server whose
streams are broken must never look healthy, let alone fast.  What counts as broken:

- HTTP 200 whose Content-Type is not text/event-stream;
- a line that is no SSE field, or invalid UTF-8 (tuner.bench.sse);
- an event that is not a JSON object, or a chunk with no `choices` (an empty list only beside
  `usage`), a choice or delta of the wrong type, text that is not a string, a token after
  `finish_reason`, anything after `data: [DONE]`;
- a stream that ends (close, or the connection cut mid-stream) before `[DONE]` and without a
  `finish_reason`, or that ends without any token;
- `usage` that is not non-negative integers, or whose completion_tokens is below the token chunks
  counted (each chunk with text carries at least one token) or above the request's max_tokens;
  with the simulated-time protocol each token has its own `sim_t`, so the counts must be equal.

`data: {"error": ...}` (transformers serve on an engine error) is the server saying the request
failed: error class "stream_error" with its message.  Every event is checked in full: the first
token chunks with `json.loads`, the later ones that share their template with one regex match
(tuner.bench.frames: about 1.7 us a chunk against 4.6 us for `json.loads`; the regex that only
looked for a token, and counted a truncated chunk as one, took 1.3 us).  The arrival time of a
token is the network read's
(see tuner.bench.http), taken before any of this runs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from tuner.bench.frames import known, learn
from tuner.bench.records import RequestRecord
from tuner.bench.sse import SSEParser

SIM_ARRIVAL_HEADER = "X-Tuner-Sim-Arrival"
# Record-level error classes (the cell-level ones are in tuner.bench.runner).
HTTP_ERROR = "http_error"        # non-200 status: the server refused the request
STREAM_ERROR = "stream_error"    # `data: {"error": ...}` inside an accepted stream
PROTOCOL_ERROR = "protocol"      # an accepted stream that breaks the SSE / OpenAI protocol
CONNECTION_ERROR = "connection"  # reset, refused or closed before the response began
ABORTED = "aborted"              # cancelled by the runner (health, stall, cell end)
# (record, raw SSE data, arrival time): lets a caller read fields the client does not know, e.g. a
# reference server's own write stamps
EventHook = Callable[[RequestRecord, str, float], None]


class ProtocolViolation(Exception):
    """Raised inside the event handling; becomes the record's "protocol" error."""


class Stream:
    """One response's SSE handling, run from the connection's data_received."""

    __slots__ = ("record", "chat", "activity", "end_early", "on_event", "parser", "status",
                 "error_body", "failed", "sim", "max_tokens", "chunks", "done", "finish_reason",
                 "frame")

    def __init__(self, record: RequestRecord, chat: bool, activity: Any,
                 end_early: Callable[[], None], on_event: EventHook | None,
                 max_tokens: int | None = None) -> None:
        self.record = record
        self.on_event = on_event
        self.end_early = end_early
        self.chat = chat
        self.activity = activity
        self.max_tokens = max_tokens
        self.parser = SSEParser()
        self.status = 0
        self.error_body = b""
        self.failed = False
        self.sim = False
        self.chunks = 0                            # events that carried generated text
        self.done = False                          # `data: [DONE]` seen
        self.finish_reason: str | None = None
        self.frame: Any = None                     # tuner.bench.frames: the token chunks' template

    def on_head(self, status: int, headers: dict[str, str]) -> None:
        self.status = status
        if status != 200:
            return
        kind = headers.get("content-type", "")
        if not kind.lower().startswith("text/event-stream"):
            self.fail(PROTOCOL_ERROR, f"HTTP 200 with Content-Type {kind or '(none)'!r}, "
                                      "not text/event-stream")
            return
        sim_arrival = headers.get(SIM_ARRIVAL_HEADER.lower())
        if sim_arrival is not None:
            try:
                self.record.send_time = float(sim_arrival)
            except ValueError:
                self.fail(PROTOCOL_ERROR, f"bad {SIM_ARRIVAL_HEADER}: {sim_arrival[:50]!r}")
                return
            self.record.sim = self.sim = True

    def on_body(self, data: bytes, now: float) -> None:
        self.activity.last = now
        if self.status != 200:
            self.error_body += data
        elif not self.failed:
            try:
                self._events(self.parser.feed(data), now)
            except (ProtocolViolation, ValueError) as exc:
                self.fail(PROTOCOL_ERROR, str(exc))

    def cut(self, reason: str) -> None:
        """The connection closed after the response began: a truncated stream."""
        if self.status == 200:
            self.fail(PROTOCOL_ERROR, f"connection closed mid-stream after {self.chunks} token "
                                      f"chunks ({reason})")

    def finish(self) -> None:
        """The response ended as HTTP framing says: now the stream must be complete."""
        rec = self.record
        if self.status != 200:
            text = self.error_body[:300].decode("utf-8", "replace").replace("\n", " ")
            self.fail(HTTP_ERROR, f"HTTP {self.status}: {text}")
            return
        if self.failed:
            return
        try:
            self._events(self.parser.close(), time.perf_counter())
            if not self.done and self.finish_reason is None:
                raise ProtocolViolation(f"stream ended without [DONE] or a finish_reason after "
                                        f"{self.chunks} token chunks (truncated)")
            if not rec.token_times:
                raise ProtocolViolation("stream ended without a token")
            self._check_usage()
        except (ProtocolViolation, ValueError) as exc:
            self.fail(PROTOCOL_ERROR, str(exc))

    def fail(self, error_class: str, message: str) -> None:
        fail(self.record, error_class, message)
        if not self.failed:
            self.failed = True
            self.end_early()  # a server may keep the stream open after its error: do not wait

    # -- per event
    def _events(self, events: list[str], now: float) -> None:
        for data in events:
            if self.done:
                raise ProtocolViolation(f"event after [DONE]: {data[:200]}")
            if self.on_event is not None and data != "[DONE]":
                self.on_event(self.record, data, now)
            if self.finish_reason is None and not self.sim and self._framed(data):
                self.chunks += 1
                self.record.token_times.append(now)
                continue
            if data == "[DONE]":
                self.done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                raise ProtocolViolation(f"event is not JSON: {data[:200]}") from None
            if not isinstance(obj, dict):
                raise ProtocolViolation(f"event is not a JSON object: {data[:200]}")
            if obj.get("error"):
                self.fail(STREAM_ERROR, _error_text(obj["error"]))
                return
            key = self._chunk(obj, now)
            if key is not None and not self.sim:
                self.frame = learn(data, key)

    def _framed(self, data: str) -> bool:
        """Whether `data` is a token chunk of this stream's template, or of one learned lately."""
        if self.frame is not None:  # a chunk of another shape (the last one, say): parse it
            return self.frame.fullmatch(data) is not None
        hit = known(data, ("content", "reasoning_content") if self.chat else ("text",))
        if hit is not None:
            self.frame = hit
        return hit is not None

    def _chunk(self, obj: dict[str, Any], now: float) -> str | None:
        """Count the chunk's token; -> the key of its text when it is a plain token chunk (text,
        no usage, no finish_reason), whose template tuner.bench.frames may learn."""
        usage = obj.get("usage")
        if usage is not None:
            self._usage(usage)
        choices = obj.get("choices")
        if not isinstance(choices, list) or (not choices and usage is None):
            raise ProtocolViolation(f"chunk without choices: {json.dumps(obj)[:200]}")
        if not choices:
            return None
        choice = choices[0]
        if not isinstance(choice, dict):
            raise ProtocolViolation(f"choice is not an object: {choice!r:.100}")
        text = self._text(choice)
        if text:
            if self.finish_reason is not None:
                raise ProtocolViolation(f"token after finish_reason {self.finish_reason!r}")
            self.chunks += 1
            if self.sim:
                sim_t = obj.get("sim_t")
                if not isinstance(sim_t, list) or not sim_t:
                    raise ProtocolViolation("simulated-time chunk without sim_t")
                self.record.token_times.extend(sim_t)
            else:
                self.record.token_times.append(now)
        reason = choice.get("finish_reason")
        if reason is not None:
            self.finish_reason = str(reason)
        if not text or reason is not None or usage is not None:
            return None
        if not self.chat:
            return "text"
        return "content" if choice["delta"].get("content") else "reasoning_content"

    def _text(self, choice: dict[str, Any]) -> str | None:
        if self.chat:
            delta = choice.get("delta")
            if not isinstance(delta, dict):
                raise ProtocolViolation(f"chat chunk without a delta object: {choice!r:.150}")
            text = delta.get("content") or delta.get("reasoning_content")
        else:
            text = choice.get("text")
        if text is not None and not isinstance(text, str):
            raise ProtocolViolation(f"generated text is not a string: {text!r:.100}")
        return text

    def _usage(self, usage: Any) -> None:
        rec = self.record
        if not isinstance(usage, dict):
            raise ProtocolViolation(f"usage is not an object: {usage!r:.100}")
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < 0):
                raise ProtocolViolation(f"usage {key} is not a non-negative integer: {value!r:.50}")
        rec.prompt_tokens = usage.get("prompt_tokens", rec.prompt_tokens)
        rec.completion_tokens = usage.get("completion_tokens", rec.completion_tokens)

    def _check_usage(self) -> None:
        reported = self.record.completion_tokens
        if reported is None:
            return
        counted = len(self.record.token_times) if self.sim else self.chunks
        what = "tokens with sim_t" if self.sim else "token chunks"
        if reported < counted or (self.sim and reported != counted):
            raise ProtocolViolation(f"usage reports {reported} completion tokens, {counted} {what} "
                                    "arrived")
        if self.max_tokens is not None and reported > self.max_tokens:
            raise ProtocolViolation(f"usage reports {reported} completion tokens, more than "
                                    f"max_tokens {self.max_tokens}")


def fail(record: RequestRecord, error_class: str, message: str) -> None:
    """Keep the first failure: later ones are its consequences."""
    if record.error is None:
        record.error = message
        record.error_class = error_class


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:300]
    return str(error)[:300]
