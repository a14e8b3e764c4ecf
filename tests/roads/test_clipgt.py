"""AlpaSim's map: a scene written in its layout (its lanes both ways, with rails and successors) and read back gives
the scene's routes, on its ego lane's centre; the names, folders and tables AlpaSim and NVIDIA's readers use;
successors from the association table, else from the geometry."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from terra.roads import Lane, Road, read_clipgt, routes_along, write_clipgt
from terra.sim.scene import scene_road
from terra.sim.scene import ROAD_HALF_WIDTH_M
from tests.roads.conftest import TOLERANCE_M, drive_poses, route_offsets
from tests.roads.test_follow import y_fork

CLIP = "00000000-0000-0000-0000-000000000001_1000000_2000000"


def exported(road: Road, clip_id: str | None = CLIP) -> bytes:
    buffer = io.BytesIO()
    write_clipgt(road, buffer, clip_id=clip_id)
    return buffer.getvalue()


def rezipped(data: bytes, rename=lambda name: name, drop=()) -> bytes:
    """The archive's entries under new names, without those named in ``drop``."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(data)) as src, zipfile.ZipFile(out, "w") as dst:
        for name in src.namelist():
            if not any(part in name for part in drop):
                dst.writestr(rename(name), src.read(name))
    return out.getvalue()


def test_a_scene_exported_as_an_alpasim_map_gives_the_scenes_routes_at_every_frame(scenarios):
    worst = 0.0
    for scenario in scenarios:
        data = exported(scene_road(scenario.scene))
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            assert sorted(archive.namelist()) == [f"{CLIP}.{e}.parquet" for e in ("association", "lane",
                                                                                  "road_boundary")]
        road = read_clipgt(data)
        assert len(road.boundaries) == 2
        for lateral in (0.0, 0.9):  # on the lane's centre, and drifted towards the yellow line
            poses = drive_poses(scenario, lateral)
            routes = routes_along(road, poses, 8)
            worst = max(worst, float(np.abs(routes - scenario.scene.route(poses, 8)).max()))
            on_lane = route_offsets(scenario.scene, poses, routes)[:, :-1]  # the last point may lie at the road's end
            assert np.abs(on_lane - scenario.scene.ego_lane_offset_m).max() < TOLERANCE_M  # the lane, not the road
    assert worst < TOLERANCE_M, f"max error {worst * 100:.2f} cm"


def test_a_scene_exported_as_an_alpasim_map_holds_its_lanes_both_ways_with_rails_and_successors(scenarios):
    scene = scenarios[0].scene
    tables = zipfile.ZipFile(io.BytesIO(exported(scene_road(scene))))
    lanes = pq.read_table(io.BytesIO(tables.read(f"{CLIP}.lane.parquet"))).to_pylist()
    links = pq.read_table(io.BytesIO(tables.read(f"{CLIP}.association.parquet"))).to_pylist()
    ids = [row["key"]["map_id"] for row in lanes]
    ways = {way: [i for i in ids if i.startswith(way)] for way in ("ego-", "oncoming-")}
    assert len(ways["ego-"]) == len(ways["oncoming-"]) > 1 and len(ids) == 2 * len(ways["ego-"])
    assert {row["association"]["subjects"]: row["association"]["objects"] for row in links} == {
        **{way[i]: [way[i + 1]] for way in ways.values() for i in range(len(way) - 1)}}
    for row in lanes:
        edge = -ROAD_HALF_WIDTH_M if row["key"]["map_id"].startswith("ego-") else ROAD_HALF_WIDTH_M
        for rail, want in (("left_rail", 0.0), ("right_rail", edge)):  # the yellow line on each lane's left
            xy = np.array([[p["x"], p["y"]] for p in row["lane"][rail]])
            d = scene.road_coords(xy[:, 0], xy[:, 1])[1]
            np.testing.assert_allclose(d[np.isfinite(d)], want, atol=1e-3)


def test_the_layout_is_the_one_nvidias_readers_take():
    table = pq.read_table(io.BytesIO(zipfile.ZipFile(io.BytesIO(exported(y_fork()))).read(f"{CLIP}.lane.parquet")))
    row = table.to_pylist()[0]
    assert set(row) == {"key", "lane", "version"}
    assert row["key"] == {"clip_id": CLIP, "label_class_id": "lane", "map_id": "trunk", "map_id_version": "v1"}
    assert set(row["lane"]) == {"left_rail", "right_rail"} and set(row["lane"]["left_rail"][0]) == {"x", "y", "z"}
    np.testing.assert_allclose([row["lane"]["left_rail"][0]["y"], row["lane"]["right_rail"][0]["y"]], [1.75, -1.75])


