"""Kill -9 the tuner at random moments of a simulated study and resume it each time.

    python benchmarks/chaos.py [--kills 20] [--trials 30] [--seed 0] [--plain] [--keep DIR]

The tuner runs as `python -m tuner.cli tune ...` in its own process group on a fresh temp dir
(model config, workload and studies dir all under it, so every server's command line names that
dir).  After a random delay (seeded) only the tuner process gets SIGKILL.  The next run is the
same command.  Each server is a launcher process that runs the simulator as its child, as real
servers run worker processes: the launcher dies with the tuner (PR_SET_PDEATHSIG), the child
survives and must be found and stopped by the next run's recovery (`--plain`: the simulator
alone, which PDEATHSIG kills).  After each kill the study is read back and checked:

- completed trials lost: a trial seen COMPLETE earlier that is gone or changed its values;
- orphan servers: a server process of this run still alive after a later run got through its
  recovery (it printed "re-queued"), or after the final run; "left" counts the survivors of a
  kill 3 s after it, "found" those that the next run's recovery stopped;
- configs run twice: a config key on two COMPLETE trials that both ran a server (copies of a
  known result, `cached_from`, run nothing);
- at the end: trials still RUNNING, interrupted trials not re-queued, ports recorded in
  trials/*/server.json still bound, and the final number of COMPLETE trials (must be exact).

Prints a table (one row per kill) and a summary; exits 1 if any check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import yaml
from optuna.trial import TrialState

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tuner.server.process import port_is_free, processes_matching, stop_group  # noqa: E402

STUDY = "chaos"
WORKLOAD = """\
name: chaos
seed: 0
warmup: {requests: 1, input_len: 16, output_len: 4}
cells:
  - {concurrency: 4, input_len: 1024, output_len: 64, num_prompts: 12}
