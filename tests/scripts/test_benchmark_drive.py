"""scripts/bench/benchmark_drive.py end to end on a tiny random model (the Transformers backend on the CPU): the loop's
drives and the same rollouts batched give the same codes."""

from __future__ import annotations

import json

from tests.conftest import load_script


def test_drives_and_batch_rollouts_give_the_same_codes(tmp_path, single_thread):
    bench = load_script("bench/benchmark_drive")
    out = tmp_path / "drive.json"
    bench.main(["--model", "tiny", "--drives", "2", "--steps", "2", "--policies", "lane_follower,constant_speed",
                "--out", str(out)])
    record = json.loads(out.read_text())
    assert record["identical_codes"] and record["drives"] == 2 and record["steps"] == 2
    assert record["loop_engine_frames_per_s"] > 0 and record["batch_frames_per_s"] > 0
    wall = record["drives"] * record["steps"] / record["loop_wall_frames_per_s"]
    assert 0 < record["policy_phase_s"] < wall - record["engine_s"] - record["decode_s"]  # the loop's own plan phase
