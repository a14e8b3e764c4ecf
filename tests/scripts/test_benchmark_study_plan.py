"""Smoke test of scripts/bench/benchmark_study_plan.py: study=gpu's plan from its config and a few short drives
measured."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import load_script


def test_the_plan_counts_the_presets_frames_and_measures_the_cpus_part(tmp_path, monkeypatch):
    script = load_script("bench/benchmark_study_plan")
    out = tmp_path / "plan.json"
    monkeypatch.setattr(sys, "argv", ["benchmark_study_plan", "--scenarios", "1", "--steps", "3", "--out", str(out)])
    script.main()
    plan = json.loads(out.read_text())
    assert plan["frames"] == {"model": 16 * 15 * 200, "truth": 16 * 15 * 200, "model_controls": 4 * 4 * 15 * 200,
                              "scene_controls": 10 * 4 * 15 * 200}  # conf/study/gpu.yaml; the demo model has routes
    assert plan["exploit_frames"]["search"] == {"model": 9 * 8 * 200, "truth": 9 * 8 * 200}  # 9 candidates, 8 scenarios
    assert (plan["preset"]["engine"], plan["preset"]["scene"], plan["preset"]["writers"]) == (4, 6, 2)
    measured = plan["measured_here"]
    assert measured["drives"] == 15 and measured["frames"] == 45
    per_frame, parts = measured["per_frame_s"], measured["measured_by_part_s"]
    assert per_frame["truth"] == pytest.approx(per_frame["render"] + per_frame["policy_and_vehicle"])
    assert parts["kept"]["render"] < parts["rendered"]["render"]  # the renders its world made, taken as they are
    assert plan["cpu_s"]["all"] == pytest.approx(sum(plan["cpu_s"][k] for k in (
        "scene_shards", "engine_shards_besides_the_gpu", "exploitability")))
    projected = plan["projected_s"]
    assert projected["drives"] == max(projected["engines"], projected["exploitability_beside"],
                                      projected["cpu_work_on_all_cores"])
