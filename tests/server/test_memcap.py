"""--gpu-memory-cap for servers that cannot cap themselves: the ballast process and its plumbing.

The allocation itself needs a GPU (it ran on the H200, benchmarks/results/infinilm-h200); here:
how the cap reaches each kind of server, the free-memory target, that a ballast that cannot
start is reported and leaves no process, and that the tuner's own ballast does not count as a
foreign process holding the card.
"""

from __future__ import annotations

import pytest

from tuner.server import memcap as ballast, gpu
from tuner.cli import main
from tuner.errors import FaultError, UsageError
from tuner.server.gpu import GpuState, wait_until_free
from tuner.server.process import processes_matching
from tuner.paths import REPO_ROOT
from tuner.search.space_file import load_space

GIB = 2**30
INFINILM = load_space(REPO_ROOT / "search_spaces" / "infinilm.yaml")
TRANSFORMERS = load_space(REPO_ROOT / "search_spaces" / "transformers.yaml")
H200 = GpuState(index=0, name="H200", total_bytes=140 * GIB, used_bytes=GIB // 2, pids=())


def test_spaces_say_how_the_cap_reaches_their_server():
    assert INFINILM.server.memory_cap == "ballast"      # no per-process limit in InfiniLM
    assert TRANSFORMERS.server.memory_cap == "env"      # tuner's launcher caps itself


def test_bad_memory_cap_value_is_refused(tmp_path):
    text = (REPO_ROOT / "search_spaces" / "infinilm.yaml").read_text().replace(
        "  health_path: /health\n", "  health_path: /health\n  memory_cap: fraction\n")
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match="server.memory_cap"):
        load_space(path)


def test_env_servers_and_the_simulator_get_the_variable_and_no_ballast():
    with ballast.memory_cap(TRANSFORMERS, "24GiB", H200) as cap:
        assert cap.env == {"TUNER_GPU_MEMORY_CAP_GIB": "24"} and cap.held_bytes == 0
        assert cap.idle is H200
    with ballast.memory_cap(INFINILM, "24GiB", None, simulate=True) as cap:
        assert cap.held_bytes == 0 and cap.idle is None
    with ballast.memory_cap(INFINILM, None, H200) as cap:
        assert cap.env == {} and cap.held_bytes == 0


def test_ballast_needs_nvml():
    with pytest.raises(UsageError, match="NVML does not see the GPU"):
        with ballast.memory_cap(INFINILM, "24GiB", None):
            pass


def test_free_memory_target_is_the_small_card_minus_what_the_idle_card_uses():
    assert ballast.target_free(24 * GIB, H200) == 24 * GIB - GIB // 2
    with pytest.raises(UsageError, match="not below the card"):
        ballast.target_free(141 * GIB, H200)


def test_a_ballast_that_cannot_hold_the_card_is_reported_and_leaves_nothing():
    """A real `python -m tuner.server.memcap` child on a machine where it cannot allocate (no CUDA
    here, or a negative target): its reason reaches the user and its process is gone."""
    cap = 0 if _cuda_available() else 24 * GIB
    with pytest.raises(UsageError, match="ballast process could not hold the GPU: (no CUDA|--leave)"):
        with ballast.hold(H200, cap):
            pass
    assert processes_matching("tuner.server.memcap") == []


def test_ballast_cli_refuses_a_negative_target(capsys):
    assert ballast.main(["--leave", "-1"]) == 2
    assert "--leave must be >= 0" in capsys.readouterr().err


def test_the_tuners_own_ballast_is_not_a_foreign_process(monkeypatch):
    held = GpuState(index=0, name="H200", total_bytes=140 * GIB, used_bytes=116 * GIB, pids=(4242,))
    monkeypatch.setattr(gpu, "read_gpu", lambda index=0: held)
    assert wait_until_free(0, held.used_bytes, timeout_s=0.0, known_pids=(4242,)) is held
    with pytest.raises(FaultError, match=r"busy .* processes \[4242\]"):
        wait_until_free(0, held.used_bytes, timeout_s=0.0)


def test_tune_with_a_cap_and_no_visible_gpu_is_refused_before_anything_is_written(tmp_path, capsys,
                                                                                   monkeypatch):
    monkeypatch.setattr("tuner.commands.tune.read_gpu", lambda index=0: None)
    studies = tmp_path / "studies"
    rc = main(["tune", "--model", str(REPO_ROOT / "models" / "llama-3.1-8b"),
               "--gpu-memory-cap", "24GiB", "--studies-dir", str(studies), "--trials", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "NVML does not see the GPU" in err[0], err
    assert not studies.exists()


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())



def test_visible_gpu_index_follows_cuda_visible_devices():
    """A tuner started on the second card checks that card through NVML, not the first."""
    from tuner.server.gpu import visible_gpu_index

    assert visible_gpu_index({}) == 0
    assert visible_gpu_index({"CUDA_VISIBLE_DEVICES": "1"}) == 1
    assert visible_gpu_index({"CUDA_VISIBLE_DEVICES": " 3,0"}) == 3
    assert visible_gpu_index({"CUDA_VISIBLE_DEVICES": ""}) == 0


def test_a_gpu_or_mig_uuid_reads_its_card(monkeypatch):
    """A UUID is looked up through NVML; a MIG instance's handle has no index, its parent's has."""
    import tuner.server.gpu as gpu

    class FakeNvml:
        handles = {"GPU-b": "card1", "MIG-a": "mig-on-card2"}

        def nvmlDeviceGetHandleByUUID(self, uuid):
            return self.handles[uuid]

        def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle):
            return {"mig-on-card2": "card2"}[handle]

        def nvmlDeviceGetIndex(self, handle):
            return {"card1": 1, "card2": 2}[handle]

        def nvmlShutdown(self):
            pass

    monkeypatch.setattr(gpu, "_nvml", FakeNvml)
    assert gpu.visible_gpu_index({"CUDA_VISIBLE_DEVICES": "GPU-b"}) == 1
    assert gpu.visible_gpu_index({"CUDA_VISIBLE_DEVICES": "MIG-a,0"}) == 2
    assert gpu.visible_gpu_index({"CUDA_VISIBLE_DEVICES": "GPU-unknown"}) == 0
