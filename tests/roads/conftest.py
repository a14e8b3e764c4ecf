"""Every test of roads runs under a deadline (a reader that hangs on a hostile map fails instead of stalling the
suite); the closed loop's scenarios, driven along their lanes, are the poses routes are compared at."""

from __future__ import annotations

import signal

import numpy as np
import pytest

from terra.closedloop.scenarios import synthetic_scenarios
from terra.inputs.ego_motion import to_world

DEADLINE_S = 60  # the slowest test here (16 scenarios' routes on a loaded 2-core machine) takes a few seconds
TOLERANCE_M = 0.05  # a route point's distance from the scene's
DRIVE_S, STEP_S = 20.0, 0.1  # a drive of the study's length, at the model's frame rate


@pytest.fixture(autouse=True)
def deadline():
    def expired(signum, frame):
        raise TimeoutError(f"the test ran past its {DEADLINE_S} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(DEADLINE_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(scope="session")
def scenarios():
    """The closed loop's 16 synthetic scenarios (terra-drive study=gpu: 16 scenarios, scenario_seed 0)."""
    return synthetic_scenarios(16, 0, (32, 32))


def drive_poses(scenario, lateral_m: float = 0.0) -> np.ndarray:
    """World poses of a 20 s drive from the scenario's start at its speed, ``lateral_m`` left of the ego lane's
    centre."""
    scene = scenario.scene
    s = scene.arc_length(scenario.start_pose) + scenario.speed_kmh / 3.6 * np.arange(0.0, DRIVE_S + 1e-9, STEP_S)
    return scene.lane_pose(s, scene.ego_lane_offset_m + lateral_m)


def route_offsets(scene, poses: np.ndarray, routes: np.ndarray) -> np.ndarray:
    """``[T, K]`` lateral offsets from the scene's road centre line (m, left positive) of routes ``[T, K, 3]`` told
    at world ``poses`` ``[T, 3]``: where on the road each route point lies."""
    world = to_world(np.asarray(routes, dtype=np.float64)[..., :2], np.asarray(poses)[:, None])
    return scene.road_coords(world[..., 0], world[..., 1])[1]
