"""terra-drive's ``road`` setting: the model world told its routes from AlpaSim maps exported from the scenarios'
scenes gets the scene's routes, on the ego lane's centre, within 5 cm at every step of a drive; maps of other scenes
are told apart by metres; a scenario without its map, or with a map that cannot be read, is one line before any
drive."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from terra.closedloop.loop import drive_specs, run_drives
from terra.closedloop.recording.files import drive_json
from terra.closedloop.policies.builtin import policy_factories
from terra.closedloop.scenario_maps import export_maps, map_path
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.worlds import ModelWorld
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.backends import model_backend
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.roads import Lane, Road, read_clipgt, write_clipgt
from terra.tokenizer.lfq import LFQTokenizer
from tests.closedloop.conftest import drive_settings_of
from tests.conftest import TINY_ROUTES, tiny_route_model
from tests.roads.conftest import route_offsets

SEED, OTHER_SEED, STEPS = 3, 11, 4


class TellingWorld(ModelWorld):
    """The model world, keeping every (scenario id, poses, routes) it tells the model."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.told: list[tuple[str, np.ndarray, np.ndarray]] = []

    def routes(self, road, poses):
        routes = super().routes(road, poses)
        if poses is not None:
            self.told.append((road.id, np.asarray(poses, dtype=np.float64).reshape(-1, 3), routes.reshape(
                -1, TINY_ROUTES, 3)))
        return routes


@pytest.fixture(scope="module")
def maps(tmp_path_factory, single_thread):
    """The run's scenarios' maps, and the maps of other scenes under the run's scenario ids (a wrong road)."""
    folder = tmp_path_factory.mktemp("maps")
    export_maps(folder / "own", num_scenarios=2, scenario_seed=SEED)
    wrong = folder / "wrong"
    wrong.mkdir()
    for index, path in enumerate(export_maps(folder / "other", num_scenarios=2, scenario_seed=OTHER_SEED)):
        shutil.copy(path, map_path(wrong, f"synthetic-{SEED}-{index:03d}"))
    return folder


def drive_with(out, road: str) -> tuple[TellingWorld, list]:
    """A run of 2 scenarios x route_follower x STEPS steps (HF on CPU, the tiny route model) with the ``road``
    setting (the run's folder ``out``): its world and drives."""
    settings = drive_settings_of(out, "num_scenarios=2", f"scenario_seed={SEED}", f"road={road}")
    scenarios = settings.scenarios.load((64, 64), num_context=2)
    world = TellingWorld(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_route_model())),
                         SamplingConfig(temperature=0))
    try:
        drives = run_drives(world, drive_specs(scenarios, policy_factories(["route_follower"])), STEPS)
    finally:
        world.shutdown()
    assert all(drive.error is None and drive.steps == STEPS for drive in drives)
    return world, drives


def told(out, road: str) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """What the model world tells the model over :func:`drive_with`'s run."""
    return drive_with(out, road)[0].told


def test_maps_in_another_frame_are_recorded_as_telling_no_route(tmp_path, maps):
    """The scenarios' own maps moved 500 m: no step has a lane near the car, and each drive's record says so by
    content (before, ``"route": true, "route_source": "clipgt map"``)."""
    far = tmp_path / "far"
    far.mkdir()
    for path in sorted((maps / "own").glob("*.zip")):
        road = read_clipgt(path)
        write_clipgt(Road([Lane(lane.points + [500.0, 0.0], lane.id, lane.successors) for lane in road.lanes]),
                     far / path.name)
    for out, road, routed in ((tmp_path / "far-run", far, 0), (tmp_path / "own-run", maps / "own", STEPS)):
        for drive in drive_with(out, str(road))[1]:
            record = drive_json(drive, {}, "", [])
            assert (record["route"], record["route_source"], record["routed_steps"]) == (routed > 0, "clipgt map",
                                                                                          routed)
            assert record["route_told"] == ["told" if routed else "no lane within 4 m"] * STEPS


def test_routes_from_exported_maps_are_the_scenes_within_5_cm(tmp_path, maps):
    by_scene, by_map = told(tmp_path / "scene", "scene"), told(tmp_path / "maps", str(maps / "own"))
    scenes = {scenario.id: scenario.scene for scenario in synthetic_scenarios(2, SEED, (16, 16), num_context=1)}
    assert len(by_map) == len(by_scene) == 2 * (1 + STEPS)  # each drive's context, then each step
    for (scene_id, scene_poses, scene_routes), (map_id, map_poses, map_routes) in zip(by_scene, by_map):
        assert scene_id == map_id
        np.testing.assert_array_equal(map_poses, scene_poses)  # route_follower reads no pixels: the same drive
        assert np.isfinite(map_routes).all()
        gap = np.hypot(*(map_routes[..., :2] - scene_routes[..., :2]).transpose(2, 0, 1))
        assert gap.max() < 0.05, (map_id, gap.max())
        lane = route_offsets(scenes[map_id], map_poses, map_routes) - scenes[map_id].ego_lane_offset_m
        assert np.abs(lane).max() < 0.05, (map_id, lane)  # on the ego lane's centre, not the road's centre line


def test_maps_of_other_scenes_tell_another_road(tmp_path, maps):
    by_scene, by_wrong = told(tmp_path / "scene", "scene"), told(tmp_path / "wrong", str(maps / "wrong"))
    gaps = []
    for (_, _, scene_routes), (_, _, wrong_routes) in zip(by_scene, by_wrong):
        gap = np.hypot(*(wrong_routes[..., :2] - scene_routes[..., :2]).transpose(2, 0, 1)).max(axis=-1)
        gaps.extend(np.where(np.isnan(gap), np.inf, gap))  # no lane of that road near the car: no route at all
    assert min(gaps) > 1.0, gaps


def test_a_missing_or_unreadable_map_is_one_line_naming_the_scenario(tmp_path, maps):
    partial = tmp_path / "partial"
    shutil.copytree(maps / "own", partial)
    map_path(partial, f"synthetic-{SEED}-001").unlink()
    with pytest.raises(TerraInputError, match=f"scenario synthetic-{SEED}-001 has no map .*synthetic-{SEED}-001.zip"):
        drive_settings_of(tmp_path / "a", "num_scenarios=2", f"scenario_seed={SEED}", f"road={partial}")
    map_path(partial, f"synthetic-{SEED}-001").write_bytes(b"not a zip")
    with pytest.raises(TerraInputError, match=f"scenario synthetic-{SEED}-001's map .*zip") as caught:
        drive_settings_of(tmp_path / "b", "num_scenarios=2", f"scenario_seed={SEED}", f"road={partial}")
    assert "\n" not in str(caught.value)
    with pytest.raises(TerraInputError, match="is neither a road file nor a folder"):
        drive_settings_of(tmp_path / "c", "num_scenarios=2", f"road={tmp_path / 'none'}")
