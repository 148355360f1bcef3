"""Turn a server command line and environment into one `SimConfig`.

The simulator takes exactly what InfiniLM's `inference_server.py` would get (its flags and the
`INFINILM_*` variables), so the tuner renders one (argv, env) pair for either.  Flags follow
InfiniLM's `base_config.py` (defaults: num-blocks 512, block-size 256, max-batch-size 8); the
scheduler variables are the seed's patch plus upstream's `INFINILM_MAX_NUM_BATCHED_TOKENS`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tuner.errors import UsageError


@dataclass(frozen=True)
class SchedulerKnobs:
    """The scheduler's limits; `None` means the rule is off (the original scheduler)."""

    max_batch_size: int = 8
    prefill_batch_cap: int | None = None
    decode_batch_cap: int | None = None
    long_context_threshold: int | None = None
    long_context_max_batch: int | None = None
    long_context_use_total_len: bool = False
    decode_first_when_running: bool = False
    max_num_batched_tokens: int | None = None

    @property
    def prefill_limit(self) -> int:
        return min(self.max_batch_size, self.prefill_batch_cap or self.max_batch_size)

    @property
    def decode_limit(self) -> int:
        return min(self.max_batch_size, self.decode_batch_cap or self.max_batch_size)

    def is_long(self, prompt_len: int, max_tokens: int) -> bool:
        """Whether the seed's long-context guard counts this request as long."""
        if self.long_context_threshold is None:
            return False
        length = prompt_len + (max_tokens if self.long_context_use_total_len else 0)
        return length >= self.long_context_threshold


@dataclass(frozen=True)
class SimConfig:
    """Everything one simulated server needs besides the model and GPU profile objects."""

    model: str
    gpu: str
    host: str
    port: int
    tp: int
    max_new_tokens: int
    num_blocks: int
    block_size: int
    enable_graph: bool
    knobs: SchedulerKnobs
    time_scale: float = 1.0
    seed: int = 0
    jitter: float = 0.0
    prefix_caching: bool = True
    faults: str = ""  # tuner.sim.faults spec; empty: no faults


def build_parser() -> argparse.ArgumentParser:
    """InfiniLM's flags plus the simulator's own (`--gpu --time-scale --seed --jitter`)."""
    p = argparse.ArgumentParser(prog="python -m tuner.sim", description=__doc__)
    p.add_argument("--device", default="nvidia")
    p.add_argument("--model", required=True, help="model dir with a config.json")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--num-blocks", type=int, default=512)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--enable-graph", action="store_true")
    p.add_argument("--enable-paged-attn", action="store_true",
                   help="accepted; the simulator always models the paged KV cache")
    p.add_argument("--attn", default="default")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"),
                   help="accepted; both are 2 bytes, so the model's own dtype sets the sizes")
    p.add_argument("--ignore-eos", action="store_true",
                   help="accepted; simulated requests always run to max_tokens (no EOS model)")
    p.add_argument("--disable-prefix-caching", action="store_true",
                   help="turn off block-level prefix caching (upstream InfiniLM's flag)")
    p.add_argument("--gpu", default="rtx4090", help="GPU profile (tuner.sim.profiles)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="simulated seconds per wall second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jitter", type=float, default=0.0,
                   help="relative std-dev of seeded noise on every step time")
    p.add_argument("--faults", metavar="SPEC", default="",
                   help="seeded fault injection, e.g. 'http500=0.1,cut=0.1,seed=3' "
                        "(tuner.sim.faults; default: $TUNER_SIM_FAULTS)")
    return p


def _env_int(env: Mapping[str, str], name: str, low: int) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{name}={raw!r} is not an integer") from None
    if value < low:
        raise UsageError(f"{name}={value} must be >= {low}")
    return value


def _env_bool(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _strip_program(argv: Sequence[str]) -> list[str]:
    """Drop a leading program (`python -m tuner.sim`, `inference_server.py`) before the flags."""
    args = list(argv)
    while args and not args[0].startswith("-"):
        args.pop(0)
    if args[:2] == ["-m", "tuner.sim"]:
        args = _strip_program(args[2:])
    return args


def parse_config(argv: Sequence[str], env: Mapping[str, str]) -> SimConfig:
    """Parse flags and env; a malformed flag or variable is a `UsageError`."""
    parser = build_parser()
    try:
        ns = parser.parse_args(_strip_program(argv))
    except SystemExit as exc:
        if exc.code == 0:  # --help: printed, nothing to run
            raise
        raise UsageError(f"bad simulator arguments: {' '.join(argv)}") from None
    for flag in ("tp", "max_new_tokens", "num_blocks", "block_size", "max_batch_size"):
        if getattr(ns, flag) < 1:
            raise UsageError(f"--{flag.replace('_', '-')} must be >= 1")
    if ns.time_scale <= 0 or ns.jitter < 0:
        raise UsageError("--time-scale must be > 0 and --jitter >= 0")
    knobs = SchedulerKnobs(
        max_batch_size=ns.max_batch_size,
        prefill_batch_cap=_env_int(env, "INFINILM_PREFILL_BATCH_CAP", 1),
        decode_batch_cap=_env_int(env, "INFINILM_DECODE_BATCH_CAP", 1),
        long_context_threshold=_env_int(env, "INFINILM_LONG_CONTEXT_THRESHOLD", 1),
        long_context_max_batch=_env_int(env, "INFINILM_LONG_CONTEXT_MAX_BATCH", 1),
        long_context_use_total_len=_env_bool(env, "INFINILM_LONG_CONTEXT_USE_TOTAL_LEN"),
        decode_first_when_running=_env_bool(env, "INFINILM_DECODE_FIRST_WHEN_RUNNING"),
        max_num_batched_tokens=_env_int(env, "INFINILM_MAX_NUM_BATCHED_TOKENS", 1),
    )
    return SimConfig(
        model=ns.model,
        gpu=ns.gpu,
        host=ns.host,
        port=ns.port,
        tp=ns.tp,
        max_new_tokens=ns.max_new_tokens,
        num_blocks=ns.num_blocks,
        block_size=ns.block_size,
        enable_graph=ns.enable_graph,
        knobs=knobs,
        time_scale=ns.time_scale,
        seed=ns.seed,
        jitter=ns.jitter,
        prefix_caching=not ns.disable_prefix_caching,
        faults=ns.faults or env.get("TUNER_SIM_FAULTS", ""),
    )
