"""AlpaSim's rig poses → Terra's actions (terra/alpasim/poses.py): the planar pose of a quaternion, the initial
frame's pose, the 3 s future past a chunk, and the refusals, each naming the pose and the fix."""

from __future__ import annotations

import math

import numpy as np
import pytest

from terra.alpasim.poses import FRAME_INTERVAL_US, RigTrack, planar_poses, step_back
from terra.core.errors import TerraInputError
from terra.inputs.actions import actions_from_value
from terra.alpasim.client import ANCHOR_US, curve, straight


def quaternions(yaw, roll=0.0):
    """w-first quaternions of a yaw (about z), then a roll (about x)."""
    yaw = np.asarray(yaw, dtype=np.float64)
    cy, sy, cr, sr = np.cos(yaw / 2), np.sin(yaw / 2), math.cos(roll / 2), math.sin(roll / 2)
    return np.stack([cy * cr, cy * sr, sy * sr, sy * cr], axis=-1)


def chunked(path, chunks):
    """The track's actions over consecutive chunks of ``path``, as the server computes them."""
    track, actions, first = RigTrack(), [], 1
    for size in chunks:
        frames = np.arange(first, first + size)
        times = ANCHOR_US + frames * FRAME_INTERVAL_US
        poses = np.array([path(k / 10) for k in frames])
        chunk = track.plan(times, poses)
        track.commit(chunk)
        actions.append(chunk.actions)
        first += size
    assert track.frames == sum(chunks) and track.last_us == ANCHOR_US + sum(chunks) * FRAME_INTERVAL_US
    return np.concatenate(actions)


def known_in_advance(path, frames):
    """The actions of the whole path known from the initial frame on (``terra-generate`` reading it)."""
    t = np.arange(frames + 31) / 10
    x, y, yaw = np.array([path(s) for s in t]).T
    return actions_from_value({"trajectory": {"x": x, "y": y, "yaw": yaw, "t": t}}, "path", frames)


def test_a_pose_is_its_position_and_heading_in_the_plane():
    yaw = np.array([0.0, 0.5, -2.0, 3.1])
    vec = np.array([[1.0, 2.0, 0.3]] * 4)
    planar = planar_poses(vec, quaternions(yaw, roll=0.1))
    np.testing.assert_allclose(planar, np.c_[vec[:, :2], yaw], atol=1e-12)


def test_one_step_back_along_an_arc_is_the_arc():
    path = curve(rate=0.4)
    np.testing.assert_allclose(step_back(np.array(path(0.1)), np.array(path(0.2))), path(0.0), atol=1e-9)


@pytest.mark.parametrize("speed, rate, aside_m", [(8.0, 0.0, 0.0), (8.0, 0.25, 8.315), (12.0, -0.35, -16.708)],
                         ids=["straight", "left", "right"])
@pytest.mark.parametrize("chunks", [(5, 8, 8), (1, 1, 4), (13,)], ids=["alpasim", "ones", "one-chunk"])
def test_chunks_give_the_actions_of_the_whole_path(speed, rate, aside_m, chunks):
    """At constant speed and yaw rate the future past each chunk is the path itself, so chunked actions equal the
    whole path's, to within the linear interpolation of the 10 Hz poses at 20 Hz that reading a path makes where it
    is known (a chord's midpoint lies ``speed * rate * dt**2 / 8`` inside the arc: 2.5 mm at 8 m/s and 0.25 rad/s);
    a first chunk of one pose holds the initial frame still."""
    path = curve(speed, rate) if rate else straight(speed)
    got, want = chunked(path, chunks), known_in_advance(path, sum(chunks))
    start = 1 if chunks[0] == 1 else 0
    np.testing.assert_allclose(got[start:], want[start:], atol=1e-4 + speed * abs(rate) * 0.1**2 / 8)
    if start:
        np.testing.assert_allclose(got[0, :, :2], 0.0, atol=1e-9)  # one pose: no motion known yet
    np.testing.assert_allclose(want[:, -1, 0], aside_m, atol=0.02)  # 2.95 s on: metres aside


def test_the_future_is_extrapolated_from_the_last_two_poses():
    """A car that brakes to a stop within the chunk: the frames after the stop are conditioned on standing still."""
    stop = lambda t: (min(t, 0.4) * 8.0, 0.0, 0.0)  # noqa: E731
    actions = chunked(stop, (8,))
    np.testing.assert_allclose(actions[4:, :, :2], 0.0, atol=1e-9)
    assert actions[0, -1, 1] == pytest.approx(3.2 - 0.0, abs=1e-6)  # frame 0 at 0 m: 3.2 m ahead in all


def track_after(chunks):
    track, first = RigTrack(), 1
    for size in chunks:
        frames = np.arange(first, first + size)
        track.commit(track.plan(ANCHOR_US + frames * FRAME_INTERVAL_US, np.array([straight()(k / 10) for k in frames])))
        first += size
    return track


@pytest.mark.parametrize("rendered, times, words", [
    ((), ANCHOR_US + np.arange(1, 6) * 33_333, ["poses 0 and 1 are 33333 us apart (30 fps)", "fps=10"]),
    ((5,), ANCHOR_US + np.array([6, 7, 7, 8]) * FRAME_INTERVAL_US, ["poses 1 and 2 are 0 us apart", "fps=10"]),
    ((5,), ANCHOR_US + np.array([7, 8]) * FRAME_INTERVAL_US, ["starts at", "the next is at 1700000000600000 us"]),
    ((5,), np.zeros(0, dtype=np.int64), ["no poses"]),
], ids=["30fps", "repeated", "gap", "empty"])
def test_timestamps_off_the_10hz_grid_are_refused(rendered, times, words):
    track = track_after(rendered)
    with pytest.raises(TerraInputError) as err:
        track.plan(times, np.zeros((len(times), 3)))
    assert all(word in str(err.value) for word in words), str(err.value)
    assert track.frames == sum(rendered)  # nothing changed


@pytest.mark.parametrize("vec, quat, words", [
    ([[0, 0, 0], [np.nan, 0, 0]], quaternions([0, 0]), ["pose 1", "NaN"]),
    ([[0, 0, 0], [1, 0, 0]], [[1, 0, 0, 0], [0, 0, 0, 0]], ["pose 1", "norm 0", "unit quaternion"]),
    ([[0, 0, 0]], [[0.5, -0.5, 0.5, -0.5]], ["pose 0", "tilts the rig 90 degrees", "not a camera's"]),
], ids=["nan", "zero-quaternion", "camera-frame"])
def test_bad_poses_are_refused(vec, quat, words):
    with pytest.raises(TerraInputError) as err:
        planar_poses(np.asarray(vec, dtype=np.float64), np.asarray(quat, dtype=np.float64))
    assert all(word in str(err.value) for word in words), str(err.value)


def test_a_car_faster_than_any_car_is_refused():
    track = track_after((5,))
    times = ANCHOR_US + np.array([6, 7]) * FRAME_INTERVAL_US
    with pytest.raises(TerraInputError, match="m/s"):
        track.plan(times, np.array([[100.0, 0, 0], [200.0, 0, 0]]))
