"""Checks of a `tune` command that need no storage, made before the study is touched.

A mistake found by the first trial would leave a study folder, a database and a FAIL trial
behind, and the user would have to delete them before trying again.  So everything that can be
checked without a server (the model dir, the rendered launch command, a free port) is checked
first, and a bad input leaves nothing written.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tuner.errors import UsageError
from tuner.search.model import load_model_info
from tuner.server.process import free_port
from tuner.trial.context import HOST, TrialContext


def check_model(path: str, simulate: bool) -> None:
    """The model dir and its config.json; the simulator also needs the architecture keys."""
    if not Path(path).is_dir():
        hint = ("; --model takes a local folder with config.json, not a Hugging Face id "
                "(download it first, e.g. `huggingface-cli download ID --local-dir DIR`)"
                if _looks_like_hub_id(path) else "")
        raise UsageError(f"model dir not found: {path}{hint}")
    if not (Path(path) / "config.json").is_file():
        raise UsageError(f"model dir has no config.json: {path}")
    if simulate:
        load_model_info(path)


def _looks_like_hub_id(path: str) -> bool:
    """`org/name`: two parts, neither empty nor `.`/`..`, and not an absolute path."""
    parts = path.split("/")
    return (len(parts) == 2 and not path.startswith(("/", "~"))
            and all(p and p not in (".", "..") for p in parts))


def check_launch(ctx: TrialContext) -> None:
    """Render the default config as a trial would and check that its program exists.

    Catches unknown placeholders, an environment value with a newline and a server command that
    is not installed, and makes sure the kernel still has a loopback port to give.
    """
    argv, _ = ctx.render(ctx.space.default_params(), port=free_port(HOST))
    program = argv[0]
    if os.sep in program:
        found = os.path.isfile(program) and os.access(program, os.X_OK)
    else:
        found = shutil.which(program) is not None
    if not found:
        key = "server.simulator" if ctx.simulate else "server.command"
        raise UsageError(f"server command not found: {program} ({ctx.space.path}: {key})")