objectives: ["max output_throughput"]
"""
LAUNCHER = "import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))\n"
ORPHAN_WAIT_S = 3.0
FINAL_TIMEOUT_S = 240.0


@dataclass
class Totals:
    lost: int = 0
    orphans: int = 0
    run_twice: int = 0
    seen: dict[int, tuple[float, ...]] = field(default_factory=dict)


def _write_inputs(root: Path, plain: bool) -> None:
    """Model config, workload and search space (its simulator behind a launcher) under `root`."""
    (root / "model").mkdir(parents=True)
    shutil.copy(REPO / "models" / "llama-3.2-1b" / "config.json", root / "model" / "config.json")
    (root / "workload.yaml").write_text(WORKLOAD)
    space = yaml.safe_load((REPO / "search_spaces" / "infinilm.yaml").read_text())
    if not plain:
        (root / "launcher.py").write_text(LAUNCHER)
        space["server"]["simulator"] = ["{python}", str(root / "launcher.py"), *space["server"]["simulator"]]
    (root / "space.yaml").write_text(yaml.safe_dump(space, sort_keys=False))


def _tuner_argv(root: Path, trials: int, seed: int) -> list[str]:
    return [sys.executable, "-m", "tuner.cli", "tune", "--model", str(root / "model"),
            "--simulate", "rtx4090", "--workload", str(root / "workload.yaml"),
            "--space", str(root / "space.yaml"),
            "--trials", str(trials), "--study", STUDY, "--studies-dir", str(root / "studies"),
            "--sampler", "random", "--seed", str(seed), "--time-scale", "25", "--no-export"]


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _servers(root: Path) -> list[int]:
    """Pids of live simulator processes whose command line names `root`."""
    return processes_matching("tuner.sim", str(root))


def _left_after_death(root: Path, earlier: set[int]) -> set[int]:
    """Server processes of the killed run (not `earlier` survivors) alive 3 s after the kill."""
    deadline = time.monotonic() + ORPHAN_WAIT_S
    while (left := set(_servers(root)) - earlier) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _trials(root: Path) -> list[optuna.trial.FrozenTrial]:
    db = root / "studies" / STUDY / "study.db"
    if not db.is_file():
        return []
    storage = optuna.storages.RDBStorage(f"sqlite:///{db}")
    try:
        return optuna.load_study(study_name=STUDY, storage=storage).get_trials(deepcopy=False)
    except KeyError:  # killed between creating the database and the study
        return []
    finally:
        storage.engine.dispose()


def _check(trials: list[optuna.trial.FrozenTrial], totals: Totals) -> tuple[int, int, int, int]:
    """(complete, running, lost, run twice) for the study as it stands; updates `totals`."""
    complete = {t.number: t for t in trials if t.state == TrialState.COMPLETE}
    lost = sum(1 for n, v in totals.seen.items()
               if n not in complete or tuple(complete[n].values) != v)
    for n, t in complete.items():
        totals.seen.setdefault(n, tuple(t.values))
    keys = Counter(t.user_attrs.get("config_key") for t in complete.values()
                   if "cached_from" not in t.user_attrs)
    twice = sum(c - 1 for c in keys.values() if c > 1)
    running = sum(1 for t in trials if t.state == TrialState.RUNNING)
    totals.lost = max(totals.lost, lost)
    totals.run_twice = max(totals.run_twice, twice)
    return len(complete), running, lost, twice


def _ports_bound(root: Path) -> int:
    ports = set()
    for record in (root / "studies" / STUDY / "trials").glob("*/server.json"):
        ports.add(int(json.loads(record.read_text())["port"]))
    return sum(1 for p in ports if not port_is_free(p))


def _not_requeued(trials: list[optuna.trial.FrozenTrial]) -> int:
    """Interrupted trials that had parameters but no retry."""
    retried = {t.user_attrs.get("retry_of") for t in trials}
    return sum(1 for t in trials if t.state == TrialState.FAIL and t.params
               and t.user_attrs.get("outcome") == "interrupted" and t.number not in retried)


def run(kills: int, trials: int, seed: int, root: Path, plain: bool) -> bool:
    _write_inputs(root, plain)
    argv, rng, totals = _tuner_argv(root, trials, seed), random.Random(seed), Totals()
    print(f"chaos: {kills} kills of `tuner tune --trials {trials}` (seed {seed}, "
          f"{'simulator alone' if plain else 'simulator behind a launcher'}) in {root}")
    print(f"{'kill':>4} {'at s':>5} {'server up':>9} {'complete':>8} {'RUNNING':>7} "
          f"{'lost':>4} {'left':>4} {'found':>5} {'orphans':>7} {'twice':>5}")
    proc, waiting = None, set()  # servers that survived a kill, waiting for a run's recovery
    try:
        for k in range(1, kills + 1):
            log = root / f"run{k}.log"
            proc = _start(argv, log)
            delay = rng.uniform(0.3, 6.0)
            try:
                proc.wait(timeout=delay)  # finished first: the kill lands on the next start-up
            except subprocess.TimeoutExpired:
                pass
            server_up = bool(set(_servers(root)) - waiting)  # this run's own server
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)  # the tuner only, not its group
            proc.wait()
            found = orphans = 0
            if "re-queued" in log.read_text(errors="replace"):  # this run did its recovery
                alive = set(_servers(root))
                found, orphans, waiting = len(waiting - alive), len(waiting & alive), set()
            totals.orphans += orphans
            left = _left_after_death(root, waiting)
            waiting |= left
            complete, running, lost, twice = _check(_trials(root), totals)
            print(f"{k:>4} {delay:>5.2f} {'yes' if server_up else 'no':>9} {complete:>8} "
                  f"{running:>7} {lost:>4} {len(left):>4} {found:>5} {orphans:>7} {twice:>5}", flush=True)
        log = root / "final.log"
        proc = _start(argv, log)
        rc = proc.wait(timeout=FINAL_TIMEOUT_S)
    finally:
        if proc is not None and proc.poll() is None:
            stop_group(proc.pid, grace_s=2.0, child=proc)
        for pid in _servers(root):
            stop_group(os.getpgid(pid), grace_s=0.5)
    final = _trials(root)
    complete, running, _, _ = _check(final, totals)
    totals.orphans += len(_servers(root))
    checks = [
        ("completed trials lost", totals.lost, 0),
        ("orphan server processes", totals.orphans, 0),
        ("configs run twice", totals.run_twice, 0),
        ("ports left bound", _ports_bound(root), 0),
        ("trials left RUNNING", running, 0),
        ("interrupted trials not re-queued", _not_requeued(final), 0),
        ("final resume exit status", rc, 0),
        ("final trial count", complete, trials),
    ]
    print(f"\n{'check':<34} {'got':>5} {'want':>5}")
    for name, got, want in checks:
        print(f"{name:<34} {got:>5} {want:>5}  {'ok' if got == want else 'FAIL'}")
    interrupted = sum(1 for t in final if t.user_attrs.get("outcome") == "interrupted")
    cached = sum(1 for t in final if t.state == TrialState.COMPLETE and "cached_from" in t.user_attrs)
    print(f"({len(final)} trials in the storage: {interrupted} interrupted and re-queued, "
          f"{cached} copies of a known config)")
    ok = all(got == want for _, got, want in checks)
    if not ok:
        print(f"{log.name}, last lines:\n" + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--trials", type=int, default=30, help="the study's target trial count")
    parser.add_argument("--seed", type=int, default=0, help="kill times and sampler seed")
    parser.add_argument("--plain", action="store_true",
                        help="run the simulator without a launcher (PDEATHSIG alone then suffices)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temp dir, removed)")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="tuner-chaos-"))
    try:
        ok = run(args.kills, args.trials, args.seed, root.resolve(), args.plain)
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    print("chaos: PASS" if ok else "chaos: FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
