"""Calibration of the simulator against the seed report (RTX 4090, Llama-3.1-8B-Instruct).

Prints the seed's figures and the simulator's for the same configs and cells, side by side with
ratio columns, then checks the calibration targets and the seed's pass/fail pattern; exits 1 if
any check fails.  Run: `PYTHONPATH=. python benchmarks/sim_calibration.py`.

num_prompts per cell are the seed's: 20 at con=1, 40 at con=4, and at con=16/64 one prompt per
client except in=256 x out=256/1024, where the seed ran 80 (con=16) and 128 (con=64).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tuner.bench.records import Cell
from tuner.search.model import load_model_info
from tuner.sim import StartupFailure, simulate
from tuner.sim.memory import MemoryModel
from tuner.sim.profiles import get_profile

ROOT = Path(__file__).resolve().parent.parent
GPU = "rtx4090"
FLAGS = ["--device", "nvidia", "--tp", "1", "--max-new-tokens", "4096", "--block-size", "256",
         "--enable-graph", "--enable-paged-attn", "--attn", "flash-attn", "--ignore-eos"]
FINAL_ENV = {
    "INFINILM_PREFILL_BATCH_CAP": "8", "INFINILM_DECODE_BATCH_CAP": "24",
    "INFINILM_LONG_CONTEXT_THRESHOLD": "4096", "INFINILM_LONG_CONTEXT_MAX_BATCH": "1",
    "INFINILM_DECODE_FIRST_WHEN_RUNNING": "1",
}

# The seed's 30-cell matrix with its final config: (con, in, out, n) -> (out tok/s, TTFT ms, TPOT ms)
SEED_MATRIX = {
    (1, 32, 256, 20): (56.86, 32.04, 17.53), (1, 32, 1024, 20): (56.42, 33.57, 17.71),
    (1, 32, 4096, 20): (56.19, 36.27, 17.79), (1, 256, 256, 20): (55.84, 59.00, 17.75),
    (1, 256, 1024, 20): (56.34, 62.17, 17.71), (1, 256, 4096, 20): (56.07, 72.66, 17.82),
    (1, 4096, 256, 20): (49.95, 530.22, 18.01), (1, 4096, 1024, 20): (53.96, 540.27, 18.02),
    (1, 4096, 4096, 20): (54.40, 552.19, 18.25), (4, 32, 256, 40): (219.68, 68.45, 18.01),
    (4, 32, 1024, 40): (218.34, 71.65, 18.27), (4, 32, 4096, 40): (147.13, 26035.76, 19.49),
    (4, 256, 256, 40): (211.18, 149.97, 18.42), (4, 256, 1024, 40): (212.85, 155.94, 18.66),
    (4, 256, 4096, 40): (142.62, 26983.21, 20.12), (4, 4096, 256, 40): (106.39, 2939.61, 24.76),
    (4, 4096, 1024, 40): (53.89, 54604.96, 18.09), (4, 4096, 4096, 40): (54.46, 203503.93, 17.33),
    (16, 32, 256, 16): (798.81, 174.00, 19.40), (16, 32, 1024, 16): (414.56, 5312.69, 19.69),
    (16, 32, 4096, 16): (138.96, 174643.55, 19.36), (16, 256, 256, 80): (726.03, 468.25, 20.26),
    (16, 256, 1024, 80): (483.11, 11469.24, 20.43), (16, 256, 4096, 16): (137.23, 176758.32, 19.61),
    (64, 32, 256, 64): (1052.16, 4299.80, 29.31), (64, 32, 1024, 64): (530.96, 45873.64, 20.20),
    (64, 32, 4096, 64): (153.98, 682827.66, 11.86), (64, 256, 256, 128): (725.92, 10944.62, 24.19),
    (64, 256, 1024, 128): (475.28, 86502.94, 20.44), (64, 256, 4096, 64): (152.06, 686751.99, 12.07),
}
# The seed's phase-cap ablation: (label, con, max-batch, decode cap or None, seed out tok/s);
# the capped configs also set prefill cap 8.
ABLATION = [
    ("static max-batch 8", 16, 8, None, 407.30), ("prefill 8 / decode 16", 16, 64, 16, 724.84),
    ("prefill 8 / decode 24", 16, 64, 24, 726.03),
    ("static max-batch 8", 64, 8, None, 376.64), ("prefill 8 / decode 16", 64, 64, 16, 631.06),
    ("prefill 8 / decode 24", 64, 64, 24, 725.92),
]
SEED_IDLE_96_MIB = 22587


def matrix_cells() -> list[Cell]:
    return [Cell(c, i, o, n) for (c, i, o, n) in SEED_MATRIX]


def argv(blocks: int, max_batch: int, block_size: int = 256) -> list[str]:
    flags = [f if f != "256" else str(block_size) for f in FLAGS]
    return flags + ["--num-blocks", str(blocks), "--max-batch-size", str(max_batch)]


def run(model: str, flags: list[str], env: dict[str, str], cells: list[Cell]):
    """Results of one trial, or the StartupFailure that stopped it."""
    try:
        return simulate(model, GPU, flags, env, cells)
    except StartupFailure as exc:
        return exc


def ratio(sim: float, seed: float) -> str:
    return f"{sim / seed:6.2f}" if seed else "   -  "


def print_matrix(results) -> None:
    print("\n30-cell matrix, final config (64 x 256 blocks, max-batch 64, prefill 8 / decode 24,"
          " long 4096 x1, decode-first)")
    print(f"{'cell':<16}{'n':>4} | {'out tok/s seed':>14}{'sim':>8}{'ratio':>7} | "
          f"{'TTFT ms seed':>13}{'sim':>10}{'ratio':>7} | {'TPOT ms seed':>12}{'sim':>7}{'ratio':>7}")
    for res in results:
        c = res.cell
        tps, ttft, tpot = SEED_MATRIX[(c.concurrency, c.input_len, c.output_len, c.num_prompts)]
        m = res.metrics
        print(f"{c.key:<16}{c.num_prompts:>4} | {tps:>14.1f}{m['output_throughput']:>8.1f}"
              f"{ratio(m['output_throughput'], tps):>7} | {ttft:>13.0f}{m['mean_ttft_ms']:>10.0f}"
              f"{ratio(m['mean_ttft_ms'], ttft):>7} | {tpot:>12.2f}{m['mean_tpot_ms']:>7.2f}"
              f"{ratio(m['mean_tpot_ms'], tpot):>7}" + (f"  {res.error_class}" if res.error_class else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "llama-3.1-8b"))
    model = parser.parse_args().model
    checks: list[tuple[str, bool, str]] = []

    t0 = time.perf_counter()
    final = simulate(model, GPU, argv(64, 64), FINAL_ENV, matrix_cells())
    wall = time.perf_counter() - t0
    print_matrix(final)
    by_key = {r.cell.key: r for r in final}

    single = [r.metrics["mean_tpot_ms"] for r in final if r.cell.concurrency == 1]
    tpot = sum(single) / len(single)
    checks.append(("single-stream TPOT (mean of con=1 cells) within 10% of 17.7 ms",
                   abs(tpot / 17.7 - 1) <= 0.10, f"{tpot:.2f} ms"))
    ttft = by_key["c1_i4096_o256"].metrics["mean_ttft_ms"]
    checks.append(("TTFT at input 4096 (con=1) within 20% of 530 ms",
                   abs(ttft / 530.22 - 1) <= 0.20, f"{ttft:.1f} ms"))

    print("\nPhase-cap ablation, in=256 out=256 (64 x 256 blocks)")
    print(f"{'config':<24}{'con':>4} | {'out tok/s seed':>14}{'sim':>8}{'ratio':>7} | {'TPOT sim':>8}")
    tput: dict[tuple[str, int], float] = {}
    for label, con, mb, dec, seed_tps in ABLATION:
        env = {} if dec is None else {"INFINILM_PREFILL_BATCH_CAP": "8",
                                      "INFINILM_DECODE_BATCH_CAP": str(dec)}
        res = simulate(model, GPU, argv(64, mb), env, [Cell(con, 256, 256, 80 if con == 16 else 128)])[0]
        tps = res.metrics["output_throughput"]
        tput[(label, con)] = tps
        print(f"{label:<24}{con:>4} | {seed_tps:>14.1f}{tps:>8.1f}{ratio(tps, seed_tps):>7} | "
              f"{res.metrics['mean_tpot_ms']:>8.2f}" + (f"  {res.error_class}" if res.error_class else ""))
    gain = tput[("prefill 8 / decode 24", 64)] / tput[("static max-batch 8", 64)]
    checks.append(("con=64 in=256 out=256: (prefill 8/decode 24) / (static 8) within 20% of 1.93",
                   abs(gain / (725.92 / 376.64) - 1) <= 0.20, f"{gain:.2f}"))

    engine_idle = MemoryModel(load_model_info(model), get_profile(GPU), 96, 256,
                              enable_graph=True).idle_bytes >> 20
    print(f"\nIdle memory at 96 x 256 blocks: seed {SEED_IDLE_96_MIB} MiB, sim {engine_idle} MiB, "
          f"ratio {engine_idle / SEED_IDLE_96_MIB:.3f}")
    checks.append(("idle memory of 96 x 256 blocks within 3% of 22587 MiB",
                   abs(engine_idle / SEED_IDLE_96_MIB - 1) <= 0.03, f"{engine_idle} MiB"))

    checks += pass_fail_checks(model, final)
    checks.append(("30-cell matrix in-process in <= 10 s wall", wall <= 10.0, f"{wall:.2f} s"))

    print("\nChecks")
    for name, ok, got in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {name}: {got}")
    return 0 if all(ok for _, ok, _ in checks) else 1


def _first_failure(results) -> str:
    if isinstance(results, StartupFailure):
        return f"start-up: {results.log_lines[0]}"
    failed = [r for r in results if r.error_class]
    return f"{failed[0].cell.key}: {failed[0].error}" if failed else "all cells passed"


def pass_fail_checks(model: str, final) -> list[tuple[str, bool, str]]:
    """The seed's pass/fail pattern, each from the same memory mechanism (tuner.sim.memory)."""
    out = []
    ok = not any(r.error_class for r in final)
    out.append(("pass: 64 x 256, final env, all 30 cells", ok, _first_failure(final)))
    for con, n in ((16, 80), (64, 128)):
        res = run(model, argv(64, 8), {}, [Cell(con, 256, 256, n)])
        out.append((f"pass: static max-batch 8, con={con} in=256 out=256",
                    not res[0].error_class, _first_failure(res)))
    for blocks in (96, 80):
        res = run(model, argv(blocks, 64), FINAL_ENV, matrix_cells())
        failed = [r for r in res if r.error_class]
        first_long = next(i for i, r in enumerate(res) if r.cell.input_len == 4096)
        ok = bool(failed) and res.index(failed[0]) == first_long and \
            failed[0].records and all(not r.ok for r in failed[0].records) and \
            "4132 tokens" in failed[0].error
        out.append((f"fail on the first input-4096 forward: {blocks} x 256 blocks", ok,
                    _first_failure(res)))
    res = run(model, argv(128, 64, block_size=128), FINAL_ENV, matrix_cells())
    out.append(("fail at start-up: block-size 128", isinstance(res, StartupFailure),
                _first_failure(res)))
    for cell in (Cell(4, 4096, 1024, 40), Cell(16, 256, 256, 80)):
        res = run(model, argv(64, 64), {}, [cell])
        out.append((f"fail under load: original scheduler (max-batch 64), {cell.key}",
                    res[0].error_class == "oom", _first_failure(res)))
    guard = {k: v for k, v in FINAL_ENV.items() if k != "INFINILM_DECODE_FIRST_WHEN_RUNNING"}
    res = run(model, argv(64, 64), guard, [Cell(4, 4096, 1024, 40)])
    out.append(("fail under load: long-context guard without decode-first, c4_i4096_o1024",
                res[0].error_class == "oom", _first_failure(res)))
    long_cells = [c for c in matrix_cells() if c.concurrency >= 2 and c.input_len == 4096]
    for mb in (2, 3):
        res = run(model, argv(64, mb), {}, long_cells)
        out.append((f"fail under load: global max-batch {mb} alone on the con>=2 input-4096 cells",
                    any(r.error_class == "oom" for r in res), _first_failure(res)))
    return out


if __name__ == "__main__":
    sys.exit(main())
