"""Actions ``[T, 6, 3]`` (float32) for the world model from every trajectory form a user may have.

``a_t[k] = [y, x, time]`` of point ``9 + 10 k`` (k = 0..5) of the ego trajectory that starts at frame ``t``."""

from __future__ import annotations

import csv
import numbers
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from terra.config.checks import MAX_FRAMES, Range, check_keys, shown
from terra.core.errors import TerraInputError
from terra.config.files import MAX_TRAJECTORY_BYTES, check_context_paths, load_json, open_input_file, read_input_text
from terra.contract.actions import (ACTION_POINT_INDICES, ACTION_TIMES, FRAME_RATE_HZ, FUTURE_POINTS,
                                    NUM_ACTION_TOKENS, finite_array, in_reach, number_from_text, validate_actions)
from terra.inputs.routes import ROUTE_HINTS, ROUTE_KEYS
from terra.inputs.trajectory import EgoTrajectory, MANOEUVRES, RATE_HZ, check_manoeuvre_params, manoeuvre_trajectory

FRAMES = Range(1, MAX_FRAMES, 16, whole=True)  # frames a trajectory or manoeuvre may be asked for
TRAJECTORY_KEYS = ("actions", "instruction_trajs", "trajectory", "manoeuvre")  # a JSON value's forms, one per value
TRAJECTORY_SUFFIXES = (".json", ".csv", ".npy")
TRAJECTORY_FILE_KEYS = (*TRAJECTORY_KEYS, *ROUTE_KEYS)  # every key a JSON trajectory object may hold
FILE_HOLDS = (f"a trajectory holds one of {', '.join(TRAJECTORY_KEYS)} and optionally {' or '.join(ROUTE_KEYS)} "
              "(docs/generate.md)")
MAPPING_KEYS = ("x", "y", "yaw", "t", "timestamp", "rate_hz")  # a "trajectory" mapping's


@dataclass(frozen=True)
class Manoeuvre:
    """A named manoeuvre: its world-frame motion (from the origin, heading +x), frames, name and checked parameters."""

    motion: EgoTrajectory
    frames: int
    name: str
    params: dict[str, float]


def actions_from_instruction_trajs(trajs: Any, source: str = "instruction_trajs") -> np.ndarray:
    """``[T, 6, 3]`` actions ``[y, x, time]`` from per-frame 60-point future trajectories ``[T, N>=60, 2|3]``."""
    arr = finite_array(trajs, source)
    if arr.ndim != 3 or arr.shape[1] < FUTURE_POINTS or arr.shape[2] < 2:
        raise TerraInputError(f"{source}: instruction trajectories must have shape [frames, >={FUTURE_POINTS} "
                              f"points, 2 or 3 (x, y[, z])], got {list(arr.shape)}; give 3 s of future points at 20 "
                              "Hz per frame")
    points = in_reach(arr[:, ACTION_POINT_INDICES, :2], source)  # [T, 6, (x, y)]
    times = np.broadcast_to(ACTION_TIMES[None, :, None], (len(arr), NUM_ACTION_TOKENS, 1))
    return np.concatenate([points[..., ::-1], times], axis=-1).astype(np.float32)


def actions_from_trajectory(trajectory: EgoTrajectory, num_frames: int | None = None) -> np.ndarray:
    """``[T, 6, 3]`` actions from a world-frame ego trajectory (frames at 10 Hz from its first sample)."""
    return actions_from_instruction_trajs(trajectory.instruction_trajs(num_frames))


def actions_for_manoeuvre(name: str, num_frames: int, **params: float) -> np.ndarray:
    """``[num_frames, 6, 3]`` actions for a named manoeuvre (parameters as :func:`manoeuvre_trajectory`)."""
    manoeuvre = manoeuvre_motion(name, num_frames, **params)
    return actions_from_trajectory(manoeuvre.motion, manoeuvre.frames)


def manoeuvre_motion(name: str, num_frames: int, **params: float) -> Manoeuvre:
    """A named manoeuvre over ``num_frames`` frames, its motion running 3 s past them."""
    if (isinstance(num_frames, bool) or not isinstance(num_frames, numbers.Integral)
            or not 1 <= num_frames <= MAX_FRAMES):
        raise TerraInputError(f"a manoeuvre needs a whole number of frames, at least 1 and at most {MAX_FRAMES} "
                              f"(got {shown(num_frames)})")
    params = check_manoeuvre_params(params)
    return Manoeuvre(manoeuvre_trajectory(name, (num_frames - 1) / FRAME_RATE_HZ + 3.0, **params), int(num_frames),
                     name, params)


def load_actions(path: str | Path, num_frames: int | None = None) -> np.ndarray:
    """Read any supported trajectory file and return its checked ``[T, 6, 3]`` actions."""
    source = str(path)
    with trajectory_file_errors(source):
        actions = actions_of(motion_of(read_trajectory_file(Path(path)), source, num_frames), source, num_frames)
    return validate_actions(actions, source, num_frames or 1)


