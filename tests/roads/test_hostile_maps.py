"""Hostile maps and roads: each is one TerraInputError line naming what is wrong, quickly; nothing hangs (every test
runs under tests/roads/conftest.py's deadline, and those that must be refused before any work is done are timed)."""

from __future__ import annotations

import io
import struct
import time
import zipfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from terra.core.errors import TerraInputError
from terra.roads import Lane, Road, read_clipgt, route_at
from terra.roads import clipgt

QUICK_S = 5.0  # a refusal that reads nothing heavy


def parquet(rows_or_table, **options) -> bytes:
    table = rows_or_table if isinstance(rows_or_table, pa.Table) else pa.Table.from_pylist(rows_or_table)
    buffer = io.BytesIO()
    pq.write_table(table, buffer, **options)
    return buffer.getvalue()


def archive(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as out:
        for name, data in entries.items():
            out.writestr(name, data)
    return buffer.getvalue()


def points(xs, ys) -> list[dict]:
    return [{"x": float(x), "y": float(y), "z": 0.0} for x, y in zip(xs, ys)]


def lane_row(map_id: str, left: list, right: list) -> dict:
    return {"key": {"clip_id": "c", "label_class_id": "lane", "map_id": map_id, "map_id_version": "v1"},
            "lane": {"left_rail": left, "right_rail": right}, "version": 1}


def refused(data, *texts: str) -> str:
    """The one line ``read_clipgt`` refuses ``data`` with, holding every one of ``texts``, within :data:`QUICK_S`."""
    start = time.perf_counter()
    with pytest.raises(TerraInputError) as err:
        read_clipgt(data)
    message = str(err.value)
    assert "\n" not in message and all(text in message for text in texts), message
    assert time.perf_counter() - start < QUICK_S
    return message


def test_a_zip_bomb_is_refused_from_its_header_before_unpacking():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as out:
        with out.open("clip.lane.parquet", "w", force_zip64=True) as entry:
            zeros = bytes(8 * 2**20)
            for _ in range(clipgt.MAX_MAP_BYTES // len(zeros) + 1):
                entry.write(zeros)
    assert len(buffer.getvalue()) < 4 * 2**20  # a few MiB that would unpack to more than 128 MiB
    refused(buffer.getvalue(), "unpack to 136 MiB, more than 128 MiB")


def test_an_entry_that_unpacks_to_more_than_its_header_says_is_refused():
    data = bytearray(archive({"lane.parquet": bytes(4 * 2**20)}))
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, 1000)  # the central directory claims 1000 bytes unpacked
    refused(bytes(data), "lane.parquet cannot be unpacked")


def test_a_parquet_table_whose_values_would_unpack_past_the_bound_is_refused_from_its_metadata(monkeypatch):
    many = 300_000  # one lane of 300,000 points: tens of KiB of parquet, MiBs of pages, a million values decoded
    rails = pa.ListArray.from_arrays(pa.array([0, many], pa.int32()), pa.StructArray.from_arrays(
        [pa.array(np.arange(many) % 7.0), pa.array(np.arange(many) % 5.0)], names=["x", "y"]))
    data = archive({"lane.parquet": parquet(pa.table({"lane": pa.StructArray.from_arrays(
        [rails, rails], names=["left_rail", "right_rail"])}), use_dictionary=False, compression="zstd")})
    assert len(data) < 2**20
    monkeypatch.setattr(clipgt, "MAX_MAP_BYTES", 2**20)
    refused(data, "lane.parquet", "unpack to", "more than 1 MiB")
    monkeypatch.setattr(clipgt, "MAX_POINTS", 100_000)
    refused(data, "lane.left_rail.list", "holds 300000 values, more than 100000")


@pytest.mark.parametrize("data, texts", [
    (b"PK\x03\x04 not really a zip", ("not a zip archive",)),
    (archive({"lane.parquet": b"garbage"}), ("lane.parquet", "not a readable parquet table")),
    (archive({"lane.parquet": b"", "clipgt/c.lane.parquet": b""}), ("two lane tables",)),
    (archive({"lane.parquet": parquet([{"lanes": {"left_rail": []}}])}), ("no 'lane' column",)),
    (archive({"lane.parquet": parquet([{"lane": 3}])}), ("'lane' column has no field 'left_rail'",)),
    (archive({"lane.parquet": parquet([{"lane": {"left_rail": ["a", "b"], "right_rail": ["c", "d"]}}])}),
     ("lane.left_rail", "must be a list of {x, y, z} points, got list<element: string>")),
    (archive({"lane.parquet": parquet([{"lane": {"left_rail": [{"x": "1", "y": "2"}] * 2,
                                                 "right_rail": [{"x": "1", "y": "2"}] * 2}}])}),
     ("lane.left_rail.x", "must be numbers, got string")),
    (archive({"lane.parquet": parquet([lane_row("L7", points([0, 10], [1, 1]), points([0, 10], [np.nan, -1]))])}),
     ("lane.right_rail", "'L7'", "not finite")),
    (archive({"lane.parquet": parquet([lane_row("L1", points([0], [1]), points([0], [-1]))])}),
     ("lane 'L1'", "left_rail has 1 point(s)")),
    (archive({"lane.parquet": parquet([lane_row("far", points([1e9, 1e9 + 50], [1, 1]),
                                                points([1e9, 1e9 + 50], [-1, -1]))])}),
     ("lane 'far'", "beyond 1e+06 m")),
    (archive({"road_boundary.parquet": parquet([{"road_boundary": {"location": points([0, 1], [0, np.inf])}}])}),
     ("road_boundary.location", "not finite")),
    (archive({"association.parquet": parquet([{"association": {"subjects": 1, "objects": [2]}}]),
              "lane.parquet": parquet([lane_row("a", points([0, 9], [1, 1]), points([0, 9], [-1, -1]))])}),
     ("association", "key.kind")),
], ids=["not_a_zip", "not_parquet", "two_lane_tables", "no_lane_column", "lane_not_a_struct", "rails_of_strings",
        "coordinates_as_strings", "nan_point", "lane_of_one_point", "road_1e9_m_away", "infinite_boundary",
        "association_without_kind"])
def test_each_malformed_map_is_one_line_naming_the_element_and_the_field(data, texts):
    refused(data, *texts)


def test_a_map_of_100000_lanes_is_refused_from_its_metadata():
    count = 100_000
    xs = np.tile([0.0, 10.0], count)
    rail = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * count + 1, 2), pa.int32()), pa.StructArray.from_arrays(
        [pa.array(xs), pa.array(np.repeat(np.arange(count) * 4.0, 2)), pa.array(np.zeros(2 * count))],
        names=["x", "y", "z"]))
    data = archive({"c.lane.parquet": parquet(pa.table({"lane": pa.StructArray.from_arrays(
        [rail, rail], names=["left_rail", "right_rail"])}))})
    refused(data, "c.lane.parquet", "100000 lane rows, more than 20000")


