"""The synthetic driving world: determinism, camera geometry, manoeuvre clips and the dataset round trip."""

from __future__ import annotations

import importlib
import subprocess
import sys

import numpy as np
import pytest

from terra.core.errors import TerraInputError
from terra.inputs.actions import actions_for_manoeuvre
from terra.inputs.trajectory import MANOEUVRES
from terra.sim import Clip, Scene, make_clip, random_clip, render, render_frames, sample_frames
from terra.sim.dataset import ClipDataset, write_dataset
from terra.sim.renderer import camera
from terra.sim.scene import EGO_LANE_OFFSET_M

H, W = 72, 128


@pytest.fixture(scope="module")
def scene() -> Scene:
    return Scene.generate(7)


def straight_stretch(scene: Scene) -> float:
    """Arc length in the middle of the scene's first straight segment long enough to look down."""
    k = next(i for i in range(len(scene.seg_len)) if scene.seg_curv[i] == 0 and scene.seg_len[i] > 40)
    return float(scene.seg_s0[k] + 5.0)


def road_centre_column(img: np.ndarray) -> float:
    """Mean column of asphalt pixels (dark, unsaturated grey) in the bottom 40 % of the image."""
    lower = img[int(0.6 * img.shape[0]):].astype(float)
    grey = (lower.max(-1) - lower.min(-1) < 25) & (lower.mean(-1) < 110)
    assert grey.sum() > 50, "no road visible"
    return float(np.nonzero(grey)[1].mean())


def test_same_seed_and_pose_give_identical_pixels(scene):
    pose = scene.lane_pose(50.0) + np.array([0.3, -0.2, 0.05])
    a = render(scene, pose, H, W)
    b = render(Scene.generate(7), pose, H, W)
    assert a.dtype == np.uint8 and a.shape == (H, W, 3)
    np.testing.assert_array_equal(a, b)
    other = render(Scene.generate(8), Scene.generate(8).lane_pose(50.0), H, W)
    assert np.abs(a.astype(int) - other).mean() > 5  # another seed is another scene


