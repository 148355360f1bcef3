"""Seeded faults for the simulated server: what a long study meets on a real box.

`--faults SPEC` (or `TUNER_SIM_FAULTS=SPEC`), e.g. `http500=0.2,cut=0.2,seed=7`: each server
start draws at most one fault kind, kind K with probability `K=P` (the probabilities must sum
to at most 1).  One fault per server keeps the evidence attributable, so a soak can check that
every trial's outcome is the one its fault calls for.  Kinds:

* request faults, on `count` requests (default 2) drawn among requests `after` ..
  `after + span - 1` (`after` spares a client's warm-up): `http500` answers 500, `cut` closes
  the connection after the first token chunk, `malformed` sends an event that is not JSON;
* `flap`: /health answers 503 to the next `flap_probes` probes (default 2) after request `after`,
  then 200 again;
* `slow_start`: start-up takes `slow_start_s` more simulated seconds (default 3600);
* `port_taken`: a foreign socket listens on the port before the server binds it, so the bind
  fails for real (EADDRINUSE) and the process exits;
* `gpu_grab`: a foreign process appears on the simulated GPU (`TUNER_SIM_NVML`, tuner.server.gpu)
  after request `after` and holds `grab_mib` MiB (default 4096) for `grab_s` wall seconds.

Every injected fault is logged as one `sim fault: KIND ...` line, the soak's ground truth; the
tuner judges only by what it observes (HTTP answers, streams, /health, NVML), never by that line.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

from tuner.errors import UsageError

FAULT_ENV = "TUNER_SIM_FAULTS"
REQUEST_KINDS = ("http500", "cut", "malformed")
KINDS = (*REQUEST_KINDS, "flap", "slow_start", "port_taken", "gpu_grab")
_OPTIONS = {"seed": 0, "count": 2, "after": 0, "span": 16, "flap_probes": 2,
            "slow_start_s": 3600.0, "grab_mib": 4096, "grab_s": 3.0}


@dataclass(frozen=True)
class FaultSpec:
    """Probabilities per kind and the options; an empty spec injects nothing."""

    rates: Mapping[str, float] = field(default_factory=dict)
    options: Mapping[str, float] = field(default_factory=dict)

    def opt(self, name: str) -> float:
        return self.options.get(name, _OPTIONS[name])


def parse_spec(text: str) -> FaultSpec:
    """`kind=P,...,option=V,...` -> FaultSpec; anything else is a `UsageError`."""
    rates: dict[str, float] = {}
    options: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, sep, raw = item.partition("=")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not sep or value < 0 or (name not in KINDS and name not in _OPTIONS):
            raise UsageError(f"fault spec: bad item {item!r} (kinds: {', '.join(KINDS)}; "
                             f"options: {', '.join(_OPTIONS)})")
        (rates if name in KINDS else options)[name] = value
    if sum(rates.values()) > 1 + 1e-9:
        raise UsageError(f"fault spec: probabilities sum to {sum(rates.values()):g} > 1")
    return FaultSpec(rates, options)


class ServerFaults:
    """The faults of one server start: which kind (if any) and which requests it hits."""

    def __init__(self, spec: FaultSpec, port: int) -> None:
        # seeded per port so that servers of one study differ; equal seed and port, equal faults
        rng = random.Random(f"{spec.opt('seed'):g}:{port}")
        draw, self.kind = rng.random(), None
        for kind in KINDS:
            p = spec.rates.get(kind, 0.0)
            if draw < p:
                self.kind = kind
                break
            draw -= p
        self.spec = spec
        after, span = int(spec.opt("after")), max(1, int(spec.opt("span")))
        count = min(int(spec.opt("count")), span)
        self.hit = set(rng.sample(range(after, after + span), count)) \
            if self.kind in REQUEST_KINDS else set()
        self._flap_left = 0

    def describe(self) -> str:
        if self.kind in REQUEST_KINDS:
            return f"sim fault: {self.kind} on requests {sorted(self.hit)}"
        return f"sim fault: {self.kind}"

    def request_fault(self, index: int) -> str | None:
        """The fault for the `index`-th request (0-based, in arrival order), if any."""
        if index in self.hit:
            return self.kind
        if index == int(self.spec.opt("after")) and self.kind == "flap":
            self._flap_left = int(self.spec.opt("flap_probes"))
        return None

    def health_flaps(self) -> bool:
        """True: answer this probe 503 (a flap in progress)."""
        if self._flap_left > 0:
            self._flap_left -= 1
            return True
        return False

    @property
    def grab_at(self) -> int | None:
        return int(self.spec.opt("after")) if self.kind == "gpu_grab" else None

    def take_port(self, host: str, port: int) -> socket.socket | None:
        """For `port_taken`: a listening socket on the port, held until the process exits."""
        if self.kind != "port_taken":
            return None
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, port))
        sock.listen(1)
        return sock
