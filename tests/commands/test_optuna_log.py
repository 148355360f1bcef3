"""A Ctrl-C'd trial is one line in Optuna's log; every other failure keeps its traceback."""

import logging
import sys

from tuner.commands.optuna_log import InterruptedTrialFilter


def _record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = None
    if exc is not None:
        try:
            raise exc
        except BaseException:  # noqa: BLE001 - the record needs a real exc_info
            info = sys.exc_info()
    return logging.LogRecord("optuna.study._optimize", logging.WARNING, __file__, 1, msg,
                             None, info)


def test_an_interrupted_trial_is_one_line_and_its_follow_up_is_dropped():
    f = InterruptedTrialFilter()
    first = _record("Trial 9 failed with parameters: {'x': 1} because of the following error: "
                    "KeyboardInterrupt().", KeyboardInterrupt())
    assert f.filter(first)
    assert first.exc_info is None and first.getMessage().startswith("Trial 9 interrupted")
    assert not f.filter(_record("Trial 9 failed with value None."))


def test_other_failures_keep_their_message_and_traceback():
    f = InterruptedTrialFilter()
    f.filter(_record("Trial 9 failed with parameters: {} because of ...", KeyboardInterrupt()))
    crash = _record("Trial 3 failed with parameters: {} because of the following error: "
                    "ValueError('x').", ValueError("x"))
    assert f.filter(crash) and crash.exc_info is not None
    assert f.filter(_record("Trial 3 failed with value None."))
    assert f.filter(_record("anything else"))
