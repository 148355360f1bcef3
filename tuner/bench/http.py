"""A minimal HTTP/1.1 client on asyncio protocols, for the streaming hot path only.

Why not aiohttp here: its response stream wakes the reading task once per network read, and the
time stamp is taken when that task runs, after every other ready callback and task of the loop
iteration (including other workers starting new requests).  At 256 streams that put tens of ms
of client queueing into TTFT and ITL.  Here bytes are handled straight from the selector callback
with their arrival time (the kernel's receive stamp on plain TCP, see tuner.bench.stamped), SSE
events are parsed there, and the waiting coroutine is woken once, when the response ends.
(Health probes, which are not timed, still use aiohttp.)

Supports what OpenAI-compatible servers send: keep-alive, chunked or Content-Length or
close-delimited bodies, TLS.  No proxies, no redirects, no compression (not asked for).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from tuner.bench import stamped

# on_head(status, headers) is called once; on_body(bytes, arrival) per read; both from the
# read callback
HeadCallback = Callable[[int, dict[str, str]], None]
BodyCallback = Callable[[bytes, float], None]


class ConnectionPool:
    """Idle keep-alive connections to one origin; a connection serves one request at a time."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme in {base_url!r}")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.host_header = parts.netloc
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._topping_up = False

    async def acquire(self) -> tuple[_Connection, bool]:
        """-> (connection, whether it is a reused keep-alive one)."""
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn, True
        return await self._open(), False

    async def _open(self) -> _Connection:
        conn = _Connection()
        if self.ssl is None and stamped.SUPPORTED:
            await stamped.open_stamped(self.host, self.port, conn)
        else:
            loop = asyncio.get_running_loop()
            await loop.create_connection(lambda: conn, self.host, self.port, ssl=self.ssl)
        self._all.add(conn)
        return conn

    async def top_up(self, spare: int) -> None:
        """Open connections until `spare` are idle, off the send path: an open-loop sender
        that finds none idle would otherwise pay a connect inside its send time.  Errors are
        left to the next real request to meet."""
        if self._topping_up:
            return
        self._topping_up = True
        try:
            while sum(not c.closed for c in self._idle) < spare:
                self._idle.insert(0, await self._open())
        except OSError:
            pass
        finally:
            self._topping_up = False

    def release(self, conn: _Connection) -> None:
        if conn.closed or not conn.reusable:
            conn.close()
            self._all.discard(conn)
        else:
            self._idle.append(conn)

    def close(self) -> None:
        for conn in list(self._all):
            conn.close()
        self._all.clear()
        self._idle.clear()

    def request_bytes(self, path: str, body: bytes,
                      headers: Mapping[str, str] | None = None) -> bytes:
        extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
        return (f"POST {self.prefix}{path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
                f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{extra}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1") + body


class _Connection(asyncio.Protocol):
    """Parses one response at a time, handing body bytes to the current request's callbacks."""

    def __init__(self) -> None:
        self.transport: Any = None  # asyncio.Transport or stamped.StampedTransport
        self.closed = False
        self.reusable = False
        self._done: asyncio.Future | None = None
        self._on_head: HeadCallback | None = None
        self._on_body: BodyCallback | None = None
        self._buf = b""
        self._in_head = True
        self._chunked = False
        self._length: int | None = None  # Content-Length left; None with chunked or close-delimited
        self._chunk_left = 0
        self._skip = 0          # CRLF after a chunk's data
        self._trailers = False  # after the 0-size chunk

    # -- request side
    def start(self, data: bytes, on_head: HeadCallback, on_body: BodyCallback) -> asyncio.Future:
        """Write the request; the future resolves when the response has ended (or fails on a
        connection error).  Returns at once: the caller stamps its send time around this."""
        assert self.transport is not None
        self._done = asyncio.get_running_loop().create_future()
        self._on_head, self._on_body = on_head, on_body
        self._buf, self._in_head, self.reusable = b"", True, False
        self.transport.write(data)
        return self._done

    def end_early(self) -> None:
        """The caller has seen enough of this response: end it now; the connection is not reused."""
        self.reusable = False
        self._finish()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self._done is not None and not self._done.done():
                self._done.cancel()  # nobody waits any more: no exception left unretrieved
            if self.transport is not None:
                self.transport.abort()

    # -- protocol side
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._done is not None and not self._done.done():
            if not self._in_head and not self._chunked and self._length is None:
                self._done.set_result(None)  # close-delimited body: the close is its end
            else:
                self._done.set_exception(
                    ConnectionResetError(str(exc) if exc else "connection closed by server")
                )

    def data_received(self, data: bytes) -> None:
        """asyncio transports (TLS): the arrival is when the loop hands us the bytes."""
        self.feed(data, time.perf_counter())

    def feed(self, data: bytes, now: float) -> None:
        """Bytes and their arrival time (the kernel's, from tuner.bench.stamped, for plain TCP).
        Runs in a transport callback: a malformed response must fail the request, not escape to
        the event loop and leave the request waiting for the stall timeout."""
        if self._done is None or self._done.done():
            return  # bytes after a finished or abandoned response: nothing wants them
        try:
            self._feed(data, now)
        except (ValueError, IndexError) as exc:
            self._done.set_exception(ValueError(f"malformed HTTP response: {exc}"))
            self.close()

    @property
    def got_response(self) -> bool:
        """Whether any byte of the current response arrived (a stale keep-alive fails before)."""
        return not self._in_head or bool(self._buf)

    def _feed(self, data: bytes, now: float) -> None:
        if self._in_head:
            buf = self._buf + data
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                self._buf = buf
                return
            self._buf = b""
            self._parse_head(buf[:end])
            data = buf[end + 4:]
            if self._length == 0:
                self._finish()
                return
        if data:
            self._body(data, now)

    def _parse_head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self._in_head = False
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._length = int(length) if length is not None and not self._chunked else None
        self._chunk_left = self._skip = 0
        self._trailers = False
        self.reusable = (self._chunked or self._length is not None) and \
            headers.get("connection", "").lower() != "close"
        assert self._on_head is not None
        self._on_head(status, headers)

    def _body(self, data: bytes, now: float) -> None:
        assert self._on_body is not None
        if self._chunked:
            payload = self._dechunk(data)
            if payload:
                self._on_body(payload, now)
            if self._trailers and self._buf.endswith(b"\r\n") and (
                    self._buf == b"\r\n" or self._buf.endswith(b"\r\n\r\n")):
                self._finish()
        elif self._length is not None:
            if len(data) >= self._length:
                data = data[: self._length]
            self._length -= len(data)
            self._on_body(data, now)
            if self._length == 0:
                self._finish()
        else:
            self._on_body(data, now)

    def _dechunk(self, data: bytes) -> bytes:
        """Strip chunked framing; partial size lines wait in self._buf for the next read."""
        buf = self._buf + data if self._buf else data
        out = []
        pos, n = 0, len(buf)
        while pos < n and not self._trailers:
            if self._chunk_left:
                take = min(self._chunk_left, n - pos)
                out.append(buf[pos:pos + take])
                pos += take
                self._chunk_left -= take
                if not self._chunk_left:
                    self._skip = 2
            elif self._skip:
                take = min(self._skip, n - pos)
                pos += take
                self._skip -= take
            else:
                nl = buf.find(b"\r\n", pos)
                if nl < 0:
                    break
                size = int(buf[pos:nl].split(b";", 1)[0], 16)
                pos = nl + 2
                if not size:
                    self._trailers = True
                elif pos + size + 2 <= n:  # the usual case: the whole chunk is here
                    out.append(buf[pos:pos + size])
                    pos += size + 2
                else:
                    self._chunk_left = size
        self._buf = buf[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    def _finish(self) -> None:
        self._buf = b""
        if self._done is not None and not self._done.done():
            self._done.set_result(None)
