"""A road a person writes: lane centrelines in a trajectory's own world frame (metres, x forward at yaw 0, y left).

JSON: one polyline ``[[x, y], ...]`` or a list of lanes, each a polyline or ``{"points": [...], "successors": [j,
...]}``. CSV: columns ``x``, ``y`` and optionally ``lane`` (rows of one label form one lane)."""

from __future__ import annotations

import codecs
import csv
import difflib
import io
import math
import numbers
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from terra.contract.actions import number_from_text
from terra.core.errors import TerraInputError, clipped, error_reason, past, quoted
from terra.roads.road import MAX_LANES, MAX_POINTS, Lane, Road

LANE_KEYS = ("points", "successors")
CSV_COLUMNS = ("x", "y", "lane")
FILE_KEYS = ("road",)
MAX_FILE_BYTES = 256 * 2**20  # a road file of MAX_POINTS points is well under this


def road_from_json(value: Any, source: str = "road") -> Road:
    """The road of a JSON value (numpy arrays and tuples read as lists); ``source`` names it in errors
    (``trajectory.json: road``)."""
    value = _as_lists(value)
    if not isinstance(value, list) or not value:
        raise TerraInputError(f"{source}: must be a polyline [[x, y], ...] or a list of lanes, got "
                              f"{_shown(value)}")
    value, where = (([value], [source]) if _is_point(value[0])
                    else (value, [f"{source}[{i}]" for i in range(len(value))]))
    if len(value) > MAX_LANES:
        raise TerraInputError(f"{source}: holds {len(value)} lanes, more than {MAX_LANES}")
    lanes, count = [], 0
    for i, (lane, name) in enumerate(zip(value, where)):
        points, successors = _lane_parts(lane, name, len(value))
        count += len(points)
        if count > MAX_POINTS:
            raise TerraInputError(f"{source}: holds more than {MAX_POINTS} points; give the part of the road the "
                                  "drive uses")
        lanes.append(Lane(_points(points, f"{name}.points" if isinstance(lane, dict) else name), str(i),
                          successors, f"{name}"))
    return Road(lanes, source=source)


def road_from_csv(text: str, source: str = "road.csv") -> Road:
    """The road of a CSV text with columns ``x``, ``y`` and optionally ``lane``."""
    try:
        return _road_from_csv(csv.reader(io.StringIO(text)), source)
    except csv.Error as err:
        raise TerraInputError(f"{source}: is not a readable CSV ({error_reason(err)})") from None


def _road_from_csv(reader: Any, source: str) -> Road:
    header = [name.strip() for name in next(reader, [])]
    for name in header:
        if name not in CSV_COLUMNS:
            raise TerraInputError(f"{source}: unknown column {quoted(name)}{_did_you_mean(name, CSV_COLUMNS)}; a road "
                                  "CSV has columns x, y and optionally lane")
    if "x" not in header or "y" not in header or len(set(header)) != len(header):
        raise TerraInputError(f"{source}: its header must name columns x and y once each (and optionally lane), "
                              f"got {clipped(header)}")
    cx, cy, cl = header.index("x"), header.index("y"), header.index("lane") if "lane" in header else None
    lanes: dict[str, list[list[float]]] = {}
    for row_number, row in enumerate(reader, start=2):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise TerraInputError(f"{source}: line {row_number} has {len(row)} values, the header {len(header)}")
        label = row[cl].strip() if cl is not None else "0"
        if label not in lanes and len(lanes) >= MAX_LANES:
            raise TerraInputError(f"{source}: holds more than {MAX_LANES} lanes")
        lanes.setdefault(label, []).append([_csv_number(row[c], source, row_number, n) for c, n in ((cx, "x"),
                                                                                                    (cy, "y"))])
        if row_number > MAX_POINTS + 1:
            raise TerraInputError(f"{source}: holds more than {MAX_POINTS} points; give the part of the road the "
                                  "drive uses")
    if not lanes:
        raise TerraInputError(f"{source}: holds no points; give rows of x, y (metres) under the header x,y")
    return Road([Lane(points, label, None, f"{source} lane {clipped(label)}") for label, points in lanes.items()],
                source=source)


def read_road_file(path: str | Path) -> Road:
    """The road of a ``.json`` or ``.csv`` road file."""
    path = Path(path)
    if not path.is_file():
        raise TerraInputError(f"road file {path}: {'is not a regular file' if path.exists() else 'does not exist'}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise TerraInputError(f"road file {path}: is {past(path.stat().st_size / 2**20, MAX_FILE_BYTES / 2**20)} "
                              f"MiB, more than {MAX_FILE_BYTES / 2**20:g} MiB")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        try:
            return road_from_csv(path.read_text(encoding="utf-8-sig"), path.name)
        except UnicodeDecodeError:
            raise TerraInputError(f"{path.name}: is not UTF-8 text; save the road as a UTF-8 CSV") from None
    if suffix != ".json":
        raise TerraInputError(f"road file {path}: must be .json or .csv")
    try:
        value = orjson.loads(path.read_bytes().removeprefix(codecs.BOM_UTF8))
    except orjson.JSONDecodeError as err:
        raise TerraInputError(f"{path.name}: cannot be read, malformed JSON ({str(err)[:120]})") from None
    if isinstance(value, dict):
        _only_known_keys(value, FILE_KEYS, path.name, "a road file holds {\"road\": [...]}")
        if "road" not in value:
            raise TerraInputError(f"{path.name}: has no \"road\" key; give {{\"road\": [[x, y], ...]}}")
        return road_from_json(value["road"], f"{path.name}: road")
    return road_from_json(value, path.name)


