"""terra/closedloop/study/perturbed_worlds.py: the shaken worlds render the truth from the camera moved by their
offsets, drawn reproducibly per scenario with the spread and correlation they say; the tokenizer world's frames are the
references a model world keeps (the true frames through the same tokenizer); terra-drive loads them by the names the
docs give (``world=module:Class``)."""

from __future__ import annotations

import numpy as np
import pytest

from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.perturbed_worlds import Drifting4cm, Shaken8cm, TokenizerWorld
from terra.closedloop.user_world import world_class
from terra.sim.renderer import render

SIZE = (144, 256)


def straight_poses(scenario, steps: int) -> list[np.ndarray]:
    scene = scenario.scene
    s = scene.arc_length(scenario.start_pose) + 0.8 * np.arange(1, steps + 1)
    return list(scene.lane_pose(s))


@pytest.mark.parametrize("world_class", [Shaken8cm, Drifting4cm])
def test_a_shaken_world_renders_the_truth_from_its_moved_camera(world_class):
    scenario = synthetic_scenarios(1, 0, SIZE, indices=[0])[0]
    world = world_class(SIZE)
    steps = 300
    poses = straight_poses(scenario, steps)
    drive, again = world.open(scenario, 0, steps), world.open(scenario, 5, steps)
    frames = [world.step([drive], [None], [pose])[0] for pose in poses]
    for pose, offset, frame in list(zip(poses, drive.offsets, frames))[:3]:
        x, y, yaw = pose
        moved = np.array([x - offset * np.sin(yaw), y + offset * np.cos(yaw), yaw])
        assert np.array_equal(frame, render(scenario.scene, moved, *SIZE))
    assert not np.array_equal(frames[0], render(scenario.scene, poses[0], *SIZE))
    offsets = np.array(drive.offsets)
    spread = world.sigma_m / np.sqrt(1 - world.rho**2)
    assert np.std(offsets) == pytest.approx(spread, rel=0.25)
    assert np.corrcoef(offsets[1:], offsets[:-1])[0, 1] == pytest.approx(world.rho, abs=0.12)
    world.step([again], [None], [poses[0]])
    assert again.offsets[0] == drive.offsets[0]  # drawn from the scenario, whatever the run's seed


def test_the_tokenizer_world_shows_what_a_model_world_keeps_as_its_reference():
    from terra.pipeline import WorldModelPipeline

    scenario = synthetic_scenarios(2, 0, SIZE, indices=[1])[0]
    world = TokenizerWorld(SIZE)
    pose = straight_poses(scenario, 1)[0]
    frame = world.step([world.open(scenario, 0, 1)], [None], [pose])[0]
    pipeline = WorldModelPipeline(world.tokenizer, backend=None)
    truth = render(scenario.scene, pose, *SIZE)
    import torch

    images = torch.from_numpy(truth[None]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    assert np.array_equal(frame, pipeline.decode(pipeline.encode(images))[0])
    assert not np.array_equal(frame, truth)
    context = world.context_frames(scenario)
    assert context.shape == scenario.images.shape and context.dtype == np.uint8


@pytest.mark.parametrize("name", ["TokenizerWorld", "Shaken4cm", "Shaken8cm", "Drifting4cm"])
def test_terra_drive_loads_each_world_by_the_name_the_docs_give(name):
    entry = f"terra.closedloop.study.perturbed_worlds:{name}"  # benchmarks/fidelity.md's world=
    assert world_class(entry, "world", timeout_s=60).__name__ == name
