"""How accurate is our load generator?  Measure a server whose timing is known exactly.

`benchmarks/paced_server.py` (a separate process, so it never shares the client's event loop)
emits token i of each request at receipt + TTFT + i * ITL and stamps its real write times.  For
each cell we compare three views of the same requests:
  intended  the schedule (exact TTFT / ITL),
  server    what the server really did (its write stamps): server lateness = server - intended,
  client    what `tuner.bench.runner` measured: client error = client - server.
Pass: |ITL| and |TPOT| client error < 1 %, |TTFT| client error < 2 ms (means).  Then a sweep at
concurrency 256 with shrinking ITL finds the highest streamed tokens/s the client sustains while
passing, and GuideLLM (an external process) measures two cells (concurrency 1 and 64) for a
side-by-side comparison: one GuideLLM worker process, the paced server pinned to its own CPU and
both clients to the others (see benchmarks/README.md for why, and what that did and did not fix).

Run: PYTHONPATH=. python benchmarks/client_fidelity.py [--guidellm PATH] [--out benchmarks/out]
     [--guidellm-only] [--guidellm-workers N] [--no-pin]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import requests

from tuner.bench.metrics import cell_metrics
from tuner.bench.records import Cell, RequestRecord, Warmup
from tuner.bench.runner import CellResult, run_cells_async

HERE = Path(__file__).resolve().parent
ITL_TOL = 0.01
TTFT_TOL_MS = 2.0
GUIDELLM_TOL = 0.05
SERVER_PID = [0]  # the paced server's pid, for printing its CPU affinity


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv: list[str], log: Path) -> subprocess.Popen:
    """Own process group, so a finally can kill the whole tree."""
    with log.open("w") as fh:
        return subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(3)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def wait_health(url: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy")


def server_view(url: str, out_len: int, raw: list | None = None
                ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """-> (server-actual metrics, intended metrics, lateness stats) from the server's stamps of
    the cell's requests (warm-up requests, shorter, are left out); `raw` gets the stamps."""
    stats = [s for s in requests.get(url + "/stats?reset=1", timeout=30).json() if len(s[1]) == out_len]
    if raw is not None:
        raw.extend(stats)
    actual = [RequestRecord(r, w, completion_tokens=len(w)) for r, d, w in stats if w]
    intended = [RequestRecord(r, d[: len(w)], completion_tokens=len(w)) for r, d, w in stats if w]
    span = max(w[-1] for _, _, w in stats if w) - min(r for r, _, _ in stats)
    late = sorted((wt - dt) * 1000.0 for _, d, w in stats for wt, dt in zip(w, d))
    lateness = {"mean": sum(late) / len(late), "p99": late[int(0.99 * (len(late) - 1))], "max": late[-1]}
    return cell_metrics(actual, span), cell_metrics(intended, span), lateness


class Probe:
    """Reads the reference server's stamps out of every event the client parses (on_event hook):
    per token, client stamp - server write = the client's receive lag (plus loopback transit);
    per request, server receipt - client send stamp = request delivery (kernel + server accept)."""

    def __init__(self) -> None:
        self.lag_ms: list[float] = []
        self.delivery_ms: dict[int, float] = {}

    def __call__(self, record: RequestRecord, data: str, arrival: float) -> None:
        i = data.find('"rcv_t":')
        if i < 0:
            return
        # fixed layout written by paced_server: ,"rcv_t":R,"due_t":D,"srv_t":S}  (cheap to slice)
        rcv, _, srv = (float(part.split(":", 1)[1]) for part in data[i:-1].split(","))
        self.lag_ms.append((arrival - srv) * 1000.0)
        if id(record) not in self.delivery_ms:
            self.delivery_ms[id(record)] = (rcv - record.send_time) * 1000.0


def _mean_p99(values: list[float]) -> tuple[float, float]:
    v = sorted(values)
    return (sum(v) / len(v), v[int(0.99 * (len(v) - 1))]) if v else (float("nan"), float("nan"))


def run_cell(url: str, cell: Cell, seed: int, probe: Probe | None = None) -> CellResult:
    # the warm-up opens `concurrency` keep-alive connections, as in a long-running trial
    [res] = asyncio.run(run_cells_async(url, [cell], model_name="paced", health_url=url + "/health", seed=seed,
                                        warmup=Warmup(cell.concurrency, 8, 2), on_event=probe))
    return res


