"""The road-plane odometry on true renders at known poses: its error, its bias, and what it gives on frames known to
be wrong (the same frame twice, gray, noise, mirrored, swapped)."""

from __future__ import annotations

import numpy as np
import pytest

from terra.fidelity.odometry import Motion, estimate_motion, se2, step_motions
from terra.sim.renderer import render
from terra.sim.scene import Scene
from tests.conftest import load_script

H, W = 144, 256


def advanced(pose: np.ndarray, motion: np.ndarray) -> np.ndarray:
    """``pose`` moved by ``motion`` (dx, dy, dyaw) given in its own ego frame."""
    moved = se2(*pose) @ se2(*motion)
    return np.array([moved[0, 2], moved[1, 2], pose[2] + motion[2]])


def test_motion_between_true_renders_is_recovered_without_bias():
    """Over 40 pairs of true renders (day and left-hand scenes; 0-3 m forward, yaw +- 0.05 rad, from
    scripts/bench/benchmark_fidelity.py): median |dx error| under 3 cm, |dy| under 1 cm, |dyaw| under 1 mrad, every pair
    recovered, and a gain (recovered on true, through the origin) within 2 % of 1 for the forward motion and the
    yaw (benchmarks/fidelity.md has the measured figures over 200 pairs per domain)."""
    pairs = load_script("bench/benchmark_fidelity").motion_pairs
    truth, found = [], []
    for before, after, motion in [*pairs(20, seed=1, domain="day"), *pairs(20, seed=1, domain="left_hand")]:
        result = estimate_motion(before, after)
        assert result is not None and result.match > 0.9
        truth.append(motion)
        found.append(result.as_array())
    truth, found = np.array(truth), np.array(found)
    error = np.abs(found - truth)
    assert np.median(error[:, 0]) < 0.03 and np.median(error[:, 1]) < 0.01 and np.median(error[:, 2]) < 0.001
    for k in (0, 2):
        gain = np.sum(truth[:, k] * found[:, k]) / np.sum(truth[:, k] ** 2)
        assert abs(gain - 1.0) < 0.02, (k, gain)


def test_controls_same_frame_gray_noise_night_mirrored_and_swapped():
    scene = Scene.generate(11)
    pose = scene.lane_pose(120.0)
    motion = np.array([1.3, 0.02, 0.03])
    before, after = render(scene, pose, H, W), render(scene, advanced(pose, motion), H, W)
    still = estimate_motion(before, before)
    assert np.abs(still.as_array()).max() < 1e-6 and still.match == pytest.approx(1.0)
    mirror = estimate_motion(before[:, ::-1], after[:, ::-1])
    forward = estimate_motion(before, after)
    np.testing.assert_allclose(mirror.as_array(), forward.as_array() * [1, -1, -1], atol=1e-6)
    swapped = estimate_motion(after, before)  # the inverse motion, in the other frame's axes
    inverse = np.linalg.inv(se2(*forward.as_array()))
    np.testing.assert_allclose(swapped.as_array(), [inverse[0, 2], inverse[1, 2], -forward.dyaw], atol=0.02)
    assert estimate_motion(np.full_like(before, 128), np.full_like(before, 128)) is None  # nothing to track
    rng = np.random.default_rng(0)
    noise = [rng.integers(0, 256, before.shape, dtype=np.uint8) for _ in range(2)]
    assert estimate_motion(*noise) is None  # texture, but the grounds do not match
    loose = estimate_motion(*noise, min_match=-1.0)
    assert isinstance(loose, Motion) and loose.match < 0.3
    assert estimate_motion(before, np.full_like(before, 128)) is None
    night = next(load_script("bench/benchmark_fidelity").motion_pairs(1, seed=0, domain="night"))
    assert estimate_motion(*night[:2]) is None  # headlights light a pattern that moves with the camera
    with pytest.raises(ValueError, match="two \\[H, W, 3\\] images"):
        estimate_motion(before, after[:100])


def test_step_motions_are_ego_frame_increments():
    pose = np.array([3.0, -2.0, 0.7])
    motions = np.array([[1.0, 0.1, 0.02], [0.5, -0.05, -0.04], [0.0, 0.0, 0.0]])
    poses = [pose]
    for motion in motions:
        poses.append(advanced(poses[-1], motion))
    np.testing.assert_allclose(step_motions(np.array(poses)), motions, atol=1e-12)
    wrapped = step_motions(np.array([[0.0, 0.0, np.pi - 0.01], [0.0, 0.0, -np.pi + 0.01]]))
    assert wrapped[0, 2] == pytest.approx(0.02)
