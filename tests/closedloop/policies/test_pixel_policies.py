"""The pixel policies (terra/closedloop/policies/builtin.py, vision.py, learned.py) on the true world's frames:
``all_pixel`` names them and no policy that reads no pixels; each detector reads the lane centre a rendered frame
shows; driven in the true world they spread from good to bad; the learned driver's shipped weights load, read
rendered frames of unseen scenes close to the expert and are refused, in one line, when they are not its tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from terra.closedloop.study import statistics
from terra.closedloop.policies.learned import expert_path, PATH_AHEAD_M, LearnedLane, PathNet, load_path_net
from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.policies.builtin import (
    ALL_PIXEL, ALL_REFERENCE, NO_PIXELS, PIXEL_POLICIES, REFERENCE_POLICIES, policy_names,
)
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.outcomes.truth import truth_metrics
from terra.closedloop.policies.vision import find_centre_line, find_road_edge
from terra.closedloop.worlds import TrueWorld
from terra.core.errors import TerraInputError
from terra.fidelity.lanes import find_lane
from terra.sim.renderer import render
from terra.sim.scene import Scene

SIZE = (72, 128)  # a quarter of the demo's frames: the policies read any size
FRAME_SIZE = (144, 256)  # the demo's frames, which the learned driver was trained on


def test_all_pixel_names_every_pixel_policy_and_no_baseline():
    names = policy_names([ALL_PIXEL])
    assert len(names) >= 10 and set(names) == set(REFERENCE_POLICIES) - NO_PIXELS and tuple(names) == PIXEL_POLICIES
    assert NO_PIXELS <= set(REFERENCE_POLICIES) and "learned_driver" in names
    assert policy_names(["route_follower", ALL_PIXEL]) == ["route_follower", *PIXEL_POLICIES]
    assert set(policy_names([ALL_REFERENCE])) == set(REFERENCE_POLICIES)
    with pytest.raises(TerraInputError, match="twice"):
        policy_names([ALL_PIXEL, "lane_follower"])
    assert statistics.NO_PIXELS is NO_PIXELS  # one marker: the verdict ranks the pixel policies alone
    bound = {}
    for name, make in REFERENCE_POLICIES.items():
        policy = make()
        bound[name] = getattr(policy, "gil_bound", False)
        policy.close()
    assert {name for name, on in bound.items() if on} == set(PIXEL_POLICIES)  # numpy work: planned one after another;
    # the baselines answer over the egodriver contract, each plan on a thread of its own


def _poses(scene: Scene) -> list[np.ndarray]:
    """Poses on a straight stretch and on a bend, on the lane's centre and 0.6 m to either side."""
    straight = int(np.flatnonzero(scene.seg_curv == 0)[0])
    bend = int(np.flatnonzero(scene.seg_curv != 0)[0])
    poses = []
    for segment in (straight, bend):
        s = scene.seg_s0[segment] + min(20.0, scene.seg_len[segment] / 2)
        poses += [scene.lane_pose(s, scene.ego_lane_offset_m + d) for d in (-0.6, 0.0, 0.6)]
    return poses


@pytest.mark.parametrize("detect, tolerance", [(find_lane, 0.2), (find_centre_line, 0.15), (find_road_edge, 0.15)])
def test_each_detector_reads_the_lane_centre_ahead(detect, tolerance):
    """At 10 m ahead, within ``tolerance`` of the scene's lane centre, off centre and on a bend alike."""
    scene = Scene.generate(11)
    errors = []
    for pose in _poses(scene):
        lane = detect(render(scene, pose, *FRAME_SIZE))
        assert lane is not None
        errors.append(lane.lateral(10.0) - expert_path(scene, pose)[PATH_AHEAD_M.index(10.0)])
    assert np.max(np.abs(errors)) < tolerance, errors


