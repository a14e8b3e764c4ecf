"""AlpaSim's map (``StaticWorldMap.hdmap_parquets``, a scene's ``clipgt/`` tables) as a :class:`Road`, and back."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from terra.core.atomic import atomic_path
from terra.core.errors import TerraInputError, clipped, error_reason, past, quoted
from terra.roads.road import MAX_LANES, MAX_POINTS, Lane, Road

MAX_MAP_BYTES = 128 * 2**20  # the tables read, unpacked (a map of a city district is tens of MiB): reading one
# holds about this and its decoded points (MAX_POINTS) at once, a few hundred MiB
MAX_ENTRIES = 10_000  # files in the archive
ELEMENTS = ("lane", "road_boundary", "association")  # the tables read; the others are skipped unread
LANE_WIDTH_M = 3.5  # the rails :func:`write_clipgt` draws about each centreline
_CHUNK = 1 << 20


def read_clipgt(data: bytes | str | Path | IO[bytes], source: str = "clipgt map") -> Road:
    """The road of AlpaSim's map: its bytes, a zip file's path, or a folder of its parquet files."""
    tables = _tables(data, source)
    lanes = _lanes(tables["lane"], source) if "lane" in tables else []
    boundaries = _boundaries(tables["road_boundary"], source) if "road_boundary" in tables else []
    if "association" in tables and lanes:
        successors = _next_lanes(tables["association"], source)
        lanes = [Lane(lane.points, lane.id, successors.get(lane.id), lane.source) for lane in lanes]
    return Road(lanes, boundaries, source=source)


def write_clipgt(road: Road, out: str | Path | IO[bytes], clip_id: str | None = None) -> None:
    """Write ``road`` as AlpaSim's map (a zip of parquet tables) to a path or a binary file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    clip, half = clip_id or "terra", LANE_WIDTH_M / 2.0
    text = pa.string()
    key = pa.struct([(name, text) for name in ("clip_id", "label_class_id", "map_id", "map_id_version")])
    rails = [[_offset(lane.points, side * half) for lane in road.lanes] for side in (1.0, -1.0)]
    links = [(lane.id, [road.lanes[j].id for j in road.next_lanes[i]]) for i, lane in enumerate(road.lanes)]
    links = [(subject, objects) for subject, objects in links if objects]
    tables = {
        "lane": pa.table({
            "key": pa.array([_key(clip, "lane", lane.id) for lane in road.lanes], type=key),
            "lane": pa.StructArray.from_arrays([_point_lists(rails[0]), _point_lists(rails[1])],
                                               names=["left_rail", "right_rail"]),
            "version": pa.array([1] * len(road.lanes), type=pa.int64())}),
        "road_boundary": pa.table({
            "key": pa.array([_key(clip, "road_boundary", f"boundary-{i}") for i in range(len(road.boundaries))],
                            type=key),
            "road_boundary": pa.StructArray.from_arrays([_point_lists(list(road.boundaries))], names=["location"]),
            "version": pa.array([1] * len(road.boundaries), type=pa.int64())}),
        "association": pa.table({
            "key": pa.array([{**_key(clip, "association", f"NEXT_LANE-{i}"), "kind": "NEXT_LANE"}
                             for i in range(len(links))], type=pa.struct([*key, ("kind", text)])),
            "association": pa.array([{"subjects": s, "objects": o} for s, o in links],
                                    type=pa.struct([("subjects", text), ("objects", pa.list_(text))])),
            "version": pa.array([1] * len(links), type=pa.int64())}),
    }
    prefix = f"{clip_id}." if clip_id else ""

    def write(target: Any) -> None:
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
            for element, table in tables.items():
                buffer = io.BytesIO()
                pq.write_table(table, buffer)
                archive.writestr(f"{prefix}{element}.parquet", buffer.getvalue())

    if isinstance(out, (str, Path)):
        with atomic_path(out) as tmp:
            write(tmp)
    else:
        write(out)


# ------------------------------------------------------------------------------------------------ the archive


