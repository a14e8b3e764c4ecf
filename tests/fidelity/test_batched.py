"""The measurement in torch (a run on a GPU: every frame at once, terra/fidelity/batched.py) writes the numbers the
numpy path writes, within float tolerance: both paths run here, torch on the CPU (and on CUDA where a GPU is)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.policies.builtin import reference_policy
from terra.closedloop.recording import files
from terra.closedloop.recording.files import write_drive
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.control_worlds import FastWorld, FrozenWorld, GrayWorld, LateWorld, StutterWorld
from terra.fidelity.odometry import estimate_motion, se2
from terra.fidelity.batched import estimate_pairs
from terra.sim.renderer import render
from terra.sim.scene import Scene

SIZE = (72, 128)
STEPS = 24  # long enough for the temporal lag (1.5 x its 15 steps)
ODOMETRY_TOLERANCE = 1e-6  # metres, radians, correlation: float64 sums in another order
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.fixture(scope="module")
def scenario():
    return synthetic_scenarios(1, 5, SIZE)[0]


def close(a, b, path: str = "") -> None:
    """Two JSON values equal, their floats within :data:`ODOMETRY_TOLERANCE` (null where null)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for k, (x, y) in enumerate(zip(a, b)):
            close(x, y, f"{path}[{k}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert abs(a - b) <= ODOMETRY_TOLERANCE * max(1.0, abs(a)), f"{path}: {a} != {b}"
    else:
        assert a == b, path


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("world", [FastWorld, LateWorld, StutterWorld, FrozenWorld, GrayWorld])
def test_a_drive_measured_in_torch_writes_the_numpy_paths_numbers(world, device, scenario, tmp_path, monkeypatch):
    """A run on the CPU measures in numpy; one on a GPU in torch there (here ``device``, torch on the CPU too)."""
    [drive] = run_drives(world(SIZE), [DriveSpec(scenario, "lane_follower", reference_policy("lane_follower"))],
                         STEPS)
    drive = pickle.loads(pickle.dumps(drive.finished()))  # as a writer process gets it
    written = {}
    for path_name in ("numpy", "torch"):
        if path_name == "torch":
            monkeypatch.setattr(files, "measure_device", lambda run_device: device)
        folder = tmp_path / path_name
        folder.mkdir()
        write_drive(folder, drive, "print", None, measure=True, device="cpu")
        [path] = folder.glob("*.json")
        written[path_name] = json.loads(path.read_text())["fidelity"]
    numpy_path, torch_path = written["numpy"], written["torch"]
    close(numpy_path, torch_path)
    moved = [r for r in numpy_path["recovered"] if r is not None and r[0] is not None]
    assert moved or world in (FrozenWorld, GrayWorld)  # odometry compared, not refusals alone
    assert any(v is not None for v in numpy_path["lane_truth"])  # lane readings compared, not misses alone


@pytest.mark.parametrize("device", DEVICES)
def test_the_odometry_of_many_pairs_at_once_is_each_pairs_own(device):
    """Pairs of every kind at once: moving day frames, a night frame (refused), a uniform frame (refused)."""
    rng = np.random.default_rng(3)
    frames, pairs = [], []
    for domain in ("day", "day", "left_hand", "night"):
        scene = Scene.generate(int(rng.integers(1000)), domain=domain)
        pose = scene.lane_pose(rng.uniform(20, 300), scene.ego_lane_offset_m)
        moved = se2(*pose) @ se2(rng.uniform(0.5, 3.0), 0.0, rng.uniform(-0.04, 0.04))
        frames += [render(scene, pose, 144, 256),
                   render(scene, np.array([moved[0, 2], moved[1, 2], np.arctan2(moved[1, 0], moved[0, 0])]), 144, 256)]
        pairs.append((len(frames) - 2, len(frames) - 1))
    frames.append(np.full_like(frames[0], 128))
    pairs += [(0, len(frames) - 1), (1, 0)]
    alone = [estimate_motion(frames[i], frames[j]) for i, j in pairs]
    together = estimate_pairs(np.stack(frames), pairs, 0.5, device)
    assert [m is None for m in together] == [m is None for m in alone]
    assert alone[3] is None and alone[4] is None and sum(m is not None for m in alone) >= 3  # night, uniform
    for mine, own in zip(together, alone):
        if own is not None:
            np.testing.assert_allclose(mine.as_array(), own.as_array(), atol=ODOMETRY_TOLERANCE)
            assert abs(mine.match - own.match) < ODOMETRY_TOLERANCE and mine.cells == own.cells


def test_a_run_measures_in_torch_on_its_gpu_and_in_numpy_on_a_cpu():
    gpu = torch.cuda.is_available()
    assert files.measure_device("cpu") is None
    assert files.measure_device("auto") == ("cuda" if gpu else None)
    assert files.measure_device("cuda:0") == ("cuda:0" if gpu else None)  # a writer that sees no GPU: numpy