def test_the_road_edge_is_read_only_where_the_ground_is():
    """A road edge found past the ground's reach (rows ahead whose first unpaved pixel lies more than 8 m aside)
    has no position: such a frame gives no reading, not a fit of zeros (which raised numpy's LinAlgError in the
    mirrored and zero-action worlds of a GPU study)."""
    from terra.fidelity.lanes import ground_points

    height, width = FRAME_SIZE
    valid = ground_points(height, width)[2]
    frame = np.full((height, width, 3), 100, np.uint8)  # paved (grey) everywhere ...
    frame[~valid & (np.arange(width) > width // 2)] = (40, 160, 40)  # ... but where no ray meets the ground
    assert find_road_edge(frame) is None
    scene = Scene.generate(11)  # a true frame keeps its reading
    assert find_road_edge(render(scene, _poses(scene)[1], height, width)) is not None


def test_learned_driver_reads_unseen_scenes_close_to_the_expert():
    """Frames of scenes it was not trained on (the 240 scene seeds scripts/experiments/train_learned_policy.py's
    training drew from 2**31 hold neither 101 nor 202), on a straight and a bend, on the lane's centre and 0.6 m beside
    it. The shipped weights' held-out error over 600 frames: benchmarks/drives.md."""
    detect = LearnedLane()
    errors = []
    for seed in (101, 202):
        scene = Scene.generate(seed)
        for pose in _poses(scene):
            errors.append(detect(render(scene, pose, *FRAME_SIZE)).laterals - expert_path(scene, pose))
    mae = np.abs(errors).mean(axis=0)
    assert mae[PATH_AHEAD_M.index(10.0)] < 0.1 and mae.max() < 0.2, mae  # measured: 0.011 m and 0.041 m


@pytest.fixture(scope="module")
def drives() -> dict[str, list[dict]]:
    """Every pixel policy driven 8 s on two scenarios of the true world: each drive's ground truth by policy."""
    scenarios = synthetic_scenarios(2, 0, SIZE)
    specs = [DriveSpec(s, name, REFERENCE_POLICIES[name]) for s in scenarios for name in PIXEL_POLICIES]
    made = run_drives(TrueWorld(SIZE), specs, 80)
    assert all(d.ok for d in made), [d.error for d in made if not d.ok]
    out: dict[str, list[dict]] = {}
    for drive in made:
        out.setdefault(drive.spec.policy, []).append(truth_metrics(drive.spec.scenario.scene, drive.world_poses()))
    return out


GOOD = ("lane_follower", "lane_follower_cautious", "lane_follower_near", "road_edge_follower", "learned_driver",
        "lane_follower_latency", "centre_line_follower")
WORSE = ("lane_follower_far", "lane_follower_stanley", "lane_follower_bang_bang", "lane_follower_noisy",
         "lane_follower_bias_left")


def test_pixel_policies_spread_from_good_to_bad(drives):
    """Measured (2 scenarios x 8 s): the good ones 0.02-0.09 m from the lane's centre on average, the worse ones
    0.15 m (Stanley) to 2.5 m (biased); a biased car is out of its lane most of the time, the weaving one's corner
    leaves the road."""
    assert set(GOOD + WORSE) == set(PIXEL_POLICIES)
    offset = {name: np.mean([m["mean_abs_lane_offset_m"] for m in runs]) for name, runs in drives.items()}
    in_lane = {name: np.mean([m["time_in_lane"] for m in runs]) for name, runs in drives.items()}
    for name in GOOD:
        assert in_lane[name] > 0.95 and offset[name] < 0.12, (name, in_lane[name], offset[name])
    assert min(offset[name] for name in WORSE) > 1.5 * max(offset[name] for name in GOOD), offset
    assert in_lane["lane_follower_bias_left"] < 0.2 and offset["lane_follower_bias_left"] > 2.0
    assert in_lane["lane_follower_noisy"] < 0.95 and all(m["off_road"] for m in drives["lane_follower_bang_bang"])


def _write(path, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path))


@pytest.mark.parametrize("spoil, message", [
    (lambda t: {**t, "head.3.bias": t["head.3.bias"].double()}, "head.3.bias is torch.float64"),
    (lambda t: {**t, "head.3.bias": torch.full_like(t["head.3.bias"], float("nan"))}, "NaN or infinite"),
    (lambda t: {**t, "head.3.weight": t["head.3.weight"][:3].contiguous()},
     r"head.3.weight is torch.float32 \[3, 64\]"),
    (lambda t: {k: v for k, v in t.items() if k != "features.0.weight"}, "missing \\['features.0.weight'\\]"),
])
def test_weights_that_are_not_the_nets_are_refused_in_one_line(tmp_path, spoil, message):
    path = tmp_path / "model.safetensors"
    _write(path, spoil(dict(PathNet().state_dict())))
    with pytest.raises(TerraInputError, match=message) as caught:
        load_path_net(path)
    assert "\n" not in str(caught.value) and "train_learned_policy.py" in str(caught.value)


def test_a_file_that_is_no_safetensors_is_refused(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"not a safetensors file")
    with pytest.raises(TerraInputError, match="do not read as safetensors"):
        load_path_net(path)
    with pytest.raises(TerraInputError, match="do not exist"):
        load_path_net(tmp_path / "absent.safetensors")


def test_bad_weights_of_the_learned_driver_are_refused_with_the_settings(tmp_path, monkeypatch):
    """Checked before any drive (exit 2, nothing written), as agents and worlds are: not when a drive builds it."""
    from terra.closedloop.policies import learned
    from tests.closedloop.conftest import drive_settings_of

    path = tmp_path / "model.safetensors"
    _write(path, {k: v for k, v in PathNet().state_dict().items() if k != "features.0.weight"})
    monkeypatch.setattr(learned, "LEARNED_DRIVER", path)
    with pytest.raises(TerraInputError, match="missing \\['features.0.weight'\\]"):
        drive_settings_of(tmp_path / "out", "policies=[learned_driver]", "num_scenarios=1", "num_steps=2")
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    drive_settings_of(tmp_path / "out", "policies=[learned_driver]", "num_scenarios=1", "num_steps=2")  # control