def _tables(data: bytes | str | Path | IO[bytes], source: str) -> dict[str, tuple[str, bytes]]:
    """``element -> (file name, bytes)`` of the tables :func:`read_clipgt` reads, size-checked."""
    if isinstance(data, (str, Path)) and Path(data).is_dir():
        found = {}
        for path in sorted(Path(data).glob("*.parquet")):
            if _element(path.name) in ELEMENTS and not path.is_file():
                raise TerraInputError(f"{source}: {path.name} is not a regular file")
            _claim(found, _element(path.name), path.name, source)
        _check_size(sum(Path(data, name).stat().st_size for name in found.values()), source)
        return {element: (name, Path(data, name).read_bytes()) for element, name in found.items()}
    if isinstance(data, (bytes, bytearray, memoryview)) and not len(data):
        raise TerraInputError(f"{source}: is empty, no map; give AlpaSim's hdmap_parquets bytes or a zip of a clipgt/ "
                              "folder")
    try:
        archive = zipfile.ZipFile(io.BytesIO(data) if isinstance(data, (bytes, bytearray, memoryview)) else data)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as err:
        raise TerraInputError(f"{source}: is not a zip archive of parquet files ({error_reason(err)}); give "
                              "AlpaSim's hdmap_parquets bytes or a zip of a clipgt/ folder") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > MAX_ENTRIES:
            raise TerraInputError(f"{source}: holds {len(infos)} files, more than {MAX_ENTRIES}; give the map's "
                                  "parquet tables only")
        found: dict[str, zipfile.ZipInfo] = {}
        for info in infos:
            if not info.is_dir():
                _claim(found, _element(info.filename), info, source)
        _check_size(sum(info.file_size for info in found.values()), source)
        return {element: (clipped(info.filename), _unpacked(archive, info, source)) for element, info in found.items()}


def _element(name: str) -> str | None:
    base = name.rsplit("/", 1)[-1]
    return base[: -len(".parquet")].rsplit(".", 1)[-1] if base.endswith(".parquet") else None


def _claim(found: dict, element: str | None, entry: Any, source: str) -> None:
    if element not in ELEMENTS:
        return
    if element in found:
        names = [clipped(getattr(e, "filename", e)) for e in (found[element], entry)]
        raise TerraInputError(f"{source}: holds two {element} tables ({names[0]}, {names[1]}); keep one")
    found[element] = entry


def _check_size(total: int, source: str) -> None:
    if total > MAX_MAP_BYTES:
        raise TerraInputError(f"{source}: its lane, road_boundary and association tables unpack to "
                              f"{past(total / 2**20, MAX_MAP_BYTES / 2**20)} MiB, more than "
                              f"{MAX_MAP_BYTES / 2**20:g} MiB; give the part of the map the drive uses")


def _unpacked(archive: zipfile.ZipFile, info: zipfile.ZipInfo, source: str) -> bytearray:
    """An entry's bytes, never more than its header states nor :data:`MAX_MAP_BYTES`."""
    limit = min(info.file_size, MAX_MAP_BYTES)
    buffer, size = bytearray(limit + 1), 0  # one byte past the limit tells an entry that unpacks to more
    try:
        with archive.open(info) as entry:
            while size <= limit and (count := entry.readinto(memoryview(buffer)[size:size + _CHUNK])):
                size += count
    except (zipfile.BadZipFile, OSError, RuntimeError, NotImplementedError, EOFError, ValueError) as err:
        raise TerraInputError(f"{source}: {clipped(info.filename)} cannot be unpacked ({error_reason(err)}); write the "
                              "archive again with plain deflate") from None
    if size > limit:
        raise TerraInputError(f"{source}: {clipped(info.filename)} unpacks to more than the {limit} bytes its header "
                              "states; the archive is damaged or forged")
    del buffer[size:]
    return buffer


# ------------------------------------------------------------------------------------------------- the tables


