"""Which GPU each trial's server ran on, read from NVML while a study runs (`tune --gpus`).

    python benchmarks/h200/gpu_procs.py sample OUT.jsonl [--interval 0.5]    # until SIGTERM/SIGINT
    python benchmarks/h200/gpu_procs.py check OUT.jsonl --storage URL --study NAME [-o FILE.json]

`sample` polls every GPU's compute processes (nvmlDeviceGetComputeRunningProcesses) and, for
each pid, reads from /proc what the tuner put in the server's environment: TUNER_SERVER_RECORD
(trials/<n>/server.json, so the trial number), CUDA_VISIBLE_DEVICES, and the process group.
`check` joins those samples with the study: per trial, the NVML GPU(s) its server appeared on;
per worker (the `worker` attribute of its trials), the GPUs of its servers.  It passes when
every sampled trial ran on exactly one GPU, each worker's servers stayed on one GPU, and the
workers used distinct GPUs; it exits 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path

TRIAL = re.compile(r"/trials/(\d+)/server\.json$")


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def sample(out: Path, interval: float) -> int:
    import pynvml

    pynvml.nvmlInit()
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    with out.open("a") as f:
        while not stop:
            now = time.time()
            for index, handle in enumerate(handles):
                mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    env = _environ(p.pid)
                    rec = env.get("TUNER_SERVER_RECORD", "")
                    m = TRIAL.search(rec)
                    f.write(json.dumps({
                        "t": round(now, 2), "gpu": index, "pid": p.pid, "pgid": _pgid(p.pid),
                        "used_mib": (p.usedGpuMemory or 0) // 2**20,
                        "gpu_used_mib": mem.used // 2**20, "record": rec,
                        "trial": int(m.group(1)) if m else None,
                        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES")}) + "\n")
            f.flush()
            time.sleep(interval)
    pynvml.nvmlShutdown()
    return 0


def check(samples: Path, storage: str, study: str) -> dict:
    import optuna

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from tuner.study.storage import as_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    trials = optuna.load_study(study_name=study, storage=as_storage(storage)).trials
    gpus_of: dict[int, set[int]] = defaultdict(set)
    pgids_of: dict[int, set[int]] = defaultdict(set)
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["trial"] is not None:
            gpus_of[row["trial"]].add(row["gpu"])
            pgids_of[row["trial"]].add(row["pgid"])
    per_trial, per_worker = {}, defaultdict(set)
    for t in trials:
        seen = sorted(gpus_of.get(t.number, ()))
        worker = t.user_attrs.get("worker")
        per_trial[t.number] = {"state": t.state.name, "outcome": t.user_attrs.get("outcome"),
                               "worker": worker, "nvml_gpus": seen,
                               "server_pgids": sorted(p for p in pgids_of.get(t.number, ()) if p)}
        per_worker[worker].update(seen)
    sampled = [n for n, v in per_trial.items() if v["nvml_gpus"]]
    ok = (bool(sampled) and all(len(per_trial[n]["nvml_gpus"]) == 1 for n in sampled)
          and all(len(g) == 1 for g in per_worker.values() if g)
          and len({min(g) for g in per_worker.values() if g}) == len([g for g in per_worker.values() if g]))
    return {"study": study, "samples": len(rows), "trials_sampled": len(sampled),
            "trials": len(trials), "gpus_used": sorted({g for v in per_worker.values() for g in v}),
            "per_worker": {str(w): sorted(g) for w, g in per_worker.items()},
            "per_trial": per_trial, "pass": ok}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    s.add_argument("out", type=Path)
    s.add_argument("--interval", type=float, default=0.5)
    c = sub.add_parser("check")
    c.add_argument("samples", type=Path)
    c.add_argument("--storage", required=True)
    c.add_argument("--study", required=True)
    c.add_argument("-o", "--output", type=Path)
    args = ap.parse_args()
    if args.cmd == "sample":
        return sample(args.out, args.interval)
    result = check(args.samples, args.storage, args.study)
    if args.output:
        args.output.write_text(json.dumps(result, indent=1))
    for n, v in result["per_trial"].items():
        print(f"trial {n:3d} {v['state']:9s} {str(v['outcome']):8s} worker {v['worker']} "
              f"NVML GPU {v['nvml_gpus']} server pgid {v['server_pgids']}")
    print(f"workers -> GPUs: {result['per_worker']}; GPUs used {result['gpus_used']}; "
          f"{result['trials_sampled']}/{result['trials']} trials seen on a GPU; "
          f"{'PASS' if result['pass'] else 'FAIL'}")
    return 0 if result["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
