"""Optuna's log under `tuner tune`: a Ctrl-C is one line, not a traceback.

Why: Optuna catches the KeyboardInterrupt of a running trial, marks the trial FAIL, logs a
warning with the full traceback and the trial's parameters, then "failed with value None", and
re-raises.  Under `tune` that interrupt is the user's (or a timeout's SIGINT/SIGTERM): the
traceback of whatever the trial was waiting on (on the H200 records, a health poll's sleep)
reads as a crash, printed just before `tuner tune: interrupted; servers stopped`.  Any other
failure keeps Optuna's message and traceback.
"""

from __future__ import annotations

import logging

OPTIMIZE_LOGGER = "optuna.study._optimize"   # where Optuna logs a failed trial


class InterruptedTrialFilter(logging.Filter):
    """Rewrites Optuna's warning for a trial stopped by KeyboardInterrupt to one line and drops
    its "failed with value None" follow-up; passes everything else unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self._interrupted: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        number = message.split(" ", 2)[1] if message.startswith("Trial ") else ""
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, KeyboardInterrupt):
            self._interrupted.add(number)
            record.msg = (f"Trial {number} interrupted: not counted as measured; the same "
                          "command resumes the study")
            record.args = None
            record.exc_info = None
            record.exc_text = None
            return True
        return not (number in self._interrupted and "failed with value" in message)


def quiet_interrupts() -> None:
    """Install the filter on Optuna's trial logger (once per process)."""
    logger = logging.getLogger(OPTIMIZE_LOGGER)
    if not any(isinstance(f, InterruptedTrialFilter) for f in logger.filters):
        logger.addFilter(InterruptedTrialFilter())
