"""The launch command `tune` prints starts a server that answers /health and serves `tuner bench`.

CI has no GPU, so the printed command's head (the real server) is swapped for the simulator's,
as `--simulate` does for trials; every flag and variable after it is used as printed.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tuner.cli import main
from tuner.output.envfile import SERVER_ARGS_VAR, decode_server_args, parse

ROOT = Path(__file__).resolve().parents[1]
MODEL = str(ROOT / "models" / "llama-3.1-8b")
SERVER = "infinilm.server.inference_server"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
def test_printed_launch_command_serves_health_and_bench(tmp_path, capsys):
    studies = tmp_path / "studies"
    assert main(["tune", "--model", MODEL, "--simulate", "rtx4090", "--time-scale", "50",
                 "--trials", "6", "--study", "l", "--studies-dir", str(studies),
                 "--sampler", "random", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    printed = out.split("launch the server with it:\n", 1)[1].splitlines()[0].strip()
    best = parse((studies / "l" / "best.env").read_text())
    assert f"launch: {printed}" in (studies / "l" / "best.env").read_text()
    tokens = shlex.split(printed)
    env = {k: v for k, v in (t.split("=", 1) for t in tokens if "=" in t and not
                             t.startswith("-"))}
    cmd = tokens[len(env):]
    server_args = decode_server_args(best[SERVER_ARGS_VAR])
    assert cmd[cmd.index(SERVER) + 1:][6:] == server_args  # after --model M --host H --port P
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1" and "--enable-paged-attn" in server_args
    port = _free_port()
    sim = [sys.executable, "-m", "tuner.sim", "--gpu", "rtx4090", "--time-scale", "50",
           "--model", MODEL, "--host", "127.0.0.1", "--port", str(port), *server_args]
    proc = subprocess.Popen(sim, env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                assert health.status == 200
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
                time.sleep(0.2)
        result = tmp_path / "bench.json"
        assert main(["bench", "--url", f"http://127.0.0.1:{port}", "--model", "m",
                     "--concurrency", "2", "--input-len", "64", "--output-len", "16",
                     "--num-prompts", "4", "-o", str(result), "--no-progress"]) == 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    cells = json.loads(result.read_text())
    cells = cells if isinstance(cells, list) else [cells]
    assert sum(c["completed"] for c in cells) == 4 and all(c["failed"] == 0 for c in cells)
