"""A reference OpenAI-compatible streaming server that emits tokens on an exactly known schedule.

Token i of a request is due at `receipt + ttft + i * itl` (an absolute schedule, so a late token
does not delay the next one).  Each chunk carries `rcv_t` (the request's receipt), `due_t` (the
intended time) and `srv_t` (when it was actually written), all `time.perf_counter()` values,
which on Linux share CLOCK_MONOTONIC with the client process.  `GET /stats` returns every request's receipt, due and
write times, so a benchmark can split the error into server lateness (srv_t - due_t) and client
error (client stamp - srv_t).

Written on raw sockets with kernel receive stamps (the client's own tuner.bench.stamped
transport), not a web framework: the server must not be the bottleneck when the client is pushed
to tens of thousands of tokens per second on a small machine, and a request's receipt must be
when it arrived, not when a busy loop got to it.  Linux only.
Run: PYTHONPATH=. python benchmarks/paced_server.py --port P --ttft-ms 20 --itl-ms 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time

from tuner.bench.stamped import SO_TIMESTAMPNS, StampedTransport

_OK_SSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n")


class Pacing:
    """The schedule, adjustable between cells through `POST /config` so one process serves a sweep."""

    def __init__(self, ttft_s: float, itl_s: float) -> None:
        self.ttft_s = ttft_s
        self.itl_s = itl_s
        self.stats: list[tuple[float, list[float], list[float]]] = []


def _json_response(status: str, obj: object) -> bytes:
    body = json.dumps(obj).encode()
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
            .encode() + body)


class PacedProtocol:
    """One connection: HTTP/1.1 keep-alive, one request at a time (clients do not pipeline)."""

    def __init__(self, pacing: Pacing, model: str) -> None:
        self.pacing = pacing
        self.model = model
        self.buf = b""
        self.transport: StampedTransport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: StampedTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def feed(self, data: bytes, now: float) -> None:
        """`now` is the kernel's arrival stamp (tuner.bench.stamped): when 256 requests land at
        once, a stamp taken by the loop would make the last one's receipt (and its whole
        schedule) late by the handling of the 255 before it, which would look like client error."""
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            method, path = head[0].split(" ")[:2]
            self.handle(method, path, body, now)

    def handle(self, method: str, path: str, body: bytes, now: float) -> None:
        assert self.transport is not None
        p = self.pacing
        if path == "/health":
            self.transport.write(_json_response("200 OK", {"status": "healthy"}))
        elif path == "/v1/models":
            self.transport.write(_json_response("200 OK", {"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "paced"}]}))
        elif path.startswith("/stats"):
            stats, p.stats = p.stats, ([] if "reset" in path else p.stats)
            self.transport.write(_json_response("200 OK", stats))
        elif path == "/config" and method == "POST":
            cfg = json.loads(body)
            p.ttft_s, p.itl_s = cfg["ttft_ms"] / 1000.0, cfg["itl_ms"] / 1000.0
            p.stats = []
            self.transport.write(_json_response("200 OK", cfg))
        elif path in ("/v1/chat/completions", "/v1/completions") and method == "POST":
            self.stream(json.loads(body), path.endswith("chat/completions"), now)
        else:
            self.transport.write(_json_response("404 Not Found", {"error": "not found"}))

    def stream(self, req: dict, chat: bool, receipt: float) -> None:
        assert self.transport is not None
        n = int(req.get("max_tokens") or req.get("max_completion_tokens") or 16)
        prompt = req["messages"][-1]["content"] if chat else req.get("prompt", "")
        prompt_tokens = len(str(prompt).split())
        p = self.pacing
        due = [receipt + p.ttft_s + i * p.itl_s for i in range(n)]
        writes: list[float] = []
        p.stats.append((receipt, due, writes))
        if chat:
            head = (b'{"id":"x","object":"chat.completion.chunk","model":"%s","choices":[{"index":0,'
                    b'"delta":{"content":" tok"},"finish_reason":null}]' % self.model.encode())
        else:
            head = (b'{"id":"x","object":"text_completion","model":"%s","choices":[{"index":0,'
                    b'"text":" tok","finish_reason":null}]' % self.model.encode())
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
        tail = ('{"id":"x","model":"%s","choices":[],"usage":%s}' % (self.model, json.dumps(usage))).encode()
        transport = self.transport
        transport.write(_OK_SSE)
        loop = asyncio.get_running_loop()
        mono_offset = loop.time() - time.perf_counter()  # call_at runs on the loop's clock
        perf = time.perf_counter

        def emit(i: int) -> None:
            if transport.is_closing():
                return
            t = perf()
            writes.append(t)
            event = b"data: %s,\"rcv_t\":%.9f,\"due_t\":%.9f,\"srv_t\":%.9f}\n\n" % (head, receipt, due[i], t)
            transport.write(b"%x\r\n%s\r\n" % (len(event), event))
            if i + 1 < n:
                self.timer = loop.call_at(due[i + 1] + mono_offset, emit, i + 1)
            else:
                self.timer = None
                event = b"data: " + tail + b"\n\ndata: [DONE]\n\n"
                transport.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))

        self.timer = loop.call_at(due[0] + mono_offset, emit, 0)


async def serve(host: str, port: int, ttft_ms: float, itl_ms: float, model: str) -> None:
    pacing = Pacing(ttft_ms / 1000.0, itl_ms / 1000.0)
    loop = asyncio.get_running_loop()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)  # stamp segments that arrive before accept
    listener.bind((host, port))
    listener.listen(4096)
    listener.setblocking(False)

    def accept() -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        conn.setblocking(False)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        StampedTransport(loop, conn, PacedProtocol(pacing, model))

    loop.add_reader(listener.fileno(), accept)
    await asyncio.Event().wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--model", default="paced")
    args = ap.parse_args()
    asyncio.run(serve(args.host, args.port, args.ttft_ms, args.itl_ms, args.model))


if __name__ == "__main__":
    main()
