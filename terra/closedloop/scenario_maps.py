"""The road the model world is told, read from maps (``road`` setting)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from terra.closedloop.scenarios import VERDICT_ROUTE_POINTS, ScenarioSource, synthetic_scenarios
from terra.core.errors import TerraInputError, clipped, error_reason

SCENE_ROAD = "scene"  # road=scene: the scenarios' own scenes tell the routes
MAP_SUFFIX = ".zip"
EXPORT_IMAGE_SIZE = (16, 16)  # the scenes are what is exported; their context frames are drawn this small


def map_path(folder: str | Path, scenario_id: str) -> Path:
    """Where scenario ``scenario_id``'s map lies in a ``road`` folder."""
    return Path(folder).expanduser() / f"{scenario_id}{MAP_SUFFIX}"


def with_maps(source: ScenarioSource, road: str, num_context: int = 3) -> ScenarioSource:
    """``source`` with each scenario's road read from its map in folder ``road``, or from the one road file ``road``
    checked to reach the car after ``num_context`` context frames (``scene``: ``source`` as it is)."""
    from terra.roads import read_clipgt

    if road == SCENE_ROAD:
        return source
    folder = Path(road).expanduser()
    if folder.is_file():
        return with_road_file(source, folder, num_context)
    if not folder.is_dir():
        raise TerraInputError(f"road={road} is neither a road file nor a folder; give {SCENE_ROAD}, a road file "
                              f"(.json, .csv, a clipgt {MAP_SUFFIX}) or a folder of clipgt maps, one per scenario "
                              f"named <scenario id>{MAP_SUFFIX} (docs/drive.md, \"Roads from maps\")")
    roads = []
    for scenario_id in source.ids:
        path = map_path(folder, scenario_id)
        if not path.is_file():
            raise TerraInputError(f"road: scenario {scenario_id} has no map {path}; export one (docs/drive.md, "
                                  "\"Roads from maps\") or use road=scene")
        try:  # a map the reader cannot take is its one line, naming this source
            roads.append(read_clipgt(path, f"road: scenario {scenario_id}'s map {path}"))
        except OSError as err:
            raise TerraInputError(f"road: scenario {scenario_id}'s map {path} cannot be read ({error_reason(err)})"
                                  ) from None
    reads = tuple((*reads, ("road map", str(map_path(folder, i)))) for reads, i in zip(source.reads, source.ids))
    return replace(source, roads=tuple(roads), reads=reads, road_source="clipgt map")


def with_road_file(source: ScenarioSource, path: Path, num_context: int) -> ScenarioSource:
    """``source`` with every scenario told the road of file ``path``, checked to reach each scenario's car after
    ``num_context`` context frames."""
    from terra.inputs.routes import road_of_setting, told_road_routes

    setting = f"road={clipped(str(path))}"
    try:
        road = road_of_setting(str(path), setting)
    except OSError as err:
        raise TerraInputError(f"{setting}: cannot be read ({error_reason(err)})") from None
    for scenario in source.load(EXPORT_IMAGE_SIZE, num_context):
        told_road_routes(road, np.asarray(scenario.start_pose, dtype=np.float64)[None], VERDICT_ROUTE_POINTS,
                         f"{setting}: scenario {scenario.id}", frame="the scenario's world frame")
    reads = tuple((*reads, ("road", str(path))) for reads in source.reads)
    return replace(source, roads=(road,) * len(source.ids), reads=reads, road_source=path.name)


def export_maps(folder: str | Path, num_scenarios: int = 4, scenario_seed: int = 0) -> list[Path]:
    """Write the synthetic scenarios' roads as clipgt maps ``<scenario id>.zip`` into ``folder``; the paths written."""
    from terra.roads import write_clipgt
    from terra.sim.scene import scene_road

    out = Path(folder).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for scenario in synthetic_scenarios(num_scenarios, scenario_seed, EXPORT_IMAGE_SIZE, num_context=1):
        path = map_path(out, scenario.id)
        write_clipgt(scene_road(scenario.scene), path, clip_id=scenario.id)
        written.append(path)
    return written


__all__ = ["SCENE_ROAD", "export_maps", "map_path", "with_maps"]
