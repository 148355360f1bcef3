"""optuna-dashboard in the foreground until Ctrl-C, and only until then.

optuna-dashboard serves with wsgiref, whose request handler catches every exception, the
KeyboardInterrupt of a Ctrl-C included: a Ctrl-C that lands while a request is being answered
was swallowed and the dashboard served on (tests saw it outlive SIGINT by over 60 s).  So the
server runs in a daemon thread and the main thread owns SIGINT: Ctrl-C always returns at once,
and the thread ends with the process.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

from tuner.errors import UsageError

POLL_S = 0.5


def serve(storage: str, host: str, port: int) -> int:
    """Serve `storage` on host:port until Ctrl-C (or SIGINT); -> exit code 0."""
    try:
        from optuna_dashboard import run_server
    except ImportError:
        raise UsageError("--serve needs optuna-dashboard: "
                         "pip install 'llm-server-tuner[dashboard]' "
                         "(or pip install optuna-dashboard)") from None
    print(
        f"optuna-dashboard on http://{host}:{port}/ for {storage} (Ctrl-C to stop)", file=sys.stderr
    )
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            run_server(storage, host=host, port=port)
        except BaseException as exc:  # handed to the main thread below
            failure.append(exc)
        finally:
            stop.set()

    def on_sigint(signum: int, frame: Any) -> None:
        stop.set()

    # also when started from a script's background job, which inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        threading.Thread(target=run, name="optuna-dashboard", daemon=True).start()
        while not stop.wait(POLL_S):
            pass
    finally:
        signal.signal(signal.SIGINT, previous)
    if failure and isinstance(failure[0], OSError):
        raise UsageError(f"cannot serve on {host}:{port}: {failure[0]}")
    if failure:
        raise failure[0]
    return 0