def _read(table: tuple[str, bytes], element: str, wanted: dict[str, tuple[str, ...]], source: str,
          max_rows: int) -> dict[str, Any]:
    """``column -> struct array`` of the ``wanted`` fields, read after the table's bounds are checked."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    name, raw = table
    where = f"{source}: {name}"
    try:
        file = pq.ParquetFile(pa.BufferReader(raw))
        meta, names = file.metadata, file.schema_arrow.names
        if meta.num_rows > max_rows:
            raise TerraInputError(f"{where}: holds {meta.num_rows} {element} rows, more than {max_rows}; give the "
                                  "part of the map the drive uses")
        main = next((column for column in names if column.lower() == element), None)
        if main is None:
            raise TerraInputError(f"{where}: has no {element!r} column (it has {clipped(names)}); an AlpaSim {element} "
                                  f"table holds its {element}s in a struct column {element!r}")
        leaves = [meta.schema.column(i).path for i in range(meta.num_columns)]
        chosen, renamed = [], {}
        for column, fields in wanted.items():
            actual = main if column == element else column
            renamed[actual] = column
            for field in fields:
                prefix = f"{actual}.{field}"
                under = [i for i, path in enumerate(leaves)
                         if (path == prefix or path.startswith(prefix + ".")) and not path.endswith(".z")]
                if not under and column == element:
                    raise TerraInputError(f"{where}: its {element!r} column has no field {field!r}; an AlpaSim "
                                          f"{element} holds {', '.join(fields)}")
                chosen += under
        for i in chosen:
            values = sum(meta.row_group(g).column(i).num_values for g in range(meta.num_row_groups))
            if values > MAX_POINTS + max_rows:
                raise TerraInputError(f"{where}: {clipped(leaves[i])} holds {values} values, more than "
                                      f"{MAX_POINTS}; give the part of the map the drive uses")
        _check_size(sum(meta.row_group(g).column(i).total_uncompressed_size
                        for g in range(meta.num_row_groups) for i in chosen), where)
        read = file.read(columns=[leaves[i] for i in chosen])
    except TerraInputError:
        raise
    except (pa.ArrowException, OSError, ValueError, IndexError) as err:
        raise TerraInputError(f"{where}: is not a readable parquet table ({error_reason(err)})") from None
    return {renamed[column]: read.column(column).combine_chunks() for column in read.column_names}


def _struct_field(column: Any, field: str, what: str) -> Any:
    import pyarrow as pa

    if not pa.types.is_struct(column.type) or column.type.get_field_index(field) < 0:
        raise TerraInputError(f"{what}: must be a struct with a field {field!r}, got {clipped(column.type)}")
    if column.null_count:
        raise TerraInputError(f"{what}: row {_first_null(column)} is null")
    return column.field(field)


def _first_null(array: Any) -> int:
    return int(np.flatnonzero(np.asarray(array.is_null()))[0])


def _polylines(lists: Any, what: str, ids: list[str]) -> list[np.ndarray]:
    """``[N, 2]`` x, y of each row of a list of ``{x, y, z}`` points."""
    import pyarrow as pa

    kind = lists.type
    if not _is_list(kind) or not pa.types.is_struct(kind.value_type):
        raise TerraInputError(f"{what}: must be a list of {{x, y, z}} points, got {clipped(kind)}")
    if lists.null_count:
        raise TerraInputError(f"{what}: is null in row {quoted(ids[_first_null(lists)])}")
    lists = lists.cast(pa.large_list(kind.value_type))  # every list layout as offsets into its points
    offsets = np.asarray(lists.offsets, dtype=np.int64) - lists.offsets[0].as_py()
    points = lists.flatten()
    xy = []
    for axis in ("x", "y"):
        values = _struct_field(points, axis, f"{what} points")
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise TerraInputError(f"{what}.{axis}: must be numbers, got {values.type}")
        if values.null_count:
            raise TerraInputError(f"{what}.{axis}: is null in row {quoted(ids[_row_of(offsets, _first_null(values))])}")
        xy.append(values.to_numpy(zero_copy_only=False).astype(np.float64))
    xy = np.stack(xy, axis=-1)
    bad = ~np.isfinite(xy).all(axis=1)
    if bad.any():
        row = _row_of(offsets, int(np.flatnonzero(bad)[0]))
        raise TerraInputError(f"{what}: row {quoted(ids[row])} holds a point that is not finite; give finite x, y")
    return [xy[a:b] for a, b in zip(offsets[:-1], offsets[1:])]


def _is_list(kind: Any) -> bool:
    """An Arrow list of any layout: list, large_list, fixed_size_list, list_view, large_list_view."""
    import pyarrow as pa

    return any(test(kind) for test in (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list,
                                       pa.types.is_list_view, pa.types.is_large_list_view))


def _row_of(offsets: np.ndarray, point: int) -> int:
    return int(np.searchsorted(offsets, point, side="right") - 1)


def _ids(columns: dict, count: int) -> list[str]:
    """Each row's ``key.map_id``, or its row number where the table has none."""
    import pyarrow as pa

    key = columns.get("key")
    if key is None or key.type.get_field_index("map_id") < 0:
        return [str(i) for i in range(count)]
    ids = key.field("map_id").cast(pa.string()).to_pylist()
    return [str(i) if value is None else value for i, value in enumerate(ids)]


def _lanes(table: tuple[str, bytes], source: str) -> list[Lane]:
    columns = _read(table, "lane", {"lane": ("left_rail", "right_rail"), "key": ("map_id",)}, source, MAX_LANES)
    lane, where = columns["lane"], f"{source}: {table[0]}: lane"
    ids = _ids(columns, len(lane))
    rails = [_polylines(_struct_field(lane, r, where), f"{where}.{r}", ids) for r in ("left_rail", "right_rail")]
    return [Lane(_midline(a, b, f"{where} {quoted(i)}"), i, None, f"{source} lane {quoted(i)}")
            for i, a, b in zip(ids, *rails)]


