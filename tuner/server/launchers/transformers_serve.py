"""`python -m tuner.server.launchers.transformers_serve serve MODEL ...`: `transformers serve`
plus two
things its command line lacks.

- A GPU memory cap, `TUNER_GPU_MEMORY_CAP_GIB`: to tune for a 24 GiB card on a 141 GiB one the
  OOMs must be those of the small card. `torch.cuda.set_per_process_memory_fraction` makes the
  caching allocator refuse past the cap, so they are real `torch.OutOfMemoryError`s. (transformers'
  own start-up check and KV auto-sizing read `torch.cuda.mem_get_info`, which is capped too.)
- `ContinuousBatchingConfig` fields that have no `--cb-*` flag, from `TUNER_CB_<FIELD>` variables
  (`TUNER_CB_SCHEDULER_TYPE=prefill_first`, `TUNER_CB_MAX_REQUESTS_PER_BATCH=64`), so that a search
  space can sample them as `env` parameters. They are set in the config's `__post_init__`, so every
  config the server builds gets them, whether or not a `--cb-*` flag was given.

Everything after the program name goes to the transformers CLI unchanged. A bad variable exits
with status 2 before the model is loaded, so a typo never silently tunes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

CAP_ENV = "TUNER_GPU_MEMORY_CAP_GIB"
CB_PREFIX = "TUNER_CB_"


class LauncherError(Exception):
    """A setting the launcher cannot apply; one line for the server log."""


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


# The ContinuousBatchingConfig fields (transformers 5.17) that `transformers serve` has no flag
# for and that change scheduling or memory, with how to read each from a string.
CB_FIELDS: dict[str, Callable[[str], Any]] = {
    "scheduler_type": str,
    "max_requests_per_batch": int,
    "safety_margin": float,
    "max_blocks_per_request": int,
    "allow_block_sharing": _bool,
    "use_async_batching": _bool,
    "default_compile_level": int,
    "max_queue_size": int,
}


def cb_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """The `TUNER_CB_<FIELD>` variables of `environ` as typed ContinuousBatchingConfig values."""
    out: dict[str, Any] = {}
    for key, text in sorted(environ.items()):
        if not key.startswith(CB_PREFIX):
            continue
        name = key[len(CB_PREFIX):].lower()
        parse = CB_FIELDS.get(name)
        if parse is None:
            raise LauncherError(f"{key}: no settable ContinuousBatchingConfig field {name!r} "
                                f"(known: {', '.join(sorted(CB_FIELDS))})")
        try:
            out[name] = parse(text)
        except ValueError as exc:
            raise LauncherError(f"{key}={text!r}: {exc}") from None
    return out


def memory_cap_gib(environ: Mapping[str, str]) -> float | None:
    """The cap in GiB from `TUNER_GPU_MEMORY_CAP_GIB`, or None when unset or empty."""
    text = environ.get(CAP_ENV, "").strip()
    if not text:
        return None
    try:
        cap = float(text)
    except ValueError:
        raise LauncherError(f"{CAP_ENV}={text!r}: not a number") from None
    if cap <= 0:
        raise LauncherError(f"{CAP_ENV}={text!r}: must be > 0")
    return cap


def device_index(argv: Sequence[str]) -> int:
    """The CUDA device index named by `--device cuda:N` (or `--device=cuda:N`); 0 otherwise."""
    value = ""
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--device="):
            value = arg.split("=", 1)[1]
    head, _, index = value.partition(":")
    return int(index) if head == "cuda" and index.isdigit() else 0


def apply_memory_cap(cap_gib: float, device: int) -> float:
    """Make this process see a card of `cap_gib`; returns the fraction of the real card.

    The caching allocator refuses past the cap (real `torch.OutOfMemoryError`s), and
    `torch.cuda.mem_get_info` reports the small card's total and free memory, which is what
    transformers' KV-cache auto-sizing and its start-up footprint check read
    (continuous_batching/requests.py, get_device_and_memory_breakdown, transformers 5.17).
    """
    import torch

    total = torch.cuda.get_device_properties(device).total_memory
    cap = min(total, int(cap_gib * 2**30))
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    real_mem_get_info = torch.cuda.mem_get_info

    def capped_mem_get_info(dev: Any = None) -> tuple[int, int]:
        free, real_total = real_mem_get_info(dev)
        return max(0, cap - (real_total - free)), cap

    torch.cuda.mem_get_info = capped_mem_get_info  # type: ignore[assignment]
    return cap / total


def install_cb_overrides(config_cls: type, overrides: Mapping[str, Any]) -> None:
    """Make every `config_cls(...)` start from `overrides` before its own `__post_init__` runs."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    missing = sorted(set(overrides) - names)
    if missing:
        raise LauncherError(f"{config_cls.__name__} of this transformers has no field(s) {missing}")
    original = getattr(config_cls, "__post_init__")  # noqa: B009 - a dataclass hook mypy cannot see
    values = dict(overrides)

    def __post_init__(self: Any) -> None:
        for name, value in values.items():
            setattr(self, name, value)
        original(self)

    setattr(config_cls, "__post_init__", __post_init__)  # noqa: B010


def main(argv: Sequence[str] | None = None) -> int:
    """Apply the cap and the overrides, then run `transformers <argv>`."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        overrides = cb_overrides(os.environ)
        cap = memory_cap_gib(os.environ)
        if cap is not None:
            fraction = apply_memory_cap(cap, device_index(args))
            print(f"[tuner launcher] GPU memory cap {cap:g} GiB ({fraction:.4f} of the card)",
                  flush=True)
        if overrides:
            from transformers.generation.configuration_utils import ContinuousBatchingConfig

            install_cb_overrides(ContinuousBatchingConfig, overrides)
            print(f"[tuner launcher] ContinuousBatchingConfig overrides: {overrides}", flush=True)
    except LauncherError as exc:
        print(f"tuner.server.launchers.transformers_serve: error: {exc}", file=sys.stderr)
        return 2
    from transformers.cli.transformers import main as transformers_main

    sys.argv = ["transformers", *args]
    transformers_main()
    return 0


if __name__ == "__main__":
    sys.exit(main())
