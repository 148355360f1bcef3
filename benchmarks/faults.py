"""Soak a simulated study in server and storage faults and check every trial's outcome.

    python benchmarks/faults.py [--trials 300] [--seed 0] [--interruptions 4] [--keep DIR]

One `tuner tune` study (SQLite in a tmpfs of its own, in a private mount namespace) on the
simulator with seeded faults (tuner.sim.faults): each server start draws one of http500, cut,
malformed, flap, slow_start, port_taken, gpu_grab, or none, and logs it as `sim fault: ...`.
The search space is narrowed to configs that run cleanly without faults, so each trial's
expected outcome follows from its fault alone:

    none -> ok; http500, cut, malformed, flap -> flaky; slow_start -> startup;
    port_taken -> the launch is repeated on a fresh port (the trial records ports_taken) and
    judged by the last launch's fault (three taken in a row: startup);
    gpu_grab -> gpu_busy: the trial is failed and its config queued again.

Storage interruptions, alternating, at evenly spaced trial counts: the database locked by
another process for longer than SQLite's busy timeout (the tuner must retry and carry on), and
the study's disk filled up (the tuner must exit with status 3 and a "disk full" message, leave
a sound database, and resume with the same command once space is freed).

Checked: every trial's outcome matches its fault, no completed trial lost or changed, no
server process left behind, no trial left RUNNING, retried and interrupted trials re-queued,
the database's integrity, the final count exact.  Prints one table and a summary line; exits 1
if any check fails.  Needs `unshare -m` (root) or `unshare -rm` for the tmpfs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.faultcheck import (  # noqa: E402
    Verdicts, complete_count, integrity, judge, read_trials)
from tuner.server.process import processes_matching, stop_group  # noqa: E402
from tuner.sim import nvml  # noqa: E402

STUDY = "faults"
NAMESPACE_ENV = "TUNER_FAULTS_NS"
WORKLOAD = """\
name: faults
seed: 0
warmup: {requests: 1, input_len: 16, output_len: 4}
cells:
  - {concurrency: 4, input_len: 512, output_len: 32, num_prompts: 16}
objectives: ["max output_throughput"]
"""
# after=1 spares the warm-up request; span=16 covers the measured cell's requests
RATES = {"http500": 0.09, "cut": 0.09, "malformed": 0.09, "flap": 0.09, "slow_start": 0.03,
         "port_taken": 0.09, "gpu_grab": 0.04}
OPTIONS = "after=1,span=16,count=2,grab_s=3"
TIME_SCALE = 100.0
STARTUP_S = 800.0           # simulated seconds: 8 s of wall time at TIME_SCALE
LOCK_S = 26.0               # longer than tuner.study.storage.SQLITE_BUSY_S
LOCK_AFTER_S = 10.0         # the tuner must still run this long after the lock is released
FULL_EXIT_TIMEOUT_S = 90.0


def _space(root: Path) -> Path:
    """infinilm.yaml with ranges every config of which starts and runs the cell cleanly."""
    space = yaml.safe_load((REPO / "search_spaces" / "infinilm.yaml").read_text())
    params = space["parameters"]
    params["kv_cache_tokens"].update(low=8192, high=65536)
    params["block_size"]["choices"] = [64, 256]  # the RTX 4090 profile fails 128 at start-up
    params["max_batch_size"].update(low=4, high=32)
    params["max_num_batched_tokens"].update(low=2048, high=8192)
    path = root / "space.yaml"
    path.write_text(yaml.safe_dump(space, sort_keys=False))
    return path


def _tuner_argv(root: Path, trials: int, seed: int) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "tune", "--model", str(root / "model"),
            "--simulate", "rtx4090", "--workload", str(root / "workload.yaml"),
            "--space", str(root / "space.yaml"), "--trials", str(trials), "--study", STUDY,
            "--studies-dir", str(root / "studies"), "--sampler", "random", "--seed", str(seed),
            "--time-scale", f"{TIME_SCALE:g}", "--startup-timeout", f"{STARTUP_S:g}",
            "--gpu-wait", "60", "--no-prescreen", "--no-export"]


def _start(argv: list[str], root: Path, seed: int, log: Path) -> subprocess.Popen[bytes]:
    spec = ",".join(f"{k}={v}" for k, v in RATES.items()) + f",{OPTIONS},seed={seed}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1",
           "TUNER_SIM_FAULTS": spec, nvml.SIM_NVML_ENV: str(root / "gpu.json")}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _db(root: Path) -> Path:
    return root / "studies" / STUDY / "study.db"


def _hold_lock(root: Path) -> None:
    """Another process's write transaction on the study database, for LOCK_S seconds."""
    con = sqlite3.connect(_db(root), timeout=30, isolation_level=None)
    con.execute("BEGIN EXCLUSIVE")
    time.sleep(LOCK_S)
    con.execute("ROLLBACK")
    con.close()


