"""The streaming client against raw HTTP bytes: framing a real server may use, cut anywhere."""

import asyncio
import json

import pytest

from tuner.bench.client import StreamClient
from tuner.bench.records import RequestRecord


def sse(*events: str) -> bytes:
    return b"".join(f"data: {e}\n\n".encode() for e in events)


CHAT = sse(
    '{"choices":[{"delta":{"role":"assistant","content":""}}]}',        # role only: no token
    '{"choices":[{"delta":{"content":"\\"quoted"}}]}',
    '{"choices":[{"delta":{"content": "spaced"}}]}',
    '{"choices":[{"delta":{"content":null}}]}',                           # no token
    '{"choices":[{"delta":{"reasoning_content":"think"}}]}',
    '{"choices":[{"delta":{"content":"error"}}]}',                         # word "error" in text
    '{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":4}}',
    "[DONE]",
)


def chunked(body: bytes, size: int) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


async def serve_raw(responses: list[bytes], cut: int):
    """A server that answers each request on a connection with the next canned response,
    written `cut` bytes at a time so every framing boundary lands mid-read somewhere."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for resp in responses:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            for i in range(0, len(resp), cut):
                writer.write(resp[i:i + cut])
                await writer.drain()
                await asyncio.sleep(0)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def run_requests(responses: list[bytes], cut: int, api: str = "chat") -> list[RequestRecord]:
    async def main() -> list[RequestRecord]:
        server, url = await serve_raw(responses, cut)
        client = StreamClient(url, model_name="m", api=api)
        try:
            records = []
            for _ in responses:
                rec = RequestRecord(send_time=0.0)
                await client.request(client.prepare("hello", 4), rec)
                records.append(rec)
            return records
        finally:
            client.close()
            server.close()

    return asyncio.run(main())


@pytest.mark.parametrize("cut", [1, 3, 7, 64, 4096])
def test_chunked_keepalive_responses_split_anywhere(cut):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    resp = head + chunked(CHAT, 37)
    records = run_requests([resp, resp], cut)  # the second one reuses the connection
    for rec in records:
        assert rec.ok, rec.error
        assert len(rec.token_times) == 4
        assert (rec.prompt_tokens, rec.completion_tokens) == (11, 4)


@pytest.mark.parametrize("cut", [5, 4096])
def test_content_length_and_close_delimited_bodies(cut):
    body = sse('{"choices":[{"text":"a"}]}', '{"choices":[{"text":""}]}', '{"choices":[{"text":"b"}]}',
               "[DONE]")
    sse_type = b"Content-Type: text/event-stream; charset=utf-8\r\n"
    with_length = b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (sse_type, len(body), body)
    [rec] = run_requests([with_length], cut, api="completions")
    assert rec.ok and len(rec.token_times) == 2
    close_delimited = b"HTTP/1.1 200 OK\r\n" + sse_type + b"Connection: close\r\n\r\n" + body
    [rec] = run_requests([close_delimited], cut, api="completions")
    assert rec.ok and len(rec.token_times) == 2


def test_http_error_keeps_status_and_body():
    body = json.dumps({"detail": "ignore_eos: extra fields not permitted"}).encode()
    resp = b"HTTP/1.1 422 Unprocessable Entity\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    [rec] = run_requests([resp], 4096)
    assert rec.error_class == "http_error" and "422" in rec.error and "ignore_eos" in rec.error


def test_body_fields_and_none_removes_a_default():
    client = StreamClient("http://127.0.0.1:1/v1/chat/completions", model_name="m",
                          request_extra={"ignore_eos": True, "stream_options": None})
    body = client.body("hi", 7)
    assert body["ignore_eos"] is True and "stream_options" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["max_tokens"] == 7
    assert client.path == "/v1/chat/completions" and client.pool.prefix == ""


def test_stale_keepalive_connection_is_retried_once_on_a_fresh_one():
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    resp = head + chunked(CHAT, 64)
    connections = []

    async def main() -> list[RequestRecord]:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            connections.append(writer)
            answers = 1 if len(connections) == 1 else 2
            for _ in range(answers):
                head_bytes = await reader.readuntil(b"\r\n\r\n")
                length = int(head_bytes.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                writer.write(resp)
                await writer.drain()
            await reader.readuntil(b"\r\n\r\n")  # first connection: a request it never answers
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = StreamClient(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", model_name="m")
        try:
            records = [RequestRecord(0.0), RequestRecord(0.0)]
            for rec in records:
                await client.request(client.prepare("hello", 4), rec)
            return records
        finally:
            client.close()
            server.close()

    records = asyncio.run(main())
    assert [r.ok for r in records] == [True, True] and len(connections) == 2


def test_malformed_response_fails_the_request_at_once():
    [rec] = run_requests([b"HTTP/1.1 abc\r\n\r\n"], 4096)
    assert rec.error_class == "connection" and "malformed" in rec.error
