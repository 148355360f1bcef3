"""A plain-TCP transport whose reads carry the kernel's arrival time (Linux SO_TIMESTAMPNS).

Even when stamping in `data_received`, a token's stamp waits for the event loop: at 256 streams a
wave of requests ending together keeps the loop busy for tens of ms, and first tokens that land
meanwhile would be stamped late, inflating TTFT.  The kernel stamps each segment as it arrives,
so a busy loop delays the parsing of a token but not its time.  The stamp is CLOCK_REALTIME;
it is moved onto the `perf_counter` clock with an offset sampled at the same read, so clock
slewing over a long cell does not accumulate.

Only the transport methods the HTTP connection uses are provided (write, abort, is_closing).
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from typing import Protocol

# Linux value; the socket module does not export it
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
SUPPORTED = sys.platform.startswith("linux")
_READ_SIZE = 1 << 18


class StampedProtocol(Protocol):
    def connection_made(self, transport: StampedTransport) -> None: ...
    def connection_lost(self, exc: Exception | None) -> None: ...
    def feed(self, data: bytes, arrival: float) -> None: ...


class StampedTransport:
    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: StampedProtocol
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._fd = sock.fileno()
        self._protocol = protocol
        self._out = bytearray()
        self._closed = False
        protocol.connection_made(self)
        loop.add_reader(self._fd, self._read)

    def _read(self) -> None:
        try:
            data, ancillary, _, _ = self._sock.recvmsg(_READ_SIZE, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        if not data:
            self._lose(None)
            return
        now = time.perf_counter()
        arrival = now
        for level, kind, raw in ancillary:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                sec, nsec = struct.unpack_from("qq", raw)
                # never later than now: guards a realtime clock stepped backwards mid-read
                arrival = min(now, sec + nsec * 1e-9 - (time.time() - now))
        self._protocol.feed(data, arrival)

    def write(self, data: bytes) -> None:
        if self._closed:
            return
        if self._out:
            self._out += data
            return
        try:
            sent = self._sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._lose(exc)
            return
        if sent < len(data):
            self._out += data[sent:]
            self._loop.add_writer(self._fd, self._write_ready)

    def _write_ready(self) -> None:
        try:
            sent = self._sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._lose(exc)
            return
        del self._out[:sent]
        if not self._out:
            self._loop.remove_writer(self._fd)

    def is_closing(self) -> bool:
        return self._closed

    def abort(self) -> None:
        self._lose(None)

    def _lose(self, exc: Exception | None) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)
        self._sock.close()
        self._protocol.connection_lost(exc)


async def open_stamped(host: str, port: int, protocol: StampedProtocol) -> StampedTransport:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    error: OSError | None = None
    for family, kind, proto, _, addr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            await loop.sock_connect(sock, addr)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return StampedTransport(loop, sock, protocol)
    raise error or OSError(f"cannot resolve {host}:{port}")