def check_input_files(context: str | Sequence[str] | None, trajectory: str | Path | None) -> None:
    """The ``context`` paths and ``trajectory`` file checked before anything loads, nothing decoded (None: no input)."""
    if context is not None:
        check_context_paths(context)
    if trajectory is not None:
        if Path(trajectory).suffix.lower() not in TRAJECTORY_SUFFIXES:
            raise TerraInputError(f"trajectory file {trajectory} has an unknown type; use .json, .csv or .npy")
        open_input_file(trajectory, "trajectory file", MAX_TRAJECTORY_BYTES).close()


def read_trajectory_file(path: Path) -> Any:
    """A trajectory file's content by suffix: CSV → :class:`EgoTrajectory`, JSON → its value, ``.npy`` → an array."""
    suffix = path.suffix.lower()
    if suffix not in TRAJECTORY_SUFFIXES:
        raise TerraInputError(f"trajectory file {path} has an unknown type; use .json, .csv or .npy")
    if suffix == ".csv":
        return trajectory_from_csv(path)
    return load_json(path, "trajectory file") if suffix == ".json" else load_npy(path)


@contextmanager
def trajectory_file_errors(source: str) -> Iterator[None]:
    """Malformed content of trajectory file ``source`` (a decoding error, a bad number) as one line."""
    try:
        yield
    except TerraInputError:
        raise
    except (OSError, ValueError, TypeError, EOFError) as err:  # malformed content (UnicodeDecodeError is a ValueError)
        message = str(err).splitlines()[0] if str(err).strip() else ""
        raise TerraInputError(f"trajectory file {source} cannot be read ({type(err).__name__}: {message[:200]}); "
                              "check that it is a valid .json, .csv or .npy file") from None


def load_npy(path: Path) -> np.ndarray:
    """A ``.npy`` array of real numbers whose header matches the file's size (checked before reading it)."""
    with open_input_file(path, "trajectory file", MAX_TRAJECTORY_BYTES) as fh:
        version = np.lib.format.read_magic(fh)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"unsupported .npy format version {version}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(fh)
        if dtype.kind not in "biuf":
            raise TerraInputError(f"trajectory file {path} holds {dtype} values, not real numbers; save a float array")
        expected = int(np.prod(shape, dtype=object)) * dtype.itemsize
        remaining = os.fstat(fh.fileno()).st_size - fh.tell()
        if remaining != expected:
            raise TerraInputError(f"trajectory file {path} has {remaining} bytes of data but its header promises "
                                  f"{expected}; the file is truncated or damaged")
        fh.seek(0)
        return np.load(fh, allow_pickle=False)


def actions_from_value(value: Any, source: str, num_frames: int | None, skip: int = 0,
                       min_frames: int = 1) -> np.ndarray:
    """Checked actions from a decoded JSON value or array less the first ``skip`` frames; ``min_frames`` must remain."""
    return validate_actions(actions_of(motion_of(value, source, num_frames), source, num_frames)[skip:], source,
                            min_frames)


def actions_of(motion: Any, source: str, num_frames: int | None) -> Any:
    """``[T, 6, 3]`` actions of what :func:`motion_of` found, not yet checked as a whole."""
    if isinstance(motion, Manoeuvre):
        return actions_from_trajectory(motion.motion, motion.frames)
    if isinstance(motion, EgoTrajectory):  # its own frames, or just the num_frames a rollout needs when it has more
        own = motion.num_frames()
        if num_frames is None and own > MAX_FRAMES:
            raise TerraInputError(f"{source}: spans {own} frames at {FRAME_RATE_HZ:g} Hz, more than the {MAX_FRAMES} "
                                  "a rollout may have; trim it or check the timestamps (seconds)")
        return actions_from_trajectory(motion, own if num_frames is None else min(own, num_frames))
    return motion


