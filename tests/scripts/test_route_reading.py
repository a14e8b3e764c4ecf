"""scripts/experiments/route_reading.py: its tokenizer and measurements on the true frames, and a run end to end at toy
size."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from terra.sim.clips import make_clip
from terra.sim.long_drives import reserved_scene_seeds
from terra.sim.scene import Scene
from tests.conftest import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "route_reading.py"
reading = load_script("experiments/route_reading")


def true_codes(seed: int, start_s: float, frames: int) -> tuple[np.ndarray, np.ndarray]:
    clip = make_clip(Scene.generate(seed), "straight", frames, reading.HEIGHT, reading.WIDTH,
                     speed_kmh=reading.SPEED_KMH, start_s=start_s)
    images = torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1
    return reading.RoadBandTokenizer().encode(images).numpy(), clip.routes


def test_the_measurements_see_the_true_road_bend_where_the_route_says():
    """In held-out scenes, the true frames' road (grey codes of the far rows) moves towards the side the route bends
    to, as the car drives straight on; the helpers' straight and mirrored routes keep the first point and bend
    nowhere / the other way."""
    scenarios = reading.bend_scenarios(6)
    assert len(scenarios) == 6 and {seed for seed, _, _ in scenarios} <= reserved_scene_seeds()
    shifts = []
    for seed, start_s, side in scenarios:
        codes, routes = true_codes(seed, start_s, reading.CONTEXT + reading.GENERATED)
        assert codes.shape[1:] == (8, 16) and 0 <= codes.min() and codes.max() < 64
        assert reading.roadness(codes[0, -1, 6:9]).all()  # the lane ahead, at the bottom of the band, is asphalt
        bend = routes[-1, :, 1] - routes[-1, 0, 1]
        assert np.sign(bend[-1]) == side  # the route's far end lies on the bend's side
        np.testing.assert_array_equal(reading.straight_routes(routes)[..., 1], routes[..., :1, 1].repeat(16, -1))
        np.testing.assert_allclose(reading.mirrored_routes(routes)[..., 1] - routes[..., :1, 1], -(
            routes[..., 1] - routes[..., :1, 1]), atol=1e-5)
        late = codes[reading.CONTEXT + reading.GENERATED // 2:]
        shifts.append(side * -(reading.road_centroid(late) - reading.road_centroid(codes[reading.CONTEXT - 1])))
    assert np.mean(shifts) > 0.2 and sum(s > 0 for s in shifts) >= 5


def test_a_toy_run_trains_both_models_and_reports(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--drives", "10", "--frames", "12",
                           "--steps", "2", "--window", "4", "--val-clips", "2", "--scenarios", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert set(report["models"]) == {"route", "control"}
    for result in report["models"].values():
        assert {"own", "other", "none", "other_minus_own", "none_minus_own"} <= set(result["teacher_forced"])
        assert {"agree_bent_minus_straight", "centroid_bent_minus_mirrored"} <= set(result["generation"])
    assert "the true frames' road moves" in done.stdout
