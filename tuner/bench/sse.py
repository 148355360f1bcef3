"""Incremental Server-Sent Events parser that works on raw network bytes.

Network reads split events anywhere: inside a line, inside a CRLF pair, inside a multi-byte UTF-8
character.  Lines are therefore cut on bytes (a newline byte never occurs inside a UTF-8 sequence)
and decoded only once complete, so no decoder state is needed.  The per-read cost is one
`bytes.split` and a short loop: at high concurrency the client must not spend its time here.
Bytes that are not UTF-8 and lines that are no SSE field raise `ValueError`: the SSE spec would
skip such lines, but from an OpenAI-compatible server they mean a broken stream, and a skipped
line may have been a token.
"""

from __future__ import annotations

_OTHER_FIELDS = (b"event", b"id", b"retry", b"data")


class SSEParser:
    """Feed bytes, get back the `data` payload of every event they complete.

    Only `data:` fields matter to OpenAI-compatible streams; `event:`, `id:`, `retry:` and comment
    lines (keep-alives starting with ':') are skipped; any other line raises `ValueError`.
    Multi-line data is joined with '\\n' as the SSE spec says.
    """

    __slots__ = ("_buf", "_data")

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk if self._buf else chunk
        lines = buf.split(b"\n")
        # the last piece has no newline yet (b"" when the read ended on one); a lone trailing CR
        # in it may be the first half of a CRLF, so it waits too
        self._buf = lines.pop()
        events: list[str] = []
        data = self._data
        for line in lines:
            if line[-1:] == b"\r":
                line = line[:-1]
            if not line:
                if data:
                    events.append(data[0] if len(data) == 1 else "\n".join(data))
                    data.clear()
            elif line[:5] == b"data:":
                value = line[6:] if line[5:6] == b" " else line[5:]
                try:
                    data.append(value.decode("utf-8"))
                except UnicodeDecodeError as exc:
                    raise ValueError(f"invalid UTF-8 in a data line ({exc.reason} at byte "
                                     f"{exc.start})") from None
            elif line[:1] != b":" and line.split(b":", 1)[0] not in _OTHER_FIELDS:
                raise ValueError(f"line is no SSE field: {line[:100].decode('utf-8', 'replace')}")
            # other fields and ':' comments carry nothing we use
        return events

    def close(self) -> list[str]:
        """End of stream: a final event without its blank line still counts (lenient servers)."""
        return self.feed(b"\n\n") if self._buf or self._data else []
