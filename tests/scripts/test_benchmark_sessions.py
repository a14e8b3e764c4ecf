"""scripts/bench/benchmark_sessions.py end to end on a tiny random model (the Transformers backend on the CPU)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script


def test_sessions_and_batch_rollouts_give_the_same_codes(tmp_path, single_thread):
    bench = load_script("bench/benchmark_sessions")
    out = tmp_path / "sessions.json"
    records = bench.main(["--model", "tiny", "--sessions", "1,3", "--frames", "3", "--batch", "--out", str(out)])
    assert [r["sessions"] for r in records] == [1, 3]
    for record in records:
        assert record["identical"] and record["frames_per_s"] > 0 and record["batch_frames_per_s"] > 0
        assert record["first_frame_s"] > 0 and record["latency_p90_s"] >= record["latency_p50_s"] > 0
    assert json.loads(out.read_text())["records"] == json.loads(json.dumps(records))


def test_bad_arguments():
    bench = load_script("bench/benchmark_sessions")
    with pytest.raises(SystemExit):
        bench.parse_args(["--sessions", "1,x"])
    with pytest.raises(SystemExit):  # a request path is vLLM's
        bench.parse_args(["--requests", "streaming"])
    assert bench.parse_args(["--backend", "vllm", "--requests", "streaming"]).requests == "streaming"
    with pytest.raises(bench.TerraInputError, match="--backend vllm"):
        bench.main(["--model", "terra", "--backend", "hf"])
