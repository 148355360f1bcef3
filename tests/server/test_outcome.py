"""Outcome classification: the log proves an OOM; other signals say how a server failed."""

from tuner.server.outcome import Evidence, classify

PATTERNS = {
    "oom": ["cudaMalloc failed", "CUDA out of memory"],
    "startup": ["Application startup failed"],
    "unhealthy": ["Error in step loop"],
    "crash": ["Segmentation fault"],
}


def ev(log="", healthy=True, code=None, health_failed=False, errors=()):
    return Evidence(log_text=log, became_healthy=healthy, exit_code=code,
                    health_failed=health_failed, cell_errors=tuple(errors))


def test_clean_run_is_ok():
    assert classify(ev(), PATTERNS).kind == "ok"


def test_oom_under_load_from_log_even_when_health_failed():
    out = classify(ev("x\n[rank 0] exception during forward: cudaMalloc failed\n", health_failed=True,
                      errors=["unhealthy"]), PATTERNS)
    assert out.kind == "oom" and "under load" in out.reason and "cudaMalloc" in out.reason


def test_oom_at_startup():
    out = classify(ev("Error Code 2 in cudaMalloc failed\nApplication startup failed. Exiting.",
                      healthy=False, code=3), PATTERNS)
    assert out.kind == "oom" and "start-up" in out.reason


def test_startup_failure_without_oom():
    out = classify(ev("Application startup failed. Exiting.", healthy=False, code=3), PATTERNS)
    assert out.kind == "startup" and "exit status 3" in out.reason


def test_native_crash_by_signal_with_silent_log():
    out = classify(ev("", code=-11, errors=["server_died"]), PATTERNS)
    assert out.kind == "crash" and "SIGSEGV" in out.reason


def test_unhealthy_without_oom_line():
    out = classify(ev("Error in step loop: boom", health_failed=True, errors=["unhealthy"]), PATTERNS)
    assert out.kind == "unhealthy"


def test_hang():
    assert classify(ev(errors=["hang"]), PATTERNS).kind == "hang"
