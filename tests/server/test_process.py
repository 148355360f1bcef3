"""Server processes: own group, stopped with TERM then KILL, port released, nothing left."""

import os
import sys
import time

from tuner.server.process import ServerProcess, free_port, port_is_free, stop_group

LISTEN_IGNORING_TERM = r"""
import signal, socket, sys, time, subprocess
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("child", child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_stubborn_server_and_its_child_are_killed_and_port_freed(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-c", LISTEN_IGNORING_TERM, str(port)], {},
                           host="127.0.0.1", port=port, health_path="/health",
                           log_path=tmp_path / "server.log", record_path=tmp_path / "server.json")
    server.start()
    deadline = time.monotonic() + 10
    while "child" not in server.log_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    child_pid = int(server.log_text().split()[1])
    assert not port_is_free(port)
    assert (tmp_path / "server.json").exists()
    t0 = time.monotonic()
    server.stop(grace_s=0.5)
    assert time.monotonic() - t0 < 8
    assert not _alive(server.proc.pid) and not _alive(child_pid)
    assert port_is_free(port)


def test_wait_healthy_returns_early_when_process_exits(tmp_path):
    port = free_port()
    server = ServerProcess([sys.executable, "-c", "import sys; sys.exit(3)"], {}, host="127.0.0.1",
                           port=port, health_path="/health", log_path=tmp_path / "l.log")
    with server:
        t0 = time.monotonic()
        assert server.wait_healthy(60) is False
        assert time.monotonic() - t0 < 5
        assert server.exit_code == 3


def test_stop_group_of_nothing_is_false():
    assert stop_group(2**22 + 12345, 0.1) is False
