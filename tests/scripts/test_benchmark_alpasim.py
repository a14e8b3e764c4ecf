"""scripts/benchmark_alpasim.py end to end with the demo model on the Transformers backend (CPU)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script

pytest.importorskip("carla_driver_interface")


def test_rollouts_at_once_are_timed_chunk_by_chunk(tmp_path, single_thread):
    bench = load_script("benchmark_alpasim")
    out = tmp_path / "alpasim.json"
    records = bench.main(["--sessions", "2", "--chunks", "1", "--out", str(out), "backend=hf", "device=cpu"])
    [record] = records
    assert (record["sessions"], record["model"], record["backend"]) == (2, "demo", "transformers")
    assert record["chunk_max_s"] >= record["chunk_p90_s"] >= record["chunk_p50_s"] > 0
    assert record["realtime_x"] == pytest.approx(0.8 / record["chunk_p50_s"])
    assert record["frames_per_s"] == pytest.approx(2 * 13 / record["wall_s"])
    # the demo model's 144 tokens a frame: one pass each decoded sequentially, fewer speculatively
    sequential = record["decoding"] == "sequential"
    assert sequential and record["passes_per_frame"] == 144 or not sequential and 1 <= record["passes_per_frame"] < 144
    assert json.loads(out.read_text()) == json.loads(json.dumps(records))


def test_bad_arguments():
    bench = load_script("benchmark_alpasim")
    for argv in (["--sessions", "1,x"], ["--chunks", "0"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert bench.parse_args(["--sessions", "1,16", "backend=vllm"]).overrides == ["backend=vllm"]
