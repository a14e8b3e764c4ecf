"""Smoke test of scripts/bench/benchmark_study_plan.py: study=gpu's plan from its config and a few short drives
measured."""

from __future__ import annotations

import json
import sys

from tests.conftest import load_script


def test_the_plan_counts_the_presets_frames_and_measures_the_cpus_part(tmp_path, monkeypatch):
    script = load_script("bench/benchmark_study_plan")
    out = tmp_path / "plan.json"
    monkeypatch.setattr(sys, "argv", ["benchmark_study_plan", "--scenarios", "1", "--steps", "3", "--out", str(out)])
    script.main()
    plan = json.loads(out.read_text())
    assert plan["frames"] == {"model": 16 * 15 * 200, "truth": 16 * 15 * 200, "model_controls": 2 * 4 * 15 * 200,
                              "scene_controls": 10 * 4 * 15 * 200}  # conf/study/gpu.yaml
    assert (plan["preset"]["engine"], plan["preset"]["scene"], plan["preset"]["writers"]) == (4, 6, 2)
    measured = plan["measured_here"]
    assert measured["drives"] == 15 and measured["frames"] == 45 and measured["measured_frame_s"] > 0
    assert plan["least_wall_s"]["scene_shards"] == plan["cpu_s"]["scene_shards"] / 6
