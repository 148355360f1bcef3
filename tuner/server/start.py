"""Start a trial's server and wait for its /health, on a fresh port if another process took one.

`free_port` asks the kernel for a port nobody listens on, but nothing reserves it: another
process may bind it before the server does (a second tuner, a user's job, the OS handing out an
ephemeral port).  The server then exits with "address already in use".  That says nothing
about the config, so the launch is repeated on a new port, up to `PORT_ATTEMPTS` times; the log
of each lost attempt is kept beside the trial's as `server.port-taken-<n>.log`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.bench.records import Cell
from tuner.server.process import ServerProcess, free_port
from tuner.trial.context import HOST, TrialContext

PORT_ATTEMPTS = 3


@dataclass
class Started:
    server: ServerProcess   # running or exited: the caller stops it
    healthy: bool
    argv: list[str]
    env: dict[str, str]
    ports_taken: int        # launches lost to a port another process took


def start_server(ctx: TrialContext, params: dict[str, Any], trial_dir: Path,
                 cells: list[Cell]) -> Started:
    """Launch the server of `params` and wait for health.

    Whatever happens, the server started last is returned or stopped, never left running.
    """
    startup = ctx.startup_timeout_s or ctx.space.server.startup_timeout_s
    for attempt in range(1, PORT_ATTEMPTS + 1):
        port = free_port(HOST)
        argv, env = ctx.render(params, port=port, cells=cells)
        (trial_dir / "argv.json").write_text(json.dumps({"argv": argv, "env": env}, indent=1))
        server = ServerProcess(argv, env, host=HOST, port=port,
                               health_path=ctx.space.server.health_path,
                               log_path=trial_dir / "server.log",
                               record_path=trial_dir / "server.json")
        try:
            server.start()
            healthy = server.wait_healthy(startup / ctx.scale)
        except BaseException:
            server.stop()
            raise
        if healthy or not server.port_taken() or attempt == PORT_ATTEMPTS:
            return Started(server, healthy, argv, env, attempt - 1)
        server.stop(wait_port=False)
        server.log_path.rename(trial_dir / f"server.port-taken-{attempt}.log")
    raise AssertionError("unreachable")
