"""Incremental Server-Sent Events parser that works on raw network bytes.

Network reads split events anywhere: inside a line, inside a CRLF pair, inside a multi-byte UTF-8
character.  Lines are therefore cut on bytes (a newline byte never occurs inside a UTF-8 sequence)
and decoded only once complete, so no decoder state is needed.  The per-read cost is a few
`bytes.find` calls: at high concurrency the client must not spend its time here.
"""

from __future__ import annotations


class SSEParser:
    """Feed bytes, get back the `data` payload of every event they complete.

    Only `data:` fields matter to OpenAI-compatible streams; `event:`, `id:`, `retry:` and comment
    lines (keep-alives starting with ':') are skipped.  Multi-line data is joined with '\\n' as the
    SSE spec says.
    """

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk if self._buf else chunk
        events: list[str] = []
        start = 0
        while True:
            nl = buf.find(b"\n", start)
            if nl < 0:
                # a lone trailing CR may be the first half of a CRLF: keep it for the next read
                break
            end = nl - 1 if nl > start and buf[nl - 1] == 13 else nl
            self._line(buf[start:end], events)
            start = nl + 1
        self._buf = buf[start:]
        return events

    def close(self) -> list[str]:
        """End of stream: a final event without its blank line still counts (lenient servers)."""
        events: list[str] = []
        if self._buf:
            self._line(self._buf.rstrip(b"\r"), events)
            self._buf = b""
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: bytes, events: list[str]) -> None:
        if not line:
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
            return
        if line.startswith(b"data:"):
            value = line[5:]
            if value[:1] == b" ":
                value = value[1:]
            self._data.append(value.decode("utf-8", errors="replace"))
        # other fields and ':' comments carry nothing we use
