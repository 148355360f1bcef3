"""A tiny OpenAI-compatible streaming server for the bench tests, in its own thread and loop.

Its behaviour is set per test: token pacing, simulated-time fields, refusing requests, or
hanging mid-stream with /health turning 503 (InfiniLM's silent engine death).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class Behaviour:
    tokens: int = 4
    itl_s: float = 0.001
    sim_time: bool = False        # send X-Tuner-Sim-Arrival and sim_t lists
    status: int = 200             # != 200: refuse every completion request
    hang_after: int | None = None  # stop sending after this many tokens, forever
    unhealthy_after_s: float = 0.3  # once a stream hangs, /health is 503 this much later
    error_after: int | None = None  # send data: {"error": ...} after this many tokens
    bodies: list = field(default_factory=list)


class FakeServer:
    def __init__(self, behaviour: Behaviour) -> None:
        self.b = behaviour
        self.healthy = True
        self.loop = asyncio.new_event_loop()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(5)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()

    async def _stop(self) -> None:
        await self._runner.cleanup()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _health(self, request: web.Request) -> web.Response:
        body = {"status": "healthy" if self.healthy else "unhealthy"}
        if self.b.sim_time:
            body["sim"] = {"time_scale": 10.0}
        return web.json_response(body, status=200 if self.healthy else 503)

    async def _turn_unhealthy(self) -> None:
        await asyncio.sleep(self.b.unhealthy_after_s)
        self.healthy = False

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.b.bodies.append(body)
        if self.b.status != 200:
            return web.json_response({"detail": "unknown field"}, status=self.b.status)
        headers = {"Content-Type": "text/event-stream"}
        if self.b.sim_time:
            headers["X-Tuner-Sim-Arrival"] = "100.0"
        resp = web.StreamResponse(headers=headers)
        await resp.prepare(request)
        chat = request.path.endswith("chat/completions")
        for i in range(self.b.tokens):
            if self.b.hang_after is not None and i == self.b.hang_after:
                asyncio.ensure_future(self._turn_unhealthy())
                await asyncio.sleep(3600)
            if self.b.error_after is not None and i == self.b.error_after:
                await resp.write(b'data: {"error": {"message": "engine died"}}\n\n')
                return resp
            await asyncio.sleep(self.b.itl_s)
            choice = {"index": 0, "delta": {"content": f"t{i}"}} if chat else {"index": 0, "text": f"t{i}"}
            chunk: dict = {"choices": [choice]}
            if self.b.sim_time:
                chunk["sim_t"] = [100.5 + 0.1 * i]
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": 7, "completion_tokens": self.b.tokens, "total_tokens": 7 + self.b.tokens}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
        return resp