def test_names_with_and_without_clip_id_at_the_root_or_in_a_folder(tmp_path):
    plain = exported(y_fork(), clip_id=None)
    assert sorted(zipfile.ZipFile(io.BytesIO(plain)).namelist()) == ["association.parquet", "lane.parquet",
                                                                      "road_boundary.parquet"]
    in_folder = rezipped(exported(y_fork()), lambda name: "clipgt/" + name.split(".", 1)[1])
    folder = tmp_path / "clipgt"
    folder.mkdir()
    zipfile.ZipFile(io.BytesIO(plain)).extractall(folder)
    write_clipgt(y_fork(), tmp_path / "map.zip")
    expected = read_clipgt(exported(y_fork()))
    for source in (plain, in_folder, folder, tmp_path / "map.zip", io.BytesIO((tmp_path / "map.zip").read_bytes())):
        road = read_clipgt(source)
        assert [lane.id for lane in road.lanes] == ["trunk", "straight", "left"]
        assert road.next_lanes == expected.next_lanes
        np.testing.assert_array_equal(road.xy, expected.xy)


def test_other_elements_are_ignored_unread():
    data = exported(y_fork())
    with zipfile.ZipFile(io.BytesIO(data), "a") as archive:
        for element in ("lane_line", "crosswalk", "wait_line", "traffic_light", "calibration_estimate"):
            archive.writestr(f"{CLIP}.{element}.parquet", b"not a parquet file")
        archive.writestr("clipgt/frames/frame_0.jpeg", b"\xff\xd8\xff")
    assert len(read_clipgt(data)) == 3


def test_stated_successors_come_from_the_association_table_else_from_the_geometry():
    forced = y_fork({"trunk": ("left",), "left": (), "straight": ()})  # geometry would add "straight"
    assert read_clipgt(exported(forced)).next_lanes == forced.next_lanes
    table = pq.read_table(io.BytesIO(zipfile.ZipFile(io.BytesIO(exported(forced))).read(
        f"{CLIP}.association.parquet")))
    assert table.to_pylist() == [{"key": {"clip_id": CLIP, "label_class_id": "association",
                                          "map_id": "NEXT_LANE-0", "map_id_version": "v1", "kind": "NEXT_LANE"},
                                  "association": {"subjects": "trunk", "objects": ["left"]}, "version": 1}]
    geometric = read_clipgt(rezipped(exported(forced), drop=("association",)))
    assert geometric.next_lanes == y_fork().next_lanes  # trunk -> straight and left


def test_rails_of_different_point_counts_give_their_midline():
    lane = {"left_rail": [{"x": x, "y": 2.0, "z": 0.0} for x in (0.0, 30.0, 60.0)],
            "right_rail": [{"x": x, "y": -1.0, "z": 0.5} for x in (0.0, 10.0, 20.0, 45.0, 60.0)]}
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{"lane": lane}]), buffer)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as out:
        out.writestr("lane.parquet", buffer.getvalue())
    road = read_clipgt(archive.getvalue())
    assert [lane.id for lane in road.lanes] == ["0"]  # no key column: the row number
    np.testing.assert_allclose(road.lane_points(0)[:, 1], 0.5)
    np.testing.assert_allclose(road.lane_points(0)[[0, -1], 0], [0.0, 60.0])


def test_a_map_without_lanes_is_a_road_without_lanes():
    road = read_clipgt(rezipped(exported(y_fork()), drop=("lane.parquet",)))
    assert len(road) == 0 and np.isnan(routes_along(road, np.array([[20.0, 0.0, 0.0]]), 8)).all()


def test_a_lane_written_is_a_lane_read():
    lanes = [Lane(np.stack([np.linspace(0.0, 30.0, 7), np.sin(np.linspace(0.0, 1.0, 7))], -1), "a")]
    road = Road(lanes)
    back = read_clipgt(exported(road))
    np.testing.assert_allclose(back.xy, road.xy, atol=1e-5)  # the rails' midline, resampled again