def measure(url: str, conc: int, ttft_ms: float, itl_ms: float, out_len: int, num: int) -> dict[str, Any]:
    requests.post(url + "/config", json={"ttft_ms": ttft_ms, "itl_ms": itl_ms}, timeout=5)  # also resets stats
    probe = Probe()
    res = run_cell(url, Cell(conc, 16, out_len, num), 1, probe)
    srv, intended, late = server_view(url, out_len)
    cli = res.metrics
    lag_mean, lag_p99 = _mean_p99(probe.lag_ms)
    dlv_mean, dlv_p99 = _mean_p99(list(probe.delivery_ms.values()))
    row = {
        "conc": conc, "ttft_ms": ttft_ms, "itl_ms": itl_ms, "out": out_len, "num": num,
        "errors": res.error_class, "completed": cli["completed"],
        "late_mean_ms": late["mean"], "late_p99_ms": late["p99"],
        "lag_mean_ms": lag_mean, "lag_p99_ms": lag_p99, "delivery_mean_ms": dlv_mean, "delivery_p99_ms": dlv_p99,
        "srv_ttft": srv["mean_ttft_ms"], "cli_ttft": cli["mean_ttft_ms"],
        "srv_ttft_p99": srv["p99_ttft_ms"], "cli_ttft_p99": cli["p99_ttft_ms"],
        "srv_itl": srv["mean_itl_ms"], "cli_itl": cli["mean_itl_ms"],
        "srv_itl_p99": srv["p99_itl_ms"], "cli_itl_p99": cli["p99_itl_ms"],
        "srv_tpot": srv["mean_tpot_ms"], "cli_tpot": cli["mean_tpot_ms"],
        "int_itl": intended["mean_itl_ms"], "int_ttft": intended["mean_ttft_ms"],
        "srv_tok_s": srv["output_throughput"], "cli_tok_s": cli["output_throughput"],
    }
    row["ttft_err_ms"] = row["cli_ttft"] - row["srv_ttft"]
    row["itl_err"] = row["cli_itl"] / row["srv_itl"] - 1
    row["tpot_err"] = row["cli_tpot"] / row["srv_tpot"] - 1
    row["pass"] = (res.error_class is None and cli["completed"] == num and abs(row["ttft_err_ms"]) < TTFT_TOL_MS
                   and abs(row["itl_err"]) < ITL_TOL and abs(row["tpot_err"]) < ITL_TOL)
    return row