def write_road_file(road: Road, path: str | Path) -> None:
    """Write ``road``'s lanes as a ``road.json`` that :func:`read_road_file` reads back (millimetre precision)."""
    index = {lane.id: i for i, lane in enumerate(road.lanes)}
    lanes = []
    for lane in road.lanes:
        points = np.round(lane.points, 3).tolist()
        lanes.append(points if lane.successors is None else
                     {"points": points, "successors": [index[s] for s in lane.successors if s in index]})
    Path(path).write_bytes(orjson.dumps({"road": lanes}))


def _as_lists(value: Any, depth: int = 4) -> Any:
    """``value`` with its numpy arrays and tuples as lists, down to a road's points' numbers (``depth`` levels)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if depth and isinstance(value, (list, tuple)):
        return [_as_lists(item, depth - 1) for item in value]
    if depth and isinstance(value, dict):
        return {key: _as_lists(item, depth - 1) for key, item in value.items()}
    return value


def _is_point(item: Any) -> bool:
    return isinstance(item, list) and not any(isinstance(v, (list, dict)) for v in item)


def _lane_parts(lane: Any, where: str, count: int) -> tuple[list, tuple[str, ...] | None]:
    """A lane's points and its successors' ids (None: not given)."""
    if isinstance(lane, list):
        return lane, None
    if not isinstance(lane, dict):
        raise TerraInputError(f"{where}: a lane must be a polyline [[x, y], ...] or {{\"points\": [...]}}, got "
                              f"{_shown(lane)}")
    _only_known_keys(lane, LANE_KEYS, where, "a lane has points and optionally successors")
    if "points" not in lane:
        raise TerraInputError(f"{where}: has no \"points\"; give {{\"points\": [[x, y], ...]}}")
    if "successors" not in lane:
        return lane["points"], None
    successors = lane["successors"]
    if not isinstance(successors, list):
        raise TerraInputError(f"{where}.successors: must be a list of lane indices, got {_shown(successors)}")
    for k, j in enumerate(successors):
        if not _is_number(j, numbers.Integral) or not 0 <= j < count:
            raise TerraInputError(f"{where}.successors[{k}]: must be the index of a lane (0 to {count - 1}), got "
                                  f"{_shown(j)}")
    return lane["points"], tuple(str(int(j)) for j in successors)


def _points(points: Any, where: str) -> list[list[float]]:
    """A polyline's ``[[x, y], ...]``, every value a JSON number (not a string, not a boolean)."""
    if not isinstance(points, list):
        raise TerraInputError(f"{where}: must be a polyline [[x, y], ...], got {_shown(points)}")
    for i, point in enumerate(points):
        if not isinstance(point, list) or len(point) != 2:
            raise TerraInputError(f"{where}[{i}]: must be a point [x, y] (x first, metres), got {_shown(point)}")
        for k, v in enumerate(point):
            if not _is_number(v):
                raise TerraInputError(f"{where}[{i}][{k}]: must be a number ({'xy'[k]}, metres), got {_shown(v)}")
    return points


def _is_number(value: Any, kind: type = numbers.Real) -> bool:
    """A number of ``kind`` (Python's or numpy's), not a boolean nor a string."""
    return isinstance(value, kind) and not isinstance(value, (bool, np.bool_))


def _csv_number(cell: str, source: str, line: int, column: str) -> float:
    try:
        value = number_from_text(cell)  # no 1_0, nan or inf, which float() takes
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise TerraInputError(f"{source}: line {line}, column {column}: {quoted(cell.strip())} is not a finite number "
                              "(metres)")
    return value


def _only_known_keys(mapping: dict, known: tuple[str, ...], where: str, shape: str) -> None:
    """Refuse the first key of ``mapping`` that is not in ``known``, with a guess and what the object holds."""
    for key in mapping:
        if key not in known:
            raise TerraInputError(f"{where}: unknown key {quoted(key)}{_did_you_mean(key, known)}; {shape}")


def _did_you_mean(name: str, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(name[:100], known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _shown(value: Any) -> str:
    kind = {bool: "a boolean", str: "a string", dict: "an object", list: "a list", type(None): "null"}.get(
        type(value), type(value).__name__)
    text = repr(value)
    return f"{text[:40]}{'...' if len(text) > 40 else ''} ({kind})"


__all__ = ["read_road_file", "road_from_csv", "road_from_json", "write_road_file"]
