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


def test_some_failed_requests_are_flaky_but_an_engine_death_wins():
    partial = Evidence(log_text="", became_healthy=True, exit_code=None, health_failed=False,
                       cell_errors=("partial",),
                       first_error="2 of 64 requests failed; first: HTTP 500")
    out = classify(partial, PATTERNS)
    assert out.kind == "flaky" and not out.feasible and "2 of 64" in out.reason
    dead = Evidence(log_text="Error in step loop", became_healthy=True, exit_code=None,
                    health_failed=True, cell_errors=("partial",))
    assert classify(dead, PATTERNS).kind == "unhealthy"


def test_a_health_flap_alone_is_flaky_and_a_refusal_stays_rejected():
    flap = Evidence(log_text="", became_healthy=True, exit_code=None, health_failed=False,
                    cell_errors=(), health_flaps=1)
    assert classify(flap, PATTERNS).kind == "flaky"
    assert classify(ev(errors=["http_error"]), PATTERNS).kind == "rejected"


def test_a_foreign_process_on_the_gpu_overrides_even_an_oom():
    grabbed = Evidence(log_text="cudaMalloc failed", became_healthy=True, exit_code=None,
                       health_failed=False, cell_errors=(), foreign_pids=(4242,))
    out = classify(grabbed, PATTERNS)
    assert out.kind == "gpu_busy" and "4242" in out.reason


def test_a_port_taken_at_every_launch_is_named():
    out = classify(ev("OSError: [Errno 98] address already in use", healthy=False, code=1),
                   PATTERNS)
    assert out.kind == "startup" and "port" in out.reason
