"""scripts/bench/benchmark_alpasim.py end to end with the demo model on the Transformers backend (CPU)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import load_script

pytest.importorskip("carla_driver_interface")


def test_rollouts_at_once_are_timed_chunk_by_chunk(tmp_path, single_thread):
    bench = load_script("bench/benchmark_alpasim")
    out = tmp_path / "alpasim.json"
    records = bench.main(["--sessions", "2", "--chunks", "1", "--out", str(out), "backend=hf", "device=cpu"])
    [record] = records
    assert (record["sessions"], record["model"], record["backend"]) == (2, "demo", "transformers")
    assert record["chunk_max_s"] >= record["chunk_p90_s"] >= record["chunk_p50_s"] > 0
    assert record["realtime_x"] == pytest.approx(0.8 / record["chunk_p50_s"])
    assert record["frames_per_s"] == pytest.approx(2 * 13 / record["wall_s"])
    # who waits: no GPU here, no engine-core process on the Transformers backend, the client's threads busy
    assert record["gpu_busy_pct"] is None and record["engine_core_cpu"] is None and record["client_cpu"] > 0.1
    # the demo model's 144 tokens a frame: one pass each decoded sequentially, fewer speculatively
    sequential = record["decoding"] == "sequential"
    assert sequential and record["passes_per_frame"] == 144 or not sequential and 1 <= record["passes_per_frame"] < 144
    assert json.loads(out.read_text()) == json.loads(json.dumps(records))


def test_bad_arguments():
    bench = load_script("bench/benchmark_alpasim")
    for argv in (["--sessions", "1,x"], ["--chunks", "0"], ["--rounds", "0"], ["--map", "yes"]):
        with pytest.raises(SystemExit):
            bench.parse_args(argv)
    assert bench.parse_args(["--sessions", "1,16", "backend=vllm"]).overrides == ["backend=vllm"]
    assert bench.parse_args(["--map", "both", "--rounds", "3"]).map == "both"


@pytest.mark.parametrize("sessions, engine_rollouts", [(1, None), (3, None), (1, 16)])
def test_the_server_is_built_as_terra_alpasim_builds_it(monkeypatch, sessions, engine_rollouts):
    """The benchmark's engine has the room terra-alpasim gives it (alpasim.max_sessions: one session, the engine of one
    rollout), not vLLM's default of 64, and its decoding is chosen for as many: the single-session figures measure
    the server users run. ``--engine-rollouts``: a server made for more sessions than it serves."""
    bench = load_script("bench/benchmark_alpasim")
    asked = []

    def resolve_backend_run(spec, streams, model, refiner, max_rollouts):
        asked.append((streams, max_rollouts))
        raise KeyboardInterrupt  # the engine's size is all this test needs

    monkeypatch.setattr("terra.run.resolve_backend_run", resolve_backend_run)
    with pytest.raises(KeyboardInterrupt):
        bench.build(["backend=hf", "device=cpu"], sessions, engine_rollouts)
    assert asked == [(engine_rollouts or sessions,) * 2]  # decoding chosen for the room it has
    assert bench.parse_args(["--engine-rollouts", "16"]).engine_rollouts == 16
    with pytest.raises(SystemExit):
        bench.parse_args(["--engine-rollouts", "0"])