def motion_of(value: Any, source: str, num_frames: int | None, manoeuvre: bool = True) -> Any:
    """A trajectory value as an :class:`EgoTrajectory`, a :class:`Manoeuvre` or per-frame actions not yet checked."""
    if isinstance(value, EgoTrajectory):  # a CSV file, as read_trajectory_file returns it
        return value
    if isinstance(value, dict):
        check_keys(value, TRAJECTORY_FILE_KEYS, source, FILE_HOLDS,
                   {**{key: key for key in TRAJECTORY_KEYS}, **ROUTE_HINTS})
        keys = [k for k in TRAJECTORY_KEYS if k in value]
        if not manoeuvre and keys == ["manoeuvre"]:
            raise TerraInputError(f"{source}: names a manoeuvre; a driving log needs the recorded trajectory")
        if len(keys) != 1:
            raise TerraInputError(f"{source}: expected exactly one of the keys actions, instruction_trajs, "
                                  f"trajectory, manoeuvre (found {sorted(value)})")
        key = keys[0]
        if key == "actions":
            return value[key]
        if key == "instruction_trajs":
            return actions_from_instruction_trajs(value[key], source)
        if key == "trajectory":
            return trajectory_from_mapping(value[key], source)
        spec = value[key]
        if not isinstance(spec, (str, dict)):
            raise TerraInputError(f"{source}: manoeuvre must be a name or an object {{\"name\": ..., "
                                  f"\"speed_kmh\": ...}} (got {shown(spec)})")
        spec = {"name": spec} if isinstance(spec, str) else dict(spec)
        name = spec.pop("name", None)
        if name not in MANOEUVRES:
            raise TerraInputError(f"{source}: unknown manoeuvre {shown(name)}; choose one of: {', '.join(MANOEUVRES)}")
        frames = spec.pop("num_frames", num_frames)
        if frames is None:
            raise TerraInputError(f"{source}: the manoeuvre needs num_frames; add it to the object or the command")
        frames = FRAMES.check(frames, "num_frames", f"{source}: manoeuvre ")
        return manoeuvre_motion(str(name), frames, **check_manoeuvre_params(spec, source))
    arr = finite_array(value, source)
    if arr.ndim == 3 and arr.shape[1:] == (NUM_ACTION_TOKENS, 3):
        return arr
    if arr.ndim == 3:
        return actions_from_instruction_trajs(arr, source)
    if arr.ndim == 2 and arr.shape[1] in (2, 3):
        return trajectory_from_mapping(arr, source)
    raise TerraInputError(f"{source}: array of shape {list(arr.shape)} is not a trajectory; use [T, 6, 3] actions, "
                          "[T, 60, 3] instruction trajectories or [N, 2|3] world-frame x, y[, yaw] at 10 Hz")


def trajectory_action(trajectory: Any, source: str = "action trajectory") -> np.ndarray:
    """One frame's checked ``[6, 3]`` action from the car's path ahead in its ego frame (a mapping or 10 Hz points)."""
    return actions_from_value({"trajectory": trajectory}, source, 1)[0]


def trajectory_from_mapping(spec: Any, source: str) -> EgoTrajectory:
    """``{"x": [...], "y": [...], "yaw"?: [...], "t"?: [...], "rate_hz"?: 10}`` or a list of points."""
    if not isinstance(spec, dict):
        arr = finite_array(spec, source)
        if arr.ndim != 2 or arr.shape[1] not in (2, 3):
            raise TerraInputError(f"{source}: trajectory points must be [N, 2|3] (x, y[, yaw]), got {list(arr.shape)}")
        return EgoTrajectory.from_arrays(arr[:, 0], arr[:, 1], arr[:, 2] if arr.shape[1] == 3 else None, source=source)
    check_keys(spec, MAPPING_KEYS, f"{source}: trajectory", "a trajectory mapping holds x, y and optionally yaw, t "
               "(or timestamp) or rate_hz; a road or ego_routes go beside it, not inside")
    missing = [k for k in ("x", "y") if k not in spec]
    if missing:
        raise TerraInputError(f"{source}: trajectory lacks {', '.join(missing)}; give x and y lists in metres")
    t = spec.get("t", spec.get("timestamp"))
    return EgoTrajectory.from_arrays(
        finite_array(spec["x"], f"{source}: x"), finite_array(spec["y"], f"{source}: y"),
        None if spec.get("yaw") is None else finite_array(spec["yaw"], f"{source}: yaw"),
        None if t is None else finite_array(t, f"{source}: t"),
        rate_hz=RATE_HZ.check(spec.get("rate_hz", FRAME_RATE_HZ), "rate_hz", f"{source}: "), source=source,
    )


def trajectory_from_csv(path: Path) -> EgoTrajectory:
    """A world-frame trajectory from a CSV whose header names x, y and optionally t/timestamp and yaw."""
    rows = list(csv.reader(read_input_text(path, "trajectory file").splitlines()))
    if not rows:
        raise TerraInputError(f"trajectory file {path} is empty; add a header row (t,x,y[,yaw]) and points")
    header = [h.strip().lower() for h in rows[0]]
    if "x" not in header or "y" not in header:
        raise TerraInputError(f"trajectory file {path}: the header {rows[0]} must name columns x and y (and t, yaw)")
    try:
        data = np.array([[number_from_text(v) for v in row] for row in rows[1:] if row], dtype=np.float64)
    except ValueError as err:
        raise TerraInputError(f"trajectory file {path}: a value is not a number ({err}); fix that row") from None
    if data.ndim != 2 or data.shape[0] < 2 or data.shape[1] != len(header):
        raise TerraInputError(f"trajectory file {path}: needs at least 2 rows of {len(header)} values each")
    col = {name: data[:, i] for i, name in enumerate(header)}
    return EgoTrajectory.from_arrays(col["x"], col["y"], col.get("yaw"), col.get("t", col.get("timestamp")),
                                     source=str(path))