def test_100000_lanes_or_too_many_points_given_directly_are_refused_at_once():
    start = time.perf_counter()
    lane = Lane(np.array([[0.0, 0.0], [10.0, 0.0]]))
    with pytest.raises(TerraInputError, match="holds 100000 lanes, more than 20000"):
        Road([lane] * 100_000)
    with pytest.raises(TerraInputError, match="holds 2000002 points, more than 2000000"):
        Road([Lane(np.zeros((1_000_001, 2)))] * 2)
    with pytest.raises(TerraInputError, match="long in all"):  # few points, but 4,000 km of lanes at 1 m
        Road([Lane(np.array([[-9e5, 1.0 * i], [9e5, 1.0 * i]])) for i in range(2)] + [Lane([[0.0, 5], [1e4, 5]])])
    assert time.perf_counter() - start < QUICK_S


def test_a_road_far_away_gives_no_route_and_a_road_too_far_is_refused():
    near_origin_pose = np.array([0.0, 0.0, 0.0])
    distant = Road([Lane(np.array([[1e5, 0.0], [1e5 + 100.0, 0.0]]))])
    assert np.isnan(route_at(distant, near_origin_pose, 8)).all()
    assert np.isnan(route_at(distant, np.array([1e12, -1e12, 0.0]), 8)).all()
    with pytest.raises(TerraInputError, match="lane '0': point 0 lies 1e\\+09 m from the origin"):
        Road([Lane(np.array([[1e9, 0.0], [1e9 + 100.0, 0.0]]))])