@pytest.mark.parametrize("size", [(36, 64), (45, 97), (144, 256)])
def test_any_resolution_shows_sky_above_road(scene, size):
    img = render(scene, scene.lane_pose(straight_stretch(scene)), *size)
    assert img.shape == (*size, 3)
    top, bottom = img[: size[0] // 8].astype(float), img[-size[0] // 8 :].astype(float)
    assert top[..., 2].mean() > top[..., 0].mean() + 30  # blue sky
    assert bottom.std() > 10  # road, markings and grass, not a flat colour


def test_ground_rays_and_point_projection_agree():
    cam = camera(H, W)
    rows, cols = np.nonzero(np.isfinite(cam.depth))
    pick = np.linspace(0, len(rows) - 1, 50).astype(int)
    r, c = rows[pick], cols[pick]
    u, v, depth = cam.project(cam.fwd[r, c].astype(float), cam.left[r, c].astype(float), np.zeros(len(r)))
    np.testing.assert_allclose(u, c + 0.5, atol=1e-3)
    np.testing.assert_allclose(v, r + cam.ground_row0 + 0.5, atol=1e-3)
    np.testing.assert_allclose(depth, cam.depth[r, c], rtol=1e-5)


def test_view_culling_leaves_pixels_unchanged(monkeypatch):
    module = importlib.import_module("terra.sim.renderer")  # the module; terra.sim.render is the function
    rng = np.random.default_rng(1)
    for seed in (0, 1):
        scene = Scene.generate(seed)
        poses = [scene.lane_pose(rng.uniform(5, 450), rng.normal(EGO_LANE_OFFSET_M, 2)) + [0, 0, rng.normal(0, 0.3)]
                 for _ in range(3)]
        culled = [render(scene, p, H, W) for p in poses]
        with monkeypatch.context() as m:
            m.setattr(module, "_segment_rows", lambda cam, scene, pose: None)  # every segment, every row
            for p, img in zip(poses, culled):
                np.testing.assert_array_equal(img, render(scene, p, H, W))


def test_road_coordinates_invert_lane_poses(scene):
    rng = np.random.default_rng(0)
    s = rng.uniform(1.0, scene.length_m - 1.0, 200)
    d = rng.uniform(-6.0, 6.0, 200)
    xy = scene.lane_pose(s, d)
    s_back, d_back = scene.road_coords(xy[:, 0], xy[:, 1])
    np.testing.assert_allclose(s_back, s, atol=1e-6)
    np.testing.assert_allclose(d_back, d, atol=1e-6)
    heading = np.unwrap(scene.road_pose(np.linspace(0, scene.length_m, 400))[:, 2])
    assert np.all(np.abs(np.diff(heading)) < 0.1)  # continuous centreline


def test_left_yaw_moves_road_and_hills_right(scene):
    pose = scene.lane_pose(straight_stretch(scene))
    straight = render(scene, pose, H, W)
    turned = render(scene, pose + np.array([0.0, 0.0, 0.15]), H, W)  # car rotated to the left
    shift = road_centre_column(turned) - road_centre_column(straight)
    assert shift > 0.05 * W
    # The skyline (at infinity) slides right by the focal length times the yaw change.
    cam = camera(H, W)
    expected = cam.focal * np.tan(0.15)
    sky_rows = slice(0, int(cam.horizon) - 1)
    a, b = straight[sky_rows].astype(float).mean(-1), turned[sky_rows].astype(float).mean(-1)
    errors = [np.abs(b[:, k:] - a[:, : W - k]).mean() for k in range(W // 3)]
    assert abs(int(np.argmin(errors)) - expected) <= 1.5


@pytest.mark.parametrize("name, sign", [("curve_left", 1), ("curve_right", -1), ("straight", 0)])
def test_curve_clips_shift_the_road_the_commanded_way(scene, name, sign):
    clip = make_clip(scene, name, 12, H, W, speed_kmh=30.0, start_s=straight_stretch(scene), radius_m=25.0)
    shift = road_centre_column(clip.frames[-1]) - road_centre_column(clip.frames[0])
    if sign:
        assert sign * shift > 0.1 * W  # turning left puts the road ahead further right in the image
    else:
        assert abs(shift) < 0.05 * W
    turned = np.unwrap(clip.poses[:, 2])[-1] - clip.poses[0, 2]
    assert turned == pytest.approx(sign * 30.0 / 3.6 * 1.1 / 25.0, abs=0.02)


@pytest.mark.parametrize("name", MANOEUVRES)
def test_clip_actions_match_the_action_convention(scene, name):
    clip = make_clip(scene, name, 6, 36, 64, speed_kmh=40.0, start_s=30.0)
    assert isinstance(clip, Clip)
    assert clip.frames.shape == (6, 36, 64, 3) and clip.frames.dtype == np.uint8
    assert clip.poses.shape == (6, 3) and clip.instruction_trajs.shape == (6, 60, 3)
    assert clip.actions.dtype == np.float32 and clip.instruction_trajs.dtype == np.float32
    np.testing.assert_allclose(clip.actions, actions_for_manoeuvre(name, 6, speed_kmh=40.0), atol=1e-4)
    start = scene.lane_pose(30.0)
    np.testing.assert_allclose(clip.poses[0], start, atol=1e-9)
    np.testing.assert_allclose(clip.instruction_trajs[:, 0], 0.0, atol=1e-5)  # each future starts at the ego


def test_random_clips_and_frames_are_reproducible_and_varied():
    a = random_clip(np.random.default_rng(3), 4, 36, 64)
    b = random_clip(np.random.default_rng(3), 4, 36, 64)
    np.testing.assert_array_equal(a.frames, b.frames)
    np.testing.assert_array_equal(a.actions, b.actions)
    names = {random_clip(np.random.default_rng(i), 2, 16, 16).manoeuvre.split(">")[-1] for i in range(40)}
    assert len(names) >= 6
    frames = sample_frames(10, 36, 64, seed=1)
    assert frames.shape == (10, 36, 64, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, sample_frames(10, 36, 64, seed=1))
    assert np.abs(frames[1:].astype(int) - frames[:-1]).mean() > 3


def test_bad_inputs_raise_one_line_errors(scene):
    with pytest.raises(TerraInputError, match="pose"):
        render(scene, np.array([0.0, np.nan, 0.0]), H, W)
    with pytest.raises(TerraInputError, match="manoeuvre"):
        make_clip(scene, "loop_the_loop", 4, H, W)
    with pytest.raises(TerraInputError, match="length_m"):
        Scene.generate(0, length_m=-5)


def test_dataset_round_trip(tmp_path):
    out = write_dataset(tmp_path / "ds", num_clips=5, num_frames=3, height=24, width=40, seed=11,
                        clips_per_shard=2, workers=2, progress=False)
    data = ClipDataset(out)
    assert len(data) == 5 and data.num_frames == 3 and data.image_size == (24, 40) and data.num_shards == 3
    serial = write_dataset(tmp_path / "serial", 5, 3, 24, 40, seed=11, clips_per_shard=5, workers=1,
                           compress=False, progress=False)
    for i, clip in enumerate(data):
        expected = random_clip(np.random.default_rng([11, i]), 3, 24, 40)
        for name in ("frames", "poses", "instruction_trajs", "actions"):
            got = getattr(clip, name)
            assert got.dtype == getattr(expected, name).dtype
            np.testing.assert_array_equal(got, getattr(expected, name))
            np.testing.assert_array_equal(got, getattr(ClipDataset(serial)[i], name))
        assert (clip.manoeuvre, clip.seed, clip.start_s) == (expected.manoeuvre, expected.seed, expected.start_s)
    np.testing.assert_array_equal(data[-1].frames, data[4].frames)
    with pytest.raises(TerraInputError, match="already holds"):
        write_dataset(out, 1, 1, 24, 40, progress=False)
    with pytest.raises(TerraInputError, match="not a clip dataset"):
        ClipDataset(tmp_path)


def test_make_dataset_script(tmp_path):
    done = subprocess.run([sys.executable, "-m", "terra.apps.make_dataset", f"out_dir={tmp_path / 'ds'}", "num_clips=3",
                           "num_frames=2",
                           "height=16", "width=32", "workers=2", "clips_per_shard=2"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "wrote 3 clips x 2 frames at 16x32 (day, routes of 16 points)" in done.stdout
    data = ClipDataset(tmp_path / "ds")
    np.testing.assert_array_equal(data[2].frames, random_clip(np.random.default_rng([0, 2]), 2, 16, 32).frames)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no Hydra outputs or logs left behind


def test_rendered_frames_do_not_depend_on_the_number_of_workers():
    one = render_frames(40, (16, 16), seed=3, workers=1)
    assert one.shape == (40, 16, 16, 3)
    np.testing.assert_array_equal(one, render_frames(40, (16, 16), seed=3, workers=3))
