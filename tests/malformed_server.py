"""An OpenAI-compatible streaming server whose streams break the protocol in one chosen way.

Run as its own process on 127.0.0.1 (by the tests, or by `tuner tune` through a search space):
`python tests/malformed_server.py --port P [--kind KIND] [--itl-ms MS]`.  A request whose `model`
names a kind gets that kind (one process serves every kind to the per-request tests).
Raw asyncio streams rather than a web framework, so that it can write any bytes at all.  Every
broken kind streams faster than `good` (no pacing), as the broken server of issue 20 did: if its
requests were counted, it would look like the best config.
"""

from __future__ import annotations

import argparse
import asyncio
import json

# kind -> what the stream does wrong (good: nothing)
KINDS = {
    "good": "a correct stream, paced at --itl-ms",
    "truncated_json": "every other chunk cut short mid-JSON",
    "non_json": "a `data:` line that is not JSON between the chunks",
    "no_data_prefix": "chunks written without the `data:` field name",
    "no_done": "ends (cleanly framed) without [DONE] and without a finish_reason",
    "usage_inflated": "usage claims 10x the tokens streamed (beyond max_tokens)",
    "usage_short": "usage claims fewer tokens than the chunks streamed",
    "after_done": "a token chunk after data: [DONE]",
    "error_event": 'data: {"error": ...} mid-stream (transformers serve on an engine error)',
    "not_sse": "HTTP 200 with a JSON body (Content-Type application/json)",
    "cut": "the connection closed mid-stream (no terminal chunk)",
    "empty_choices": "chunks with an empty choices list and no usage",
    "bad_utf8": "generated text with bytes that are not UTF-8",
    "issue20": "issue 20's server: truncated chunks, non-JSON lines, usage supplying the count",
}


def chunk(i: int, text: str = " tok", finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    return json.dumps({"id": "x", "object": "chat.completion.chunk", "choices": [choice],
                       "n": i}).encode()


def usage(prompt: int, completion: int) -> bytes:
    return json.dumps({"id": "x", "choices": [], "usage": {
        "prompt_tokens": prompt, "completion_tokens": completion,
        "total_tokens": prompt + completion}}).encode()


def events(kind: str, n: int) -> list[bytes]:
    """The raw lines (each ends an event with a blank line unless the kind says otherwise)."""
    out = []
    for i in range(n):
        data = chunk(i, finish="length" if i == n - 1 and kind != "no_done" else None)
        if kind in ("truncated_json", "issue20") and i % 2:
            data = data[: len(data) // 2]
        if kind == "bad_utf8" and i == n // 2:
            data = data.replace(b" tok", b" t\xff\xfeok")
        if kind == "empty_choices":
            data = json.dumps({"id": "x", "choices": []}).encode()
        out.append(data if kind == "no_data_prefix" else b"data: " + data)
        if kind in ("non_json", "issue20") and i == n // 2:
            out.append(b"data: tok")
        if kind == "error_event" and i == n // 2:
            out.append(b'data: {"error": {"message": "engine died", "type": "server_error"}}')
    claimed = {"usage_inflated": 10 * n, "usage_short": n - 1, "issue20": n}.get(kind, n)
    if kind != "no_done":
        out.append(b"data: " + usage(7, claimed))
        out.append(b"data: [DONE]")
    if kind == "after_done":
        out.append(b"data: " + chunk(n))
    return [line + b"\n\n" for line in out]


def framed(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def respond(writer: asyncio.StreamWriter, kind: str, n: int, itl_s: float) -> bool:
    """Write one response; False when the connection must close after it."""
    if kind == "not_sse":
        body = json.dumps({"choices": [{"index": 0, "message": {"content": " tok" * n}}]}).encode()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        return True
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    lines = events(kind, n)
    for i, line in enumerate(lines):
        if kind == "cut" and i == n // 2:
            await writer.drain()
            return False
        writer.write(framed(line))
        await writer.drain()
        if kind == "good":
            await asyncio.sleep(itl_s)
    writer.write(b"0\r\n\r\n")
    return True


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, kind: str,
                 itl_s: float) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *header_lines = head.decode("latin-1").split("\r\n")
            headers = dict(h.lower().split(": ", 1) for h in header_lines if ": " in h)
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            if request_line.startswith("GET /health"):
                payload = b'{"status":"healthy"}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
                await writer.drain()
                continue
            request = json.loads(body)
            n = int(request.get("max_tokens") or 16)
            chosen = request.get("model") if request.get("model") in KINDS else kind
            if not await respond(writer, chosen, n, itl_s):
                break
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def serve(port: int, kind: str, itl_s: float) -> None:
    server = await asyncio.start_server(lambda r, w: handle(r, w, kind, itl_s), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--kind", choices=sorted(KINDS), default="good")
    ap.add_argument("--itl-ms", type=float, default=2.0, help="pacing of the good kind")
    ap.add_argument("--model", help="accepted and ignored (the tuner passes one)")
    args = ap.parse_args()
    asyncio.run(serve(args.port, args.kind, args.itl_ms / 1000.0))


if __name__ == "__main__":
    main()