def _midline(left: np.ndarray, right: np.ndarray, what: str) -> np.ndarray:
    """The centreline between a lane's rails: point by point, or at equal shares of each rail's length."""
    for rail, name in ((left, "left_rail"), (right, "right_rail")):
        if len(rail) < 2:
            raise TerraInputError(f"{what}: its {name} has {len(rail)} point(s); a rail needs at least 2")
    if len(left) == len(right):
        return (left + right) / 2.0
    shares = []
    for rail, name in ((left, "left_rail"), (right, "right_rail")):
        along = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(rail, axis=0).T))])
        if along[-1] <= 0.0:
            raise TerraInputError(f"{what}: its {name} has no length; a rail needs at least 2 distinct points")
        shares.append(along / along[-1])
    u = np.union1d(*shares)
    return np.stack([(np.interp(u, shares[0], left[:, k]) + np.interp(u, shares[1], right[:, k])) / 2.0
                     for k in range(2)], axis=-1)


def _boundaries(table: tuple[str, bytes], source: str) -> list[np.ndarray]:
    columns = _read(table, "road_boundary", {"road_boundary": ("location",), "key": ("map_id",)}, source, MAX_LANES)
    column, where = columns["road_boundary"], f"{source}: {table[0]}: road_boundary"
    return _polylines(_struct_field(column, "location", where), f"{where}.location", _ids(columns, len(column)))


def _next_lanes(table: tuple[str, bytes], source: str) -> dict[str, tuple[str, ...]]:
    """``lane id -> ids of the lanes it leads into`` from an association table's ``NEXT_LANE`` rows."""
    import pyarrow as pa

    columns = _read(table, "association", {"association": ("subjects", "objects"), "key": ("kind",)}, source,
                    MAX_POINTS)
    where = f"{source}: {table[0]}: association"
    if "key" not in columns or not pa.types.is_string(_struct_field(columns["key"], "kind", where).type):
        raise TerraInputError(f"{where}: needs a key.kind string (NEXT_LANE, ...) on each row")
    kinds = columns["key"].field("kind")
    subjects = _struct_field(columns["association"], "subjects", where)
    objects = _struct_field(columns["association"], "objects", where)
    if not pa.types.is_string(subjects.type) or not (_is_list(objects.type)
                                                     and pa.types.is_string(objects.type.value_type)):
        raise TerraInputError(f"{where}: subjects must be a lane id and objects a list of lane ids (strings), got "
                              f"{clipped(subjects.type)} and {clipped(objects.type)}")
    out: dict[str, tuple[str, ...]] = {}
    for kind, subject, targets in zip(kinds.to_pylist(), subjects.to_pylist(), objects.to_pylist()):
        if kind == "NEXT_LANE" and subject is not None:
            out[subject] = out.get(subject, ()) + tuple(t for t in targets or () if t is not None)
    return out


# ---------------------------------------------------------------------------------------------------- writing


def _key(clip_id: str, label: str, map_id: str) -> dict[str, str]:
    return {"clip_id": clip_id, "label_class_id": label, "map_id": map_id, "map_id_version": "v1"}


def _offset(points: np.ndarray, left_m: float) -> np.ndarray:
    """A polyline moved ``left_m`` to its left along the mean of its segments' normals."""
    tangent = np.gradient(points, axis=0)
    tangent /= np.linalg.norm(tangent, axis=1, keepdims=True)
    return points + left_m * np.stack([-tangent[:, 1], tangent[:, 0]], axis=-1)


def _point_lists(polylines: list[np.ndarray]) -> Any:
    """A parquet list column of ``{x, y, z}`` points (z = 0) from ``[N, 2]`` polylines."""
    import pyarrow as pa

    xy = np.concatenate(polylines) if polylines else np.zeros((0, 2))
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in polylines])]).astype(np.int32)
    points = pa.StructArray.from_arrays([pa.array(xy[:, 0]), pa.array(xy[:, 1]), pa.array(np.zeros(len(xy)))],
                                        names=["x", "y", "z"])
    return pa.ListArray.from_arrays(pa.array(offsets), points)


__all__ = ["LANE_WIDTH_M", "MAX_MAP_BYTES", "read_clipgt", "write_clipgt"]