def _fill_disk(root: Path) -> Path:
    ballast = root / "studies" / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError:
        pass
    try:
        while True:
            os.write(fd, b"\0" * 512)
    except OSError:
        pass
    os.close(fd)
    return ballast


def _orphans(root: Path) -> list[int]:
    return processes_matching("tuner.sim", str(root))


class Soak:
    """The study, its tuner runs and the interruptions, with what each of them showed."""

    def __init__(self, root: Path, trials: int, seed: int, interruptions: int) -> None:
        self.root, self.trials, self.seed = root, trials, seed
        self.argv = _tuner_argv(root, trials, seed)
        step = trials // (interruptions + 1)
        self.plan = [(step * (i + 1), "lock" if i % 2 == 0 else "disk full")
                     for i in range(interruptions)]
        self.storage = Counter()  # (kind, "ok"|"bad") -> count
        self.seen: dict[int, tuple[float, ...]] = {}
        self.orphans = 0
        self.runs = 0
        self.rc = -1

    def run(self) -> None:
        proc = self._launch()
        try:
            for at, kind in self.plan:
                while complete_count(_db(self.root)) < at and proc.poll() is None:
                    time.sleep(0.5)
                self._remember()
                if kind == "lock":
                    _hold_lock(self.root)
                    time.sleep(LOCK_AFTER_S)  # the tuner's retry must have gone through
                    self.storage[(kind, "ok" if proc.poll() is None else "bad")] += 1
                else:
                    proc = self._disk_full(proc)
            self.rc = proc.wait(timeout=3600)
        finally:
            if proc.poll() is None:
                stop_group(proc.pid, grace_s=2.0, child=proc)
        self.orphans += len(_orphans(self.root))

    def _launch(self) -> subprocess.Popen[bytes]:
        self.runs += 1
        return _start(self.argv, self.root, self.seed, self.root / f"run{self.runs}.log")

    def _disk_full(self, proc: subprocess.Popen[bytes]) -> subprocess.Popen[bytes]:
        ballast = _fill_disk(self.root)
        try:
            rc = proc.wait(timeout=FULL_EXIT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_group(proc.pid, grace_s=2.0, child=proc)
            rc = None
        log = (self.root / f"run{self.runs}.log").read_text(errors="replace")
        self.orphans += len(_orphans(self.root))
        ballast.unlink()
        good = rc == 3 and "disk full" in log and integrity(_db(self.root)) == "ok"
        self.storage[("disk full", "ok" if good else "bad")] += 1
        return self._launch()

    def _remember(self) -> None:
        for t in read_trials(_db(self.root), STUDY):
            if t.state.name == "COMPLETE":
                self.seen.setdefault(t.number, tuple(t.values))

    def retries_logged(self) -> int:
        return sum(p.read_text(errors="replace").count("retrying for up to")
                   for p in self.root.glob("run*.log"))


def _print(v: Verdicts, soak: Soak, checks: list[tuple[str, int, int]]) -> None:
    print(f"{'fault':<22} {'count':>6} {'expected':<34} {'as expected':>11} {'not':>4}")
    for kind, want in v.expected_text.items():
        good, bad = v.matched[kind], v.wrong[kind]
        print(f"{kind:<22} {good + bad:>6} {want:<34} {good:>11} {bad:>4}")
    print(f"{'port taken, retried':<22} {v.ports_retried:>6} {'judged by the next launch':<34} "
          f"{v.ports_retried - v.ports_unrecorded:>11} {v.ports_unrecorded:>4}")
    for kind, want in (("storage lock", "tuner waits, retries, carries on"),
                       ("disk full", "exit 3, db sound, resumes")):
        key = "lock" if kind == "storage lock" else kind
        good, bad = soak.storage[(key, "ok")], soak.storage[(key, "bad")]
        print(f"{kind:<22} {good + bad:>6} {want:<34} {good:>11} {bad:>4}")
    for name, got, want in checks:
        verdict = "ok" if got == want else f"FAIL want {want}"
        print(f"{'check: ' + name:<63} {got:>6} {verdict}")


def run(root: Path, trials: int, seed: int, interruptions: int) -> bool:
    t0 = time.monotonic()
    (root / "model").mkdir(parents=True)
    shutil.copy(REPO / "models" / "llama-3.2-1b" / "config.json", root / "model" / "config.json")
    (root / "workload.yaml").write_text(WORKLOAD)
    _space(root)
    nvml.create(root / "gpu.json")
    print(f"faults: {trials} trials, {interruptions} storage interruptions, seed {seed}, in {root}",
          flush=True)
    soak = Soak(root, trials, seed, interruptions)
    soak.run()
    final = read_trials(_db(root), STUDY)
    v = judge(final, root / "studies" / STUDY / "trials")
    complete = {t.number: t for t in final if t.state.name == "COMPLETE"}
    lost = sum(1 for n, vals in soak.seen.items()
               if n not in complete or tuple(complete[n].values) != vals)
    checks = [
        ("trial outcomes not matching their fault", sum(v.wrong.values()), 0),
        ("trials whose port retries were not recorded", v.ports_unrecorded, 0),
        ("failed trials (gpu_busy, interrupted) not re-queued", v.not_requeued, 0),
        ("completed trials lost or changed", lost, 0),
        ("orphan server processes", soak.orphans, 0),
        ("trials left RUNNING", sum(1 for t in final if t.state.name == "RUNNING"), 0),
        ("storage interruptions not survived", sum(c for (_, r), c in soak.storage.items()
                                                    if r == "bad"), 0),
        ("lock interruptions without a logged retry",
         max(0, soak.storage[("lock", "ok")] - soak.retries_logged()), 0),
        ("database integrity (0 = ok)", int(integrity(_db(root)) != "ok"), 0),
        ("final tuner exit status", soak.rc, 0),
        ("final COMPLETE trials", len(complete), trials),
    ]
    _print(v, soak, checks)
    for line in v.examples[:10]:
        print("  " + line)
    ok = all(got == want for _, got, want in checks)
    wall = time.monotonic() - t0
    print(f"faults: {'PASS' if ok else 'FAIL'}: {len(complete)} trials complete of {trials}, "
          f"{len(final)} in the storage, {sum(v.matched.values())} judged as their fault, "
          f"{sum(soak.storage.values())} storage interruptions, {soak.runs} tuner runs, "
          f"{wall:.0f} s wall")
    return ok


def _in_namespace(argv: list[str]) -> int | None:
    """Re-run this script in a private mount namespace (a tmpfs only it sees); None if here."""
    if os.environ.get(NAMESPACE_ENV):
        return None
    for unshare in (["unshare", "-m"], ["unshare", "-rm"]):
        probe = subprocess.run([*unshare, "true"], capture_output=True)
        if probe.returncode == 0:
            env = {**os.environ, NAMESPACE_ENV: "1"}
            return subprocess.call([*unshare, sys.executable, __file__, *argv], env=env)
    print("faults: needs `unshare -m` or `unshare -rm` for a tmpfs of its own", file=sys.stderr)
    return 2


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0, help="faults and sampler seed")
    parser.add_argument("--interruptions", type=int, default=4,
                        help="storage interruptions, alternating lock and disk full")
    parser.add_argument("--disk-mib", type=int, default=64, help="size of the study's tmpfs")
    parser.add_argument("--keep", type=Path, help="copy the study folder here at the end")
    args = parser.parse_args()
    code = _in_namespace(sys.argv[1:])
    if code is not None:
        return code
    root = Path(tempfile.mkdtemp(prefix="tuner-faults-")).resolve()
    (root / "studies").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.disk_mib}m", "tmpfs",
                    str(root / "studies")], check=True)
    try:
        ok = run(root, args.trials, args.seed, args.interruptions)
        if args.keep is not None:
            shutil.copytree(root, args.keep, dirs_exist_ok=True)
    finally:
        for pid in _orphans(root):
            stop_group(os.getpgid(pid), grace_s=0.5)
        subprocess.run(["umount", "-l", str(root / "studies")], check=False)
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
