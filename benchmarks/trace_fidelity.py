"""Does `tuner bench --trace` send each request when the trace says?

A seeded Poisson trace (default 1000 requests at 50 req/s, Mooncake-style JSONL) is replayed by
`tuner bench --trace ...` in a subprocess (tuner.commands.bench's parser and run(), what
`tuner.cli` dispatches to, called directly so the machine needs no optuna) against the paced
reference server (benchmarks/paced_server.py), which stamps each request's receipt with the
kernel's receive time.  The error of request i is its receipt offset minus its trace offset,
(rcv_i - rcv_0) - (t_i - t_0); a constant delivery delay cancels, so this is the replay's own
timing error.  Also shown: the same errors centred on their median (a late first request
shifts every error uncentred).

Usage: [taskset -c 0,1] python benchmarks/trace_fidelity.py [--rate 50] [--requests 1000]
[--repeat 3]  (server and client inherit the CPU set; the header prints it)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import requests

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from client_fidelity import free_port, start, stop, wait_health  # noqa: E402


def write_trace(path: Path, rate: float, n: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    t, stamps = 0.0, []
    with path.open("w") as fh:
        for _ in range(n):
            t += rng.expovariate(rate)
            stamps.append(t)
            fh.write(json.dumps({"timestamp": round(t * 1000.0, 6), "input_length": 32,
                                 "output_length": rng.randint(8, 24)}) + "\n")
    return stamps


def replay(url: str, trace: Path, out: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["bench", "--url", url, "--model", "paced", "--trace", str(trace), "--health-path", "",
            "--no-progress", "-o", str(out)]
    code = ("import argparse, sys; from tuner.commands import bench; "
            "p = argparse.ArgumentParser(prog='tuner'); bench.add_parser(p.add_subparsers()); "
            f"sys.exit(bench.run(p.parse_args({argv!r})))")
    cmd = [sys.executable, "-c", code]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, cwd=ROOT)


def errors_ms(url: str, stamps: list[float]) -> np.ndarray:
    stats = requests.get(url + "/stats?reset=1", timeout=30).json()
    receipts = sorted(r for r, _, _ in stats)[1:]  # the first is the warm-up request
    if len(receipts) != len(stamps):
        raise RuntimeError(f"server saw {len(receipts)} trace requests, trace has {len(stamps)}")
    rcv = np.asarray(receipts) - receipts[0]
    due = np.asarray(stamps) - stamps[0]
    return (rcv - due) * 1000.0


def summary(err: np.ndarray) -> str:
    a = np.abs(err)
    c = np.abs(err - np.median(err))
    return (f"|error| p50 {np.percentile(a, 50):.3f} p99 {np.percentile(a, 99):.3f} "
            f"max {a.max():.3f} ms; centred p99 {np.percentile(c, 99):.3f} ms; "
            f"mean {err.mean():+.3f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        tmpdir = Path(tmp)
        server = start([sys.executable, str(HERE / "paced_server.py"), "--port", str(port),
                        "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms)],
                       tmpdir / "server.log")
        try:
            wait_health(url)
            cpus = sorted(os.sched_getaffinity(0))
            print(f"CPUs {cpus} of {os.cpu_count()}, load average {os.getloadavg()[0]:.2f}; trace: "
                  f"{args.requests} requests, Poisson {args.rate:g} req/s; server TTFT "
                  f"{args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, 8-24 output tokens")
            allerr = []
            for i in range(args.repeat):
                stamps = write_trace(tmpdir / "trace.jsonl", args.rate, args.requests, i)
                replay(url, tmpdir / "trace.jsonl", tmpdir / f"out{i}.json")
                err = errors_ms(url, stamps)
                allerr.append(err)
                print(f"run {i} (seed {i}): {summary(err)}")
            print(f"all {args.repeat} runs: {summary(np.concatenate(allerr))}")
        finally:
            stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
