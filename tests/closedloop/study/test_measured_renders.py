"""A drive's measurement takes the true renders its world made at the drive's poses (terra/closedloop/outcomes/
frames.py, ``Drive.truths``) and renders only the rest: the same measurements, byte for byte, with fewer renders; the
controls that hand them on still show what they say (the stutter's repeated frame is a frame of its own, the render
it repeats kept whole)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import numpy as np
import pytest

from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.outcomes import frames as measures
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.control_worlds import (
    FastWorld, LateWorld, MirroredWorld, StutterWorld, STUTTER_PERIOD,
)
from terra.closedloop.worlds import TrueWorld, pose_key
from terra.sim.renderer import render

SIZE = (72, 128)
STEPS = 24  # long enough for the temporal lag (1.5 x its 15 steps)


@pytest.fixture(scope="module")
def scenario():
    return synthetic_scenarios(1, 5, SIZE)[0]


def drive_in(world, scenario):
    [drive] = run_drives(world, [DriveSpec(scenario, "lane_follower", reference_policy("lane_follower"))], STEPS)
    assert drive.ok
    return pickle.loads(pickle.dumps(drive.finished()))  # as a writer process gets it


def measured(drive, monkeypatch) -> tuple[dict, int]:
    """The drive's measurements and how many frames they rendered."""
    calls = []

    def counted(*args):
        calls.append(args)
        return render(*args)

    monkeypatch.setattr(measures, "render", counted)
    found = measures.measure_frames(drive)
    monkeypatch.undo()
    return found, len(calls)


def same(a, b) -> bool:
    """Two measurements equal to the last bit (NaN where NaN)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple, np.ndarray)):
        a, b = np.asarray(a, dtype=object).ravel(), np.asarray(b, dtype=object).ravel()
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return np.float64(a).tobytes() == np.float64(b).tobytes()
    return a == b


@pytest.mark.parametrize("world", [MirroredWorld, LateWorld, StutterWorld])
def test_a_control_made_of_true_renders_hands_them_to_its_measurement(world, scenario, monkeypatch):
    drive = drive_in(world(SIZE), scenario)
    poses = drive.world_poses()
    for pose in poses[1:len(poses) - (10 if world is LateWorld else 0)]:  # late: the last 1 s is not shown yet
        np.testing.assert_array_equal(drive.truths[pose_key(pose)], render(scenario.scene, pose, *SIZE))
    kept, rendered_kept = measured(drive, monkeypatch)
    alone, rendered_alone = measured(replace(drive, truths=None), monkeypatch)
    assert same(kept, alone)
    assert rendered_alone == len(poses)
    assert rendered_kept == len(poses) - len(drive.truths.keys() & {pose_key(p) for p in poses})
    assert rendered_kept <= (11 if world is LateWorld else 1)  # the context frame's pose (and late's last second)


def test_worlds_that_render_elsewhere_hand_nothing_on(scenario):
    for world in (TrueWorld(SIZE), FastWorld(SIZE)):
        assert drive_in(world, scenario).truths is None


def test_the_stutter_still_repeats_a_frame_and_keeps_the_render_it_hid(scenario):
    drive = drive_in(StutterWorld(SIZE), scenario)
    shown = drive.frames[drive.num_context:]
    poses = drive.world_poses()[1:]
    for step, (frame, pose) in enumerate(zip(shown, poses), start=1):
        if step % STUTTER_PERIOD == 0:
            np.testing.assert_array_equal(frame, shown[step - 2])
            assert frame is not shown[step - 2]
            assert not np.array_equal(drive.truths[pose_key(pose)], frame)  # the render at this pose, unchanged
        else:
            np.testing.assert_array_equal(frame, drive.truths[pose_key(pose)])
