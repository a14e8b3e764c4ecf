"""scripts/bench/benchmark_memory_table.py: the table's rows and ratios from case records, and its CPU smoke path (one
case in its own process: the tiny refiner; a card's peaks are the GPU run's)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


@pytest.fixture(scope="module")
def table():
    return load_script("bench/benchmark_memory_table")


def vllm_case(cap: str, peak: float, s_per_frame: float, batch: float, sessions: float, **settings) -> dict:
    return {"workflow": "vllm", "cap": cap, "peak_gib": peak, "record": {
        "settings": settings, "generate_1": {"s_per_frame": s_per_frame}, "generate_batch": {"frames_per_s": batch},
        "sessions": {"frames_per_s": sessions}}}


def test_rows_ratios_and_failures(table):
    """Speeds against the uncapped case (a time: uncapped / capped; a rate: capped / uncapped), the plan's settings,
    and a failed case's error in place of its speed."""
    cases = [vllm_case("uncapped", 71.9, 1.0, 20.0, 8.0),
             vllm_case("16GiB", 14.2, 1.25, 10.0, 8.0, quantization="fp8", kv_cache_dtype="fp8",
                       gpu_memory_utilization=0.163, max_num_seqs=32, enforce_eager=False),
             {"workflow": "refine", "cap": "uncapped", "peak_gib": 11.6, "record": {"cases": [{"seconds": 8.0}]}},
             {"workflow": "refine", "cap": "16GiB", "peak_gib": 11.6, "record": {"cases": [{"seconds": 10.0}]}},
             {"workflow": "score", "cap": "16GiB", "peak_gib": None, "error": "torch.OutOfMemoryError: CUDA out of "
                                                                                 "memory"}]
    lines = table.markdown(cases).splitlines()
    assert lines[0].startswith("| workflow | cap | peak GPU memory (GiB) |") and len(lines) == 2 + 3 + 3 + 2 + 1
    assert "| generate, 1 rollout | 16GiB | 14.2 | 1.25 s/frame | 0.80x | quantization=fp8, kv_cache_dtype=fp8, " \
           "gpu_memory_utilization=0.163, max_num_seqs=32 |" in lines
    assert "| generate, batch | 16GiB | 14.2 | 10 frames/s | 0.50x |" in " ".join(lines)
    assert "| sessions | uncapped | 71.9 | 8 frames/s | 1.00x | - |" in lines
    assert "| refine, one sample | 16GiB | 11.6 | 10 s | 0.80x | - |" in lines
    assert "| score | 16GiB | - | torch.OutOfMemoryError: CUDA out of memory |  | - |" in lines


def test_alpasim_rows(table):
    """The AlpaSim server's two rows: frames/s of its rollouts in all (a rate) and the 8-frame chunk's p50 (a time),
    each against the uncapped case; the plan's settings shown."""
    def case(cap: str, peak: float, rate: float, chunk: float, **settings) -> dict:
        alpasim = {"sessions": 8, "frames_per_s": rate, "chunk_p50_s": chunk}
        record = {"settings": settings, "alpasim": alpasim}
        return {"workflow": "alpasim", "cap": cap, "peak_gib": peak, "record": record}

    lines = table.markdown([case("uncapped", 70.0, 40.0, 0.5, max_num_seqs=64),
                            case("16GiB", 14.8, 30.0, 0.8, kv_cache_dtype="fp8", max_num_seqs=8)]).splitlines()
    assert "| AlpaSim server, 8 rollouts | 16GiB | 14.8 | 30 frames/s | 0.75x | kv_cache_dtype=fp8, max_num_seqs=8 |" \
        in lines
    assert "| AlpaSim server, 8-frame chunk p50 | 16GiB | 14.8 | 0.8 s | 0.62x | kv_cache_dtype=fp8, max_num_seqs=8 |" \
        in lines
    assert "| AlpaSim server, 8-frame chunk p50 | uncapped | 70.0 | 0.5 s | 1.00x | max_num_seqs=64 |" in lines


@pytest.mark.slow  # about 35 s on 2 cores: the subprocess imports the refiner's stack
def test_cpu_smoke_runs_a_case_in_its_own_process(table, tmp_path):
    out = tmp_path / "memory.json"
    result = table.main(["--device", "cpu", "--workflows", "refine", "--caps", "uncapped", "--out", str(out),
                         "--timeout-s", "300"])
    (case,) = result["cases"]
    assert "error" not in case, case
    assert case["record"]["cases"][0]["frames"] == 5 and case["record"]["cases"][0]["seconds"] > 0
    assert case["peak_gib"] is None  # no card
    assert json.loads(out.read_text())["table"] == result["table"]
    assert "| refine, one sample | uncapped | - |" in result["table"]


def test_a_failed_case_keeps_the_lines_above_its_last(table, monkeypatch):
    """A worker that fails keeps its last line as the error and the non-INFO lines before it (vLLM's last line only
    points at the root cause above it), and a failure that is not out of memory is not reported as one."""
    import argparse
    import subprocess

    stderr = "\n".join(["INFO 11-26 [core.py] starting", "ValueError: Free memory on device (9.1 GiB) is less than "
                        "desired GPU memory utilization", "(EngineCore pid=7) INFO 11-26 [core.py] shutdown",
                        "RuntimeError: Engine core initialization failed. See root cause above."])
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", stderr))
    args = argparse.Namespace(device="cpu", frames=2, batch=1, sessions=1, videos=1, eager=False, models=None,
                              timeout_s=5)
    case = table.run_case("vllm", "16GiB", args)
    assert case["error"] == "RuntimeError: Engine core initialization failed. See root cause above."
    assert case["stderr_tail"] == [stderr.splitlines()[1], stderr.splitlines()[3]]
    assert case["out_of_memory"] is False and "record" not in case
