"""Start and stop one inference server per trial without ever leaving it behind.

A server that dies in its step loop may keep running and ignore SIGTERM (InfiniLM waits forever
for its hung streams), and a tuner killed with -9 cannot clean up at all.  So every server runs
in its own process group, is asked to die with its parent (PR_SET_PDEATHSIG), records its pid,
group and port in the trial folder (so a resumed study can find and stop it), and is stopped by
signalling the whole group: SIGTERM, a short grace period, then SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import requests

from tuner.errors import UsageError

_PR_SET_PDEATHSIG = 1
MARK_ENV = "TUNER_SERVER_RECORD"  # set to the server's record path in the server's environment
# What servers print when bind() fails with EADDRINUSE (uvicorn, aiohttp, vLLM, Go, Rust)
PORT_TAKEN = re.compile(r"(?i)address already in use|EADDRINUSE|errno 98\b")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the kernel picks it)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    except OSError as exc:
        raise UsageError(f"no free port on {host}: {exc}") from None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Nobody listens on `port`.  SO_REUSEADDR, as servers use it: TIME_WAIT leftovers of
    closed connections do not stop a new server from binding, so they do not count."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def die_with_parent() -> Callable[[], None]:
    """A `preexec_fn` that has the child SIGKILLed when the calling process goes away.

    Built in the parent so that libc is loaded before the fork (the tuner has threads, and
    loading a library in a forked child can deadlock).  PR_SET_PDEATHSIG only covers a parent
    that dies after the prctl call, so the child also checks that its parent is still the one
    that forked it: a tuner killed with -9 between fork and prctl must not leave a server
    whose pid was never recorded.
    """
    parent = os.getpid()
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None

    def hook() -> None:
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)

    return hook


@dataclass
class HealthState:
    """One look at the server: is the process alive, and what did /health answer."""

    alive: bool
    status: int | None  # HTTP status, None when the connection failed


class ServerProcess:
    """One server process group, its log file and its health endpoint."""

    def __init__(self, argv: list[str], env: dict[str, str], *, host: str, port: int,
                 health_path: str, log_path: Path, record_path: Path | None = None,
                 cwd: str | None = None) -> None:
        self.argv, self.env = argv, env
        self.host, self.port = host, port
        self.health_url = f"http://{host}:{port}{health_path}"
        self.base_url = f"http://{host}:{port}"
        self.log_path, self.record_path, self.cwd = log_path, record_path, cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        mark = {MARK_ENV: str(self.record_path.resolve())} if self.record_path is not None else {}
        try:
            self.proc = subprocess.Popen(
                self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env, **mark}, cwd=self.cwd, start_new_session=True,
                preexec_fn=die_with_parent())
        except FileNotFoundError:
            self._log.close()
            raise UsageError(f"server command not found: {self.argv[0]}") from None
        except PermissionError:
            self._log.close()
            raise UsageError(f"server command not executable: {self.argv[0]}") from None
        if self.record_path is not None:
            tmp = self.record_path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"pid": self.proc.pid, "pgid": self.proc.pid,
                                       "port": self.port, "host": self.host,
                                       "argv": self.argv, "started": time.time()}))
            os.replace(tmp, self.record_path)

    @property
    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def health(self, timeout: float = 2.0) -> HealthState:
        alive = self.exit_code is None
        try:
            status = requests.get(self.health_url, timeout=timeout).status_code
        except requests.RequestException:
            status = None
        return HealthState(alive=alive, status=status)

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.1) -> bool:
        """Poll /health until 200; give up at once if the process exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.exit_code is not None:
                return False
            if self.health(timeout=min(2.0, poll_s * 10)).status == 200:
                return True
            time.sleep(poll_s)
        return False

    def settled_health(self, probes: int = 3, interval_s: float = 0.5) -> tuple[bool, int]:
        """(unhealthy, flaps) at the end of a run: a non-200 /health is believed when `probes`
        looks in a row say so (as the runner's HealthWatch does); one that recovers is a flap."""
        bad = 0
        for _ in range(probes):
            state = self.health()
            if not state.alive:
                return False, int(bad > 0)  # the exit status tells the story
            if state.status == 200:
                return False, int(bad > 0)
            bad += 1
            time.sleep(interval_s)
        return True, 0

    def port_taken(self) -> bool:
        """The server exited because another process held its port (the bind failed)."""
        return self.exit_code is not None and bool(PORT_TAKEN.search(self.log_text()))

    def stop(self, grace_s: float = 3.0, wait_port: bool = True) -> None:
        """TERM the whole group, then KILL it; wait until the port is released (unless
        `wait_port` is False: another process holds it)."""
        if self.proc is not None:
            stop_group(self.proc.pid, grace_s, child=self.proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        deadline = time.monotonic() + 5.0
        while wait_port and not port_is_free(self.port, self.host) and time.monotonic() < deadline:
            time.sleep(0.05)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def proc_stat(pid: int | str) -> tuple[str, int] | None:
    """(state letter, process group) of a live pid from /proc, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[2])


def pid_alive(pid: int) -> bool:
    """True for a running process; a zombie holds no GPU memory or port, so it does not count."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = proc_stat(pid)
    return stat is None or stat[0] != "Z"


def processes_matching(*needles: str) -> list[int]:
    """Pids of live (non-zombie) processes whose command line contains every needle.

    How the chaos benchmark and the tests look for servers left behind, without trusting any
    record the tuner wrote.
    """
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        stat = proc_stat(entry)
        if stat is not None and stat[0] != "Z" and all(n in cmd for n in needles):
            pids.append(int(entry))
    return pids


def group_members(pgid: int) -> list[int]:
    """Pids of the group's non-zombie processes (zombies hold no GPU or port)."""
    members = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = proc_stat(entry)
            if stat is not None and stat[1] == pgid and stat[0] != "Z":
                members.append(int(entry))
    return members


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return bool(group_members(pgid))


def stop_group(
    pgid: int, grace_s: float = 3.0, child: subprocess.Popen[bytes] | None = None
) -> bool:
    """Stop a process group; True if something was running. Reaps `child` if given."""
    if not _group_alive(pgid):
        if child is not None:
            child.poll()
        return False
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if child is not None:
            child.poll()
        if not _group_alive(pgid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while _group_alive(pgid) and time.monotonic() < deadline:
        if child is not None:
            child.poll()
        time.sleep(0.02)
    if child is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=1.0)
    return True
