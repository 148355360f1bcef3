"""Does `tuner bench --trace` send each request when the trace says?

A seeded Poisson trace (default 1000 requests at 50 req/s, Mooncake-style JSONL) is replayed by
`tuner bench --trace ...` in a subprocess (tuner.commands.bench's parser and run(), what
`tuner.cli` dispatches to, called directly so the machine needs no optuna) against the paced
reference server (benchmarks/paced_server.py), which stamps each request's receipt with the
kernel's receive time.  The error of request i is its receipt offset minus its trace offset,
(rcv_i - rcv_0) - (t_i - t_0); a constant delivery delay cancels, so this is the replay's own
timing error.  Also shown: the same errors centred on their median (a late first request
shifts every error uncentred).

The machine's other processes decide much of the tail, so each run also prints what the client
got of the CPU: its run-queue wait (time it was ready to run but waited for a core, from
/proc/PID/schedstat) against its CPU time, and the machine's CPU pressure over the run
(/proc/pressure/cpu "some": the share of time at least one task waited for a core).
`--baseline REF` replays with the `tuner` package of git ref REF as well, alternating run by run
with the working tree's on the same traces, so both see the same load.

Usage: [taskset -c 0,1] python benchmarks/trace_fidelity.py [--rate 50] [--requests 1000]
[--repeat 3] [--baseline main]  (server and client inherit the CPU set; the header prints it)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
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


def replay(url: str, trace: Path, out: Path, code_root: Path) -> dict[str, float]:
    """Run `tuner bench --trace` with the `tuner` package under `code_root`; -> its main
    thread's CPU and run-queue wait over the bench run, seconds."""
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    argv = ["bench", "--url", url, "--model", "paced", "--trace", str(trace), "--health-path", "",
            "--no-progress", "-o", str(out)]
    code = ("import argparse, json, sys, time; from tuner.commands import bench; "
            "p = argparse.ArgumentParser(prog='tuner'); bench.add_parser(p.add_subparsers()); "
            f"a = p.parse_args({argv!r}); "
            "st = lambda: [int(x) / 1e9 for x in open('/proc/thread-self/schedstat').read()"
            ".split()[:2]] + [time.perf_counter()]; "
            "s0 = st(); rc = bench.run(a); s1 = st(); "
            "print('SCHED ' + json.dumps([b - a for a, b in zip(s0, s1)])); sys.exit(rc)")
    cmd = [sys.executable, "-c", code]
    done = subprocess.run(cmd, check=True, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    line = next(x for x in done.stdout.splitlines() if x.startswith("SCHED "))
    cpu, wait, wall = json.loads(line[6:])
    return {"cpu_s": cpu, "wait_s": wait, "wall_s": wall}


def cpu_pressure_us() -> int | None:
    """The machine's cumulative CPU "some" pressure stall, microseconds (None without PSI)."""
    try:
        first = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return int(first.rsplit("total=", 1)[1])


def baseline_tree(ref: str, dest: Path) -> Path:
    """The `tuner` package as of git ref `ref`, exported under `dest`; a directory that holds a
    `tuner` package is taken as it is."""
    if (Path(ref) / "tuner").is_dir():
        return Path(ref)
    dest.mkdir()
    archive = subprocess.run(["git", "archive", ref, "tuner"], check=True, cwd=ROOT,
                             stdout=subprocess.PIPE).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def cpu_summary(sched: dict[str, float], psi: float | None) -> str:
    wanted = sched["cpu_s"] + sched["wait_s"]
    share = f"{100 * sched['wait_s'] / wanted:.1f}%" if wanted else "-"
    pressure = f"{100 * psi:.1f}%" if psi is not None else "n/a"
    return (f"client CPU {sched['cpu_s']:.2f} s, run-queue wait {sched['wait_s'] * 1e3:.0f} ms "
            f"({share} of the time it wanted a core); machine CPU pressure {pressure}; "
            f"load {os.getloadavg()[0]:.2f}")


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


def run_all(args: argparse.Namespace, url: str, tmpdir: Path) -> None:
    trees = [("this tree", ROOT)]
    if args.baseline:
        trees.insert(0, (f"baseline {args.baseline}",
                         baseline_tree(args.baseline, tmpdir / "baseline")))
    errs: dict[str, list[np.ndarray]] = {label: [] for label, _ in trees}
    for i in range(args.repeat):
        stamps = write_trace(tmpdir / "trace.jsonl", args.rate, args.requests, i)
        for label, root in trees:
            psi0, w0 = cpu_pressure_us(), time.perf_counter()
            sched = replay(url, tmpdir / "trace.jsonl", tmpdir / f"out{i}.json", root)
            psi1, wall = cpu_pressure_us(), time.perf_counter() - w0
            err = errors_ms(url, stamps)
            errs[label].append(err)
            psi = (psi1 - psi0) / 1e6 / wall if psi0 is not None and psi1 is not None else None
            print(f"run {i} (seed {i}) {label}: {summary(err)}\n    {cpu_summary(sched, psi)}",
                  flush=True)
    for label, runs in errs.items():
        print(f"all {args.repeat} runs, {label}: {summary(np.concatenate(runs))}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--ttft-ms", type=float, default=20.0)
    ap.add_argument("--itl-ms", type=float, default=10.0)
    ap.add_argument("--baseline", metavar="REF",
                    help="also replay with the tuner package of this git ref (or of this "
                         "directory), run by run")
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
            run_all(args, url, tmpdir)
        finally:
            stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