@pytest.mark.parametrize("points, text", [
    ([[0.0, 0.0]], "has 1 distinct point(s)"),
    ([[0.0, 0.0], [0.001, 0.0], [0.0, 0.002]], "has 1 distinct point(s)"),
    ([[0.0, 0.0], [np.nan, 1.0]], "point 1 is not finite"),
    ([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]], "points must be [x, y] pairs, got an array of shape [2, 3]"),
    ([["a", 0.0], [1.0, 0.0]], "points must be [x, y] pairs of numbers"),
])
def test_each_bad_lane_given_directly_is_one_line(points, text):
    with pytest.raises(TerraInputError) as err:
        Road([Lane(np.array([[0.0, 5.0], [9.0, 5.0]]), "fine"), Lane(points, "bad")], source="my road")
    assert str(err.value).startswith("my road: lane 'bad': ") and text in str(err.value), str(err.value)


def test_two_lanes_of_one_id_are_refused():
    with pytest.raises(TerraInputError, match="two lanes have the id 'a'"):
        Road([Lane([[0.0, 0.0], [1.0, 0.0]], "a"), Lane([[0.0, 1.0], [1.0, 1.0]], "a")])


FRAME_S = 0.05  # a frame's route on any map within the limits


def stacked_lanes(count: int) -> Road:
    """``count`` lanes of 1.2 m, all from (0, 0) along +x: each chains into every other."""
    return Road([Lane(np.array([[0.0, 0.0], [1.2, 0.0]]), f"s{i}") for i in range(count)])


def split_lanes(count: int, step_m: float) -> Road:
    """One straight road along +x split into ``count`` lanes of ``step_m``: each chains into the ~1.5 / step_m
    starting within the chain gap of its end, behind it as well as ahead."""
    return Road([Lane(np.array([[i * step_m, 0.0], [(i + 1) * step_m, 0.0]]), f"p{i}") for i in range(count)])


@pytest.mark.parametrize("road", [stacked_lanes(3), stacked_lanes(256), split_lanes(400, 0.05),
                                  split_lanes(20_000, 0.02)], ids=["3_stacked", "256_stacked", "400_of_5_cm",
                                                                   "20000_of_2_cm"])
def test_a_hostile_map_within_the_limits_answers_each_frame_quickly_and_loops_nowhere(road):
    poses = np.stack([np.linspace(0.1, 1.0, 10), np.zeros(10), np.zeros(10)], axis=-1)
    start = time.perf_counter()
    for t, pose in enumerate(poses):
        route = route_at(road, pose, 8, poses[t + 1:])
        assert np.isnan(route).all() or (route[:, 0] > 0.0).all(), route  # never a point behind the car
    assert (time.perf_counter() - start) / len(poses) < FRAME_S


def test_no_lane_leads_into_itself_nor_back_over_itself():
    short, after = np.array([[0.0, 0.0], [1.2, 0.0]]), np.array([[1.2, 0.0], [50.0, 0.0]])
    road = Road([Lane(short, "short"), Lane(short, "twin"), Lane(after, "after"), Lane(after + [0, 9], "own",
                                                                                         ("own", "short", "after"))])
    assert road.next_lanes == ((2,), (2,), (), ())
    route = route_at(road, np.array([0.1, 0.0, 0.0]), 8)
    np.testing.assert_allclose(route[:, 0], np.arange(10.0, 41.0, 10.0).tolist() + [49.9] * 4, atol=1e-4)


def test_crowded_junctions_and_too_many_stated_successors_are_one_line():
    with pytest.raises(TerraInputError, match=r"more than 256 lanes start by the end of lane 's0'"):
        stacked_lanes(300)
    lanes = [Lane(np.array([[0.0, 0.0], [1.2, 0.0]]), str(i), tuple(str(j) for j in range(65))) for i in range(65)]
    with pytest.raises(TerraInputError, match=r"lane '0' states 65 successors, more than 64"):
        Road(lanes)


def test_user_text_is_quoted_at_most_200_characters():
    huge = "L" * (20 * 2**20)  # a 20 MiB map id
    data = archive({"lane.parquet": parquet([lane_row(huge, points([0, 10], [1, 1]),
                                                      points([0, 10], [np.nan, -1]))])})
    message = refused(data, "lane.right_rail", "not finite", "(20971520 characters)")
    assert len(message) < 500, len(message)
    with pytest.raises(TerraInputError) as err:
        Road([Lane(np.array([[0.0, 0.0], [1.0, 0.0]]), huge), Lane(np.array([[0.0, 5.0]]), "x" * 300)])
    assert len(str(err.value)) < 400 and "(300 characters)" in str(err.value)
