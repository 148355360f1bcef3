"""Resume after kill -9: the dead worker's trial is failed and re-queued, its server stopped."""

import json
import socket
import subprocess
import sys
import time

import optuna
from optuna.trial import TrialState

from tuner.server.process import ServerProcess, free_port, group_members
from tuner.study.record import claim
from tuner.study.recovery import recover, stop_orphan_server


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _orphan_server(trial_dir):
    argv = [sys.executable, "-c", "import time; time.sleep(60)"]
    proc = subprocess.Popen(argv, start_new_session=True)
    trial_dir.mkdir(parents=True)
    (trial_dir / "server.json").write_text(json.dumps({"pid": proc.pid, "pgid": proc.pid, "port": 1,
                                                        "argv": argv}))
    return proc


def test_dead_workers_running_trial_is_requeued_and_its_server_stopped(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["maximize"])
    done = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
    study.tell(done, [1.0])
    dead = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
    claim(dead, f"{socket.gethostname()}:{_dead_pid()}")
    live = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
    claim(live, f"{socket.gethostname()}:{_dead_pid() and __import__('os').getpid()}")
    proc = _orphan_server(tmp_path / "trials" / str(dead.number))
    try:
        assert recover(study, tmp_path / "trials") == [dead.number]
        assert proc.wait(timeout=10) is not None
    finally:
        if proc.poll() is None:
            proc.kill()
    states = {t.number: t.state for t in study.get_trials()}
    assert states[done.number] == TrialState.COMPLETE
    assert states[dead.number] == TrialState.FAIL
    assert states[live.number] == TrialState.RUNNING  # its worker (this process) is alive
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == dead.number
    assert waiting[0].system_attrs["fixed_params"] == {"x": dead.params["x"]}


def test_pid_reused_by_another_command_is_left_alone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        trial_dir = tmp_path / "t"
        trial_dir.mkdir()
        (trial_dir / "server.json").write_text(json.dumps({"pgid": proc.pid, "argv": ["something", "else"]}))
        assert stop_orphan_server(trial_dir) is False
        time.sleep(0.1)
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def test_trial_that_no_worker_claimed_is_requeued_once_old(tmp_path, monkeypatch):
    """A worker killed between the storage creating its trial and recording itself leaves a
    RUNNING trial without a worker and maybe without a heartbeat: it must not hold the budget."""
    import tuner.study.recovery

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/s.db", directions=["maximize"])
    unclaimed = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
    assert recover(study, tmp_path / "trials") == []  # young: its worker may still be about to claim it
    monkeypatch.setattr(tuner.study.recovery, "UNCLAIMED_AFTER_S", 0.0)
    assert recover(study, tmp_path / "trials") == [unclaimed.number]
    waiting = study.get_trials(states=(TrialState.WAITING,))
    assert len(waiting) == 1 and waiting[0].user_attrs["retry_of"] == unclaimed.number


def test_two_workers_recovering_at_once_requeue_once(tmp_path):
    """Only the worker whose storage update fails the trial re-queues it; the other moves on."""
    url = f"sqlite:///{tmp_path}/s.db"
    study = optuna.create_study(storage=url, directions=["maximize"])
    dead = study.ask({"x": optuna.distributions.IntDistribution(0, 10)})
    claim(dead, f"{socket.gethostname()}:{_dead_pid()}")
    other = optuna.load_study(study_name=study.study_name, storage=url)
    stale_view = other.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    assert recover(study, tmp_path / "trials") == [dead.number]
    other.get_trials = lambda **_: stale_view  # the second worker read the trials before the first failed it
    assert recover(other, tmp_path / "trials") == []
    assert len(study.get_trials(states=(TrialState.WAITING,))) == 1


def test_server_workers_left_after_the_leader_died_are_stopped(tmp_path):
    """The leader died with the tuner; its worker process, same group, still holds the GPU."""
    trial_dir = tmp_path / "trials" / "0"
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
            "'import time; time.sleep(60)']); time.sleep(60)")
    server = ServerProcess([sys.executable, "-c", code], {}, host="127.0.0.1", port=free_port(),
                           health_path="/health", log_path=trial_dir / "server.log",
                           record_path=trial_dir / "server.json")
    server.start()
    pgid = server.proc.pid
    try:
        deadline = time.monotonic() + 10
        while len(group_members(pgid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(group_members(pgid)) == 2
        server.proc.kill()
        server.proc.wait()
        assert len(group_members(pgid)) == 1  # the worker outlived its leader
        assert stop_orphan_server(trial_dir) is True
        assert group_members(pgid) == []
    finally:
        server.stop(grace_s=0.5)

