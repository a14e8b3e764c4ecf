"""The synthetic world's domains (terra/sim/scene.py DOMAINS): day pixels pinned, night lit by terra/sim/lighting.py,
left_hand mirrored."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from terra.core.errors import TerraInputError
from terra.sim import Scene, random_clip, render, sample_frames
from terra.sim.clips import random_drive
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.renderer import EDGE_INSET_M, LINE_WIDTH_M, camera
from terra.sim.scene import DOMAINS, ROAD_HALF_WIDTH_M

H, W = 144, 256


def straight_pose(scene: Scene) -> np.ndarray:
    """The ego lane pose 5 m into the scene's first straight longer than 40 m."""
    k = next(i for i in range(len(scene.seg_len)) if scene.seg_curv[i] == 0 and scene.seg_len[i] > 40)
    return scene.lane_pose(scene.seg_s0[k] + 5.0)


def test_day_renders_the_pixels_of_the_world_before_domains():
    """sha256 of renders taken before the night domain existed: day must not change by a single pixel value."""
    digest = hashlib.sha256()
    for seed in (0, 7, 123):
        scene = Scene.generate(seed)
        for s, d, yaw in ((20.0, -1.75, 0.0), (150.0, 0.5, 0.2), (300.0, -3.0, -0.3)):
            for size in ((36, 64), (144, 256)):
                digest.update(render(scene, scene.lane_pose(s, d) + np.array([0, 0, yaw]), *size).tobytes())
    assert digest.hexdigest() == "8474cc0df137befaf8c9db6a76f795ff4edc0e822ca48387633d5d644cc87a73"
    digest = hashlib.sha256(random_clip(np.random.default_rng([0, 3]), 3, 36, 64).frames.tobytes())
    digest.update(sample_frames(4, 36, 64, 1).tobytes())
    assert digest.hexdigest() == "e3c414190665c3dcc0a18cd3b2e0975cb648282bc5e2087369aa29916a25772f"


def test_night_is_the_same_scene_in_the_dark():
    day, night = Scene.generate(7), Scene.generate(7, domain="night")
    assert (day.domain, night.domain) == ("day", "night") and DOMAINS == ("day", "night", "left_hand")
    for name in ("seg_s0", "seg_len", "seg_curv", "seg_xyh", "hills", "lit"):
        np.testing.assert_array_equal(getattr(day, name), getattr(night, name))
    np.testing.assert_array_equal(day.objects.xy, night.objects.xy)
    pose = straight_pose(day)
    a, b = render(day, pose, H, W).astype(float), render(night, pose, H, W)
    np.testing.assert_array_equal(b, render(Scene.generate(7, domain="night"), pose, H, W))  # deterministic
    assert b.mean() < 0.45 * a.mean()  # far darker overall
    top = b[: H // 6].astype(float)
    assert top.mean() < 25 and top[..., 2].mean() > top[..., 0].mean()  # a near-black, blue sky
    assert b[-H // 4:].astype(float).mean() > 2 * top.mean()  # the road ahead of the car is lit


def test_left_hand_is_the_day_scene_mirrored_and_driven_on_the_left():
    day, left = Scene.generate(7), Scene.generate(7, domain="left_hand")
    s = np.linspace(0.0, day.length_m, 50)
    np.testing.assert_allclose(left.road_pose(s), day.road_pose(s) * [1.0, -1.0, -1.0], atol=1e-9)
    np.testing.assert_array_equal(left.objects.xy, day.objects.xy * [1.0, -1.0])
    assert left.ego_lane_offset_m == -day.ego_lane_offset_m == ROAD_HALF_WIDTH_M / 2
    np.testing.assert_allclose(left.lane_pose(s), day.lane_pose(s) * [1.0, -1.0, -1.0], atol=1e-9)
    pose = straight_pose(day)
    a = render(day, pose, H, W).astype(float)
    b = render(left, pose * [1.0, -1.0, -1.0], H, W)[:, ::-1].astype(float)
    road = slice(int(camera(H, W).horizon) + 8, H)  # the ground near the car: the same pixels, mirrored
    assert np.abs(a[road] - b[road]).mean() < 3.0
    for i in range(6):  # training drives start in the left lane (its centre +-0.4 m)
        drive = random_drive(np.random.default_rng([0, i]), 3, "left_hand")
        _, d = drive.scene.road_coords(drive.trajectory.x[:1], drive.trajectory.y[:1])
        assert abs(d[0] - ROAD_HALF_WIDTH_M / 2) <= 0.45


def test_night_markings_shine_brighter_than_the_asphalt_beside_them():
    scene = Scene.generate(7, domain="night")
    pose = straight_pose(scene)
    img = render(scene, pose, H, W).astype(float).mean(-1)
    cam = camera(H, W)
    c, s = np.cos(pose[2]), np.sin(pose[2])
    wx = pose[0] + cam.fwd * c - cam.left * s
    wy = pose[1] + cam.fwd * s + cam.left * c
    _, d = scene.road_coords(wx.astype(float), wy.astype(float))
    ahead = (cam.fwd > 6.0) & (cam.fwd < 20.0)
    line = -(ROAD_HALF_WIDTH_M - EDGE_INSET_M - LINE_WIDTH_M / 2)  # the right edge line's centre
    marking = ahead & (np.abs(d - line) < 0.05)
    asphalt = ahead & (np.abs(d - (line + 0.6)) < 0.15)  # the ego lane's asphalt just left of it
    assert marking.sum() > 10 and asphalt.sum() > 10
    ground = img[cam.ground_row0:]
    assert ground[marking].mean() > 2.0 * ground[asphalt].mean()


def test_a_domain_not_in_the_list_is_one_line_naming_the_choices():
    for call in (lambda: Scene.generate(0, domain="dusk"),
                 lambda: random_clip(np.random.default_rng(0), 2, 36, 64, domain="Night")):
        with pytest.raises(TerraInputError, match="unknown domain .*choose one of: day, night") as err:
            call()
        assert "\n" not in str(err.value)


def test_a_night_dataset_records_its_domain(tmp_path):
    out = write_dataset(tmp_path / "ds", 2, 2, 16, 32, seed=3, workers=1, progress=False, domain="night")
    data = ClipDataset(out)
    assert data.meta["domain"] == data.domain == data[1].domain == "night"
    np.testing.assert_array_equal(data[1].frames, random_clip(np.random.default_rng([3, 1]), 2, 16, 32, "night").frames)
    with pytest.raises(TerraInputError, match="unknown domain"):
        write_dataset(tmp_path / "bad", 1, 1, 16, 32, progress=False, domain="dusk")
    assert not (tmp_path / "bad").exists()