def print_accuracy(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n== {title}  (ms; err = client - server)")
    print("  conc ITL set   tok/s | srv late mean/p99 | TTFT srv -> cli   err  = delivery + cli lag (p99) "
          "| ITL srv -> cli     err   | TPOT srv -> cli     err   | ITL p99 srv/cli | pass")
    for r in rows:
        print(f"  {r['conc']:4d} {r['itl_ms']:6.2f} {r['cli_tok_s']:7.0f} | {r['late_mean_ms']:6.3f} /{r['late_p99_ms']:7.3f}"
              f"  | {r['srv_ttft']:6.2f} -> {r['cli_ttft']:6.2f} {r['ttft_err_ms']:+6.3f} = {r['delivery_mean_ms']:6.3f}"
              f" + {r['lag_mean_ms']:6.3f} ({r['lag_p99_ms']:6.3f})"
              f" | {r['srv_itl']:6.3f} -> {r['cli_itl']:6.3f} {100 * r['itl_err']:+6.3f}%"
              f" | {r['srv_tpot']:6.3f} -> {r['cli_tpot']:6.3f} {100 * r['tpot_err']:+6.3f}%"
              f" | {r['srv_itl_p99']:6.2f}/{r['cli_itl_p99']:6.2f} | {'PASS' if r['pass'] else 'FAIL'}")


def word_tokenizer(out: Path) -> Path:
    """A one-token-per-word tokenizer that transformers' AutoTokenizer loads offline, so GuideLLM
    needs no hub: the paced server counts words too."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from tuner.bench.prompts import _WORDS
    vocab = {"[UNK]": 0}
    for w in _WORDS:
        vocab.setdefault(w, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")
    d = out / "word-tokenizer"
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 10**6}))
    return d


def guidellm(exe: str, url: str, conc: int, in_len: int, out_len: int, num: int, out: Path,
             workers: int = 1) -> dict[str, float]:
    tok = word_tokenizer(out)
    result = out / "guidellm.json"
    argv = [exe, "run", "--backend", f"kind=openai_http,target={url},model=paced,http2=false",
            "--profile", f"kind=concurrent,streams={conc}", "--constraint", f"kind=max_requests,count={num}",
            "--data", f"kind=synthetic_text,prompt_tokens={in_len},output_tokens={out_len}",
            "--tokenizer", f"kind=huggingface_auto,model={tok}", "--output", f"kind=json,path={result}",
            "--disable-progress"]
    # GuideLLM 0.8.1 starts min(streams, GUIDELLM__MAX_WORKER_PROCESSES = 10) worker processes
    # (guidellm/settings.py, scheduler/worker_group.py) besides its main and DataLoader processes:
    # at concurrency 64 on 2 cores those 12 processes starved the paced server (its own stamps
    # showed TTFT 34.7 ms against 22.4 ms when our client ran).  One worker runs all streams on
    # one asyncio loop, as our client does.
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1",
               GUIDELLM__MAX_WORKER_PROCESSES=str(workers))
    log = out / "guidellm.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(600)
        finally:
            stop(proc)
    if rc != 0:
        raise RuntimeError(f"guidellm exited {rc}; see {log}")
    bench = json.loads(result.read_text())["benchmarks"][0]
    m = bench["metrics"]
    ok = lambda k: m[k]["successful"]  # noqa: E731
    timings = [r["info"]["timings"] for r in bench["requests"]["successful"]]
    return {
        # wall-clock (time.time) means over requests: GuideLLM's TTFT runs from request_start (its
        # first header write) to first_token_iteration; set against the server's stamps they split
        # its TTFT excess into delivery (before the server's receipt) and receive lag (after its write)
        "wall_request_start": sum(t["request_start"] for t in timings) / len(timings),
        "wall_first_token": sum(t["first_token_iteration"] for t in timings) / len(timings),
        "mean_ttft_ms": ok("time_to_first_token_ms")["mean"],
        "median_ttft_ms": ok("time_to_first_token_ms")["median"],
        "p99_ttft_ms": ok("time_to_first_token_ms")["percentiles"]["p99"],
        # GuideLLM's "ITL" is per request (latency - TTFT) / (tokens - 1): vllm's TPOT
        "mean_tpot_ms": ok("inter_token_latency_ms")["mean"],
        "median_tpot_ms": ok("inter_token_latency_ms")["median"],
        "output_throughput": ok("output_token_count")["total_sum"] / bench["duration"],
        "completed": ok("output_token_count")["count"],
    }


def compare_guidellm(exe: str, url: str, conc: int, itl_ms: float, out_len: int, num: int, out: Path,
                     workers: int = 1) -> bool:
    """Same server, same cell, one tool after the other; each run is also checked against the
    server's own stamps, which says whose number is off when the two disagree."""
    requests.post(url + "/config", json={"ttft_ms": 20.0, "itl_ms": itl_ms}, timeout=5)
    mine = run_cell(url, Cell(conc, 16, out_len, num), 2)
    srv_mine, _, _ = server_view(url, out_len)
    theirs = guidellm(exe, url, conc, 16, out_len, num, out, workers)
    raw: list = []
    srv_theirs, _, _ = server_view(url, out_len, raw)
    wall_minus_mono = time.time() - time.perf_counter()  # server stamps are perf_counter (CLOCK_MONOTONIC)
    gl_delivery = (sum(r for r, _, _ in raw) / len(raw) + wall_minus_mono - theirs["wall_request_start"]) * 1e3
    gl_lag = (theirs["wall_first_token"] - sum(w[0] for _, _, w in raw) / len(raw) - wall_minus_mono) * 1e3
    print(f"\n== GuideLLM vs ours, same server and cell: concurrency {conc}, output {out_len}, "
          f"{num} requests, TTFT 20 ms, ITL {itl_ms} ms; GuideLLM worker processes {workers}; CPUs: "
          f"server {sorted(os.sched_getaffinity(SERVER_PID[0]))}, clients {sorted(os.sched_getaffinity(0))}")
    print(f"  {'metric':18s} {'ours':>9s} {'guidellm':>9s} {'diff':>8s} | {'server(ours)':>12s} {'ours err':>8s}"
          f" | {'server(gl)':>10s} {'gl err':>8s}")
    ok = True
    for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms",
                "output_throughput"):
        a, b = mine.metrics[key], theirs[key]
        ta, tb = srv_mine[key], srv_theirs[key]
        diff = b / a - 1
        ok &= key.startswith("p99") or abs(diff) < GUIDELLM_TOL
        print(f"  {key:18s} {a:9.3f} {b:9.3f} {100 * diff:+7.2f}% | {ta:12.3f} {100 * (a / ta - 1):+7.2f}%"
              f" | {tb:10.3f} {100 * (b / tb - 1):+7.2f}%")
    print(f"  GuideLLM mean TTFT - server's = {theirs['mean_ttft_ms'] - srv_theirs['mean_ttft_ms']:+.3f} ms ="
          f" delivery (its header write -> server receipt) {gl_delivery:+.3f} + receive lag (server write ->"
          f" its first-token stamp) {gl_lag:+.3f}")
    print(f"  ours and GuideLLM within {GUIDELLM_TOL:.0%} (means and medians): {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "out")
    ap.add_argument("--guidellm", default=shutil.which("guidellm"), help="guidellm executable")
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--guidellm-only", action="store_true", help="skip the accuracy table and sweep")
    ap.add_argument("--guidellm-workers", type=int, default=1,
                    help="GUIDELLM__MAX_WORKER_PROCESSES for GuideLLM (its default is 10)")
    ap.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                    help="for the GuideLLM comparison, pin the paced server to the first CPU and both clients "
                         "(ours in this process; GuideLLM, a child, inherits it) to the others")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start "
          "(other processes share these cores: all timings include that contention)")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start([sys.executable, str(HERE / "paced_server.py"), "--port", str(port)], args.out / "paced_server.log")
    SERVER_PID[0] = server.pid
    try:
        wait_health(url)
        if not args.guidellm_only:
            accuracy = [measure(url, c, 20.0, 10.0, args.out_len, n) for c, n in ((1, 8), (64, 256), (256, 512))]
            print_accuracy("accuracy: TTFT 20 ms, ITL 10 ms", accuracy)
            sweep = [measure(url, 256, 20.0, itl, args.out_len, 512) for itl in (25.6, 12.8, 10.24, 8.0, 6.4, 5.12, 4.0)]
            print_accuracy("throughput sweep at concurrency 256", sweep)
            passing = [r for r in sweep + accuracy if r["pass"]]
            best = max(passing, key=lambda r: r["cli_tok_s"]) if passing else None
            print(f"load average now {os.getloadavg()[0]:.2f}")
            print(f"\nhighest streamed rate holding the error bounds: "
                  f"{best['cli_tok_s']:.0f} tokens/s (concurrency {best['conc']}, ITL {best['itl_ms']} ms)"
                  if best else "\nno sweep point held the error bounds")
            (args.out / "client_fidelity.json").write_text(json.dumps({"accuracy": accuracy, "sweep": sweep}, indent=1))
        if args.guidellm:
            cpus = sorted(os.sched_getaffinity(0))
            if args.pin and len(cpus) >= 2:  # the paced server is one thread: its affinity can change live
                os.sched_setaffinity(server.pid, {cpus[0]})
                os.sched_setaffinity(0, set(cpus[1:]))  # our client here, and GuideLLM (a child) inherits it
            for conc, out_len, num in ((1, 128, 16), (64, 512, 256)):
                try:
                    compare_guidellm(args.guidellm, url, conc, 10.0, out_len, num, args.out,
                                     args.guidellm_workers)
                except (RuntimeError, OSError, KeyError, ValueError) as exc:
                    print(f"\nGuideLLM comparison not run: {exc}")
        else:
            print("\nGuideLLM comparison not run: no guidellm executable (pip install guidellm; --guidellm PATH)")
    finally:
        stop(server)
    return 0


if __name__ == "__main__":
    sys.exit(main())
