"""Road files a person writes: x first, one polyline or lanes with successors, JSON or CSV; every mistake one line
naming the key, the index or the row."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.core.errors import TerraInputError
from terra.roads import read_road_file, road_from_csv, road_from_json, route_at, routes_along

STRAIGHT_AHEAD = [[0, 0], [10, 0], [20, 0], [90, 0]]  # x first: a road straight ahead along +x


def test_a_polyline_written_x_first_is_straight_ahead():
    route = route_at(road_from_json(STRAIGHT_AHEAD), np.array([5.0, 0.0, 0.0]), 8)
    np.testing.assert_allclose(route[:, 1], 0.0, atol=1e-6)  # no turn: y (left) stays 0
    np.testing.assert_allclose(route[:, 0], [10, 20, 30, 40, 50, 60, 70, 80], atol=1e-5)


def test_lanes_with_successors_and_without():
    road = road_from_json([
        {"points": [[0, 0], [50, 0]], "successors": [2]},  # leads into the left turn, not straight on
        [[50, 0], [150, 0]],
        {"points": [[50, 0], [80, 10], [100, 40]]},
    ])
    assert road.next_lanes == ((2,), (), ())
    assert [lane.id for lane in road.lanes] == ["0", "1", "2"]
    end = route_at(road, np.array([10.0, 0.0, 0.0]), 8)[-1]  # 40 m along lane 0, then 40 m along lane 2
    first = np.hypot(30.0, 10.0)
    np.testing.assert_allclose(end[:2], [70.0 + (40.0 - first) * 20.0 / np.hypot(20.0, 30.0),
                                         10.0 + (40.0 - first) * 30.0 / np.hypot(20.0, 30.0)], atol=1e-3)


def test_numpy_numbers_and_arrays_are_a_road_as_lists_are():
    """A road built in Python: numpy floats and ints, arrays and tuples where JSON has numbers and lists; a boolean
    array is still no number."""
    pose = np.array([[5.0, 0.0, 0.0]])
    expected = routes_along(road_from_json(STRAIGHT_AHEAD), pose, 8)
    array = np.array(STRAIGHT_AHEAD, dtype=np.float32)
    forms = {"numpy floats": [[np.float64(x), np.float32(y)] for x, y in STRAIGHT_AHEAD],
             "numpy ints": [[np.int64(x), np.int32(y)] for x, y in STRAIGHT_AHEAD],
             "an array": array, "arrays": list(array), "tuples": [tuple(p) for p in STRAIGHT_AHEAD],
             "lanes": [array, {"points": array + [0.0, 3.5], "successors": np.array([], dtype=int)}]}
    for name, road in forms.items():
        np.testing.assert_allclose(routes_along(road_from_json(road), pose, 8), expected, atol=1e-6, err_msg=name)
    with pytest.raises(TerraInputError, match=r"^road\[0\]\[0\]: must be a number \(x, metres\), got True"):
        road_from_json(np.ones((2, 2), dtype=bool))


def test_a_road_file_in_json_or_csv(tmp_path):
    (tmp_path / "road.json").write_text(json.dumps({"road": STRAIGHT_AHEAD}))
    (tmp_path / "bare.json").write_text(json.dumps(STRAIGHT_AHEAD))
    (tmp_path / "road.csv").write_text("x,y\n0,0\n10,0\n20,0\n90,0\n")
    (tmp_path / "lanes.csv").write_text("lane, x, y\nA,0,0\nB,0,3.5\nA,90,0\nB,90,3.5\n")
    pose = np.array([[5.0, 0.0, 0.0]])
    expected = routes_along(road_from_json(STRAIGHT_AHEAD), pose, 8)
    for name in ("road.json", "bare.json", "road.csv"):
        np.testing.assert_allclose(routes_along(read_road_file(tmp_path / name), pose, 8), expected, atol=1e-6)
    lanes = read_road_file(tmp_path / "lanes.csv")
    assert [lane.id for lane in lanes.lanes] == ["A", "B"] and lanes.source == "lanes.csv"
    np.testing.assert_allclose(lanes.lane_points(1)[[0, -1]], [[0.0, 3.5], [90.0, 3.5]])


@pytest.mark.parametrize("value, text", [
    ({"x": [0, 10]}, "road: must be a polyline [[x, y], ...] or a list of lanes, got {'x': [0, 10]} (an object)"),
    ([], "road: must be a polyline"),
    ([[0, 0], [10, "0"]], "road[1][1]: must be a number (y, metres), got '0' (a string)"),
    ([[0, 0], [True, 0]], "road[1][0]: must be a number (x, metres), got True (a boolean)"),
    ([[0, 0], [10, 0, 0]], "road[1]: must be a point [x, y] (x first, metres), got [10, 0, 0]"),
    ([[0, 0], [1e9, 0]], "lane '0': point 1 lies 1e+09 m from the origin"),
    ([[0, 0]], "lane '0': has 1 distinct point(s)"),
    ([[[0, 0], [9, 0]], {"point": [[0, 1], [9, 1]]}], "road[1]: unknown key 'point' (did you mean 'points'?)"),
    ([[[0, 0], [9, 0]], {"points": [[0, 1], [9, 1]], "successor": [0]}],
     "road[1]: unknown key 'successor' (did you mean 'successors'?)"),
    ([{"points": [[0, 0], [9, 0]], "successors": [1]}], "road[0].successors[0]: must be the index of a lane (0 to 0)"),
    ([{"points": [[0, 0], [9, 0]], "successors": [False]}], "road[0].successors[0]"),
    ([{"points": [[0, 0], ["9", 0]]}], "road[0].points[1][0]: must be a number"),
    ([[[0, 0], [9, 0]], 7], "road[1]: a lane must be a polyline"),
])
def test_each_mistake_in_a_json_road_is_one_line(value, text):
    with pytest.raises(TerraInputError) as err:
        road_from_json(value)
    assert text in str(err.value) and "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("text, message", [
    ("x,y\n0,0\n10,abc\n", "road.csv: line 3, column y: 'abc' is not a finite number"),
    ("x,y\n0,0\n10,nan\n", "line 3, column y: 'nan' is not a finite number"),
    ("x,y,heading\n0,0,0\n", "unknown column 'heading'"),
    ("x,yy\n0,0\n", "unknown column 'yy' (did you mean 'y'?)"),
    ("y,lane\n0,0\n", "must name columns x and y"),
    ("x,y\n0,0\n10\n", "line 3 has 1 values, the header 2"),
    ("x,y\n", "holds no points"),
    ("x,y\n0,0\n", "lane '0': has 1 distinct point(s)"),
])
def test_each_mistake_in_a_csv_road_is_one_line(text, message):
    with pytest.raises(TerraInputError) as err:
        road_from_csv(text)
    assert message in str(err.value), str(err.value)


def test_road_files_that_cannot_be_roads(tmp_path):
    cases = {"road.json": ("{\"road\": [[0, 0], [9, 0]], \"rout\": 1}", "unknown key 'rout'"),
             "empty.json": ("{}", "has no \"road\" key"),
             "broken.json": ("[[0, 0], [9, 0]", "malformed JSON"),
             "nan.json": ("[[0, 0], [NaN, 0]]", "malformed JSON"),
             "road.txt": ("0 0\n9 0\n", "must be .json or .csv")}
    for name, (content, text) in cases.items():
        (tmp_path / name).write_text(content)
        with pytest.raises(TerraInputError, match=text):
            read_road_file(tmp_path / name)
    with pytest.raises(TerraInputError, match="does not exist"):
        read_road_file(tmp_path / "missing.json")
    with pytest.raises(TerraInputError, match="is not a regular file"):
        read_road_file(tmp_path)
