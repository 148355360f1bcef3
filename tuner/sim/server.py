"""The simulated server's HTTP face: InfiniLM's OpenAI-style endpoints over aiohttp.

One asyncio task advances the engine to "now" in simulated time (wall clock x time_scale) every
~2 ms of wall time and wakes the request handlers, which send the tokens whose simulated time has
come (one SSE chunk per request per tick, listing each token's `sim_t`).  The engine waits, and
stamps arrivals, for requests a closed-loop client announced (tuner.sim.admission), so that wall
jitter does not become simulated time.  The simulated-time protocol (`/health` "sim",
`X-Tuner-Sim-Plan`, `X-Tuner-Sim-Arrival`, per-chunk `sim_t`) is in docs/architecture.md.

Failure behaves like InfiniLM's: after an out-of-memory forward the step loop is dead, /health
answers 503, in-flight streams hang without an error chunk and new requests are accepted and
hang.  Unlike InfiniLM, SIGTERM still exits promptly (handlers are cancelled after 0.5 s).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from tuner.sim import nvml
from tuner.sim.admission import PLAN_HEADER, Admission
from tuner.sim.engine import Engine, SimRequest
from tuner.sim.faults import ServerFaults
from tuner.sim.prefix_cache import token_block_hashes
from tuner.sim.prompts import chat_prompt_tokens, chat_prompt_words, completion_prompt_tokens

TICK_S = 0.002
SHUTDOWN_GRACE_S = 0.5


class SimServer:
    """Binds an `Engine` to the wall clock and serves it."""

    def __init__(self, engine: Engine, time_scale: float, model_name: str,
                 default_max_tokens: int, faults: ServerFaults | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.engine = engine
        self.time_scale = time_scale
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.faults, self.log = faults, log
        self._requests = 0
        self._wall0 = time.perf_counter()
        self._tick = asyncio.Condition()
        self.admission = Admission()
        self._held = 0      # bytes this process holds on the simulated card (TUNER_SIM_NVML)

    def sim_now(self) -> float:
        return (time.perf_counter() - self._wall0) * self.time_scale

    # ----- engine task ----------------------------------------------------------------------
    async def run_engine(self) -> None:
        """Advance the engine to the current simulated time, then wake the handlers; forever.
        After a step that finished requests it stops while their clients' next requests are
        due (tuner.sim.admission)."""
        while True:
            if not self.admission.holding():
                now = self.sim_now()
                while self.engine.failed is None:
                    done = self.engine.advance(now)
                    due = self._wall0 + self.engine.clock / self.time_scale
                    if not done or self.admission.finished([r.rid for r in done],
                                                           self.engine.clock, due):
                        break
                self._hold_memory()
            async with self._tick:
                self._tick.notify_all()
            await self.admission.wait(TICK_S)

    def _hold_memory(self) -> None:
        """On a simulated card, hold what the engine's allocator reserved so far, as a caching
        allocator does (the card's used memory only grows; a failed allocation adds nothing)."""
        path = nvml.sim_nvml_path()
        held = self.engine.peak_bytes if self.engine.failed is None else self._held
        if path is not None and held > self._held:
            nvml.add_process(path, os.getpid(), held)
            self._held = held

    async def _next_tick(self) -> None:
        async with self._tick:
            await self._tick.wait()

    # ----- endpoints ------------------------------------------------------------------------
    async def health(self, _: web.Request) -> web.Response:
        healthy = self.engine.failed is None
        if healthy and self.faults is not None and self.faults.health_flaps():
            self.log("sim fault: flap (/health answers 503 once)")
            healthy = False
        body = {"status": "healthy" if healthy else "unhealthy",
                "sim": {"time_scale": self.time_scale, "late_arrivals": self.admission.late}}
        return web.json_response(body, status=200 if healthy else 503)

    async def models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "tuner-sim"}]})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:  # noqa: PLR0911
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return _error(400, "request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        prompt = (chat_prompt_tokens(body.get("messages")) if chat
                  else completion_prompt_tokens(body.get("prompt", "")))
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") \
            or self.default_max_tokens
        if not isinstance(max_tokens, int) or max_tokens < 1:
            return _error(400, "max_tokens must be a positive integer")
        fault = self._fault()
        if fault == "http500":
            return _error(500, "simulated internal server error", "server_error")
        hashes: tuple[int, ...] = ()
        if chat and self.engine.cache.enabled:
            words = chat_prompt_words(body.get("messages")) + _text(max_tokens).split()
            hashes = tuple(token_block_hashes(words, self.engine.cfg.block_size))
        arrival, plan = self.admission.arrive(request.headers.get(PLAN_HEADER), self.sim_now())
        req = self.engine.submit(prompt, max_tokens, arrival, hashes)
        if req.error:
            return _error(400, req.error)
        self.admission.track(req.rid, plan)
        model = body.get("model") or self.model_name
        if body.get("stream"):
            return await self._stream(request, req, model, chat, fault)
        while not (req.finished and req.token_times[-1] <= self.sim_now()):
            await self._next_tick()
        text = _text(req.generated)
        choice: dict[str, Any] = ({"index": 0, "message": {"role": "assistant", "content": text},
                                   "finish_reason": "length"} if chat else
                                  {"index": 0, "text": text, "finish_reason": "length"})
        return web.json_response(
            {"id": f"sim-{req.rid}", "object": "chat.completion" if chat else "text_completion",
             "model": model, "choices": [choice], "usage": _usage(req),
             "sim_t": [round(t, 6) for t in req.token_times]},
            headers={"X-Tuner-Sim-Arrival": repr(req.arrival)})

    def _fault(self) -> str | None:
        """The injected fault of the request that just arrived (tuner.sim.faults), logged."""
        index, self._requests = self._requests, self._requests + 1
        if self.faults is None:
            return None
        fault = self.faults.request_fault(index)
        if fault is not None:
            self.log(f"sim fault: {fault} on request {index}")
        if index == self.faults.grab_at:
            self._grab_gpu()
        return fault

    def _grab_gpu(self) -> None:
        """A foreign process appears on the simulated GPU, in its own session: stopping this
        server does not stop it, it leaves by itself after `grab_s`."""
        path = nvml.sim_nvml_path()
        if path is None:
            self.log("sim fault: gpu_grab skipped (no TUNER_SIM_NVML card)")
            return
        assert self.faults is not None
        seconds, mib = self.faults.spec.opt("grab_s"), int(self.faults.spec.opt("grab_mib"))
        proc = subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"],
                                start_new_session=True, stdin=subprocess.DEVNULL)
        nvml.add_process(path, proc.pid, mib * 2**20)
        self.log(f"sim fault: gpu_grab by pid {proc.pid} ({mib} MiB for {seconds:g} s)")

    async def _stream(self, request: web.Request, req: SimRequest, model: str,
                      chat: bool, fault: str | None = None) -> web.StreamResponse:
        resp = web.StreamResponse(headers={
            "Content-Type": "text/event-stream", "Cache-Control": "no-cache",
            "X-Tuner-Sim-Arrival": repr(req.arrival)})
        await resp.prepare(request)
        try:
            return await self._stream_tokens(resp, req, model, chat, fault, request)
        finally:  # a cut, a client that hung up or a failed write: stop working for it
            self.engine.abort(req)

    async def _stream_tokens(self, resp: web.StreamResponse, req: SimRequest, model: str,
                             chat: bool, fault: str | None,
                             request: web.Request) -> web.StreamResponse:
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent = 0
        while not (req.finished and sent == req.generated):
            await self._next_tick()
            now = self.sim_now()
            ready = sent
            while ready < req.generated and req.token_times[ready] <= now:
                ready += 1
            if ready == sent:
                continue
            times = req.token_times[sent:ready]
            text = _text(ready - sent)
            choice = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if chat
                      else {"index": 0, "text": text, "finish_reason": None})
            await _send(resp, {"id": f"sim-{req.rid}", "object": kind, "model": model,
                               "choices": [choice], "sim_t": [round(t, 6) for t in times]})
            sent = ready
            if fault == "malformed":
                await resp.write(b'data: {"id": "sim-' + str(req.rid).encode() + b'", "cho\n\n')
                fault = None
            elif fault == "cut" and request.transport is not None:
                request.transport.close()  # no [DONE], no terminating chunk: a cut stream
                return resp
        end = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
               else {"index": 0, "text": "", "finish_reason": "length"})
        await _send(resp, {"id": f"sim-{req.rid}", "object": kind, "model": model,
                           "choices": [end], "usage": _usage(req)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def _text(n_tokens: int) -> str:
    """Generated text: one word per token, so a client that counts words counts tokens."""
    return " tok" * n_tokens


def _usage(req: SimRequest) -> dict[str, int]:
    return {"prompt_tokens": req.prompt_len, "completion_tokens": req.generated,
            "total_tokens": req.prompt_len + req.generated}


async def _send(resp: web.StreamResponse, payload: dict[str, Any]) -> None:
    await resp.write(b"data: " + json.dumps(payload).encode() + b"\n\n")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


def build_app(server: SimServer) -> web.Application:
    """The aiohttp application, with the engine task tied to its lifetime."""
    app = web.Application()

    async def engine_task(_: web.Application):
        task = asyncio.create_task(server.run_engine())
        yield
        task.cancel()

    app.cleanup_ctx.append(engine_task)
    app.router.add_get("/health", server.health)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/completions", server.completions)
    return app


def serve(server: SimServer, host: str, port: int,
          ready: Callable[[], None] = lambda: None) -> None:
    """Serve until SIGINT/SIGTERM; in-flight (possibly hung) handlers get `SHUTDOWN_GRACE_S`.
    `ready()` runs once the port is bound (a bind failure raises OSError instead)."""
    web.run_app(build_app(server), host=host, port=port, shutdown_timeout=SHUTDOWN_GRACE_S,
                print=lambda _: ready(), access_log=None, handler_cancellation=True)

