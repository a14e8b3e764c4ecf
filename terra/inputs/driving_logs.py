"""Driving logs: a folder of recorded clips → frames at the model's 10 Hz and one action per frame."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from functools import partial
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from terra.config.checks import MAX_FRAMES, one_line
from terra.core.errors import TerraInputError
from terra.config.files import open_input_file, read_input_text
from terra.core.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES
from terra.contract.actions import FRAME_RATE_HZ, validate_actions
from terra.inputs.actions import (TRAJECTORY_SUFFIXES, actions_from_trajectory, motion_of, read_trajectory_file,
                                  trajectory_file_errors)
from terra.inputs.routes import ROUTE_KEYS
from terra.inputs.trajectory import MAX_TIME_S, EgoTrajectory
from terra.tokenizer.resize import fit_frame

TRAJECTORY_STEM = "trajectory"
ROAD_FILES = ("road.json", "road.csv")  # a clip's road, never its trajectory
CLIPGT_MAPS = ("clipgt", "clipgt.zip")  # AlpaSim's map: a folder of its parquet tables, or their zip
TIMESTAMPS_FILE = "timestamps.txt"
MAX_TICK_OFFSET_S = 0.06  # a kept frame lies at most this far from its 10 Hz tick
MILLISECONDS_HINT_S = 10.0  # images this far apart (median) were timed in milliseconds, not seconds
TIME_SLACK_S = 1e-3  # how much of the frames' span a trajectory may miss at either end
MAX_VIDEO_BYTES = 1 << 40


@dataclass(frozen=True)
class Clip:
    """One clip folder's files."""

    images: tuple[Path, ...]  # in name order; empty for a video clip
    video: Path | None
    trajectory: Path
    timestamps: Path | None  # timestamps.txt of an image clip
    road: Path | None = None  # road.json, road.csv, clipgt/ or clipgt.zip

    @property
    def shared_clock(self) -> bool:
        """True when the frames' times and the trajectory's are on one clock (``timestamps.txt``)."""
        return self.timestamps is not None


@dataclass
class Resampled:
    """What :func:`clip_frames` kept, filled while it runs: each tick's time and its source frame."""

    times: list[float] = field(default_factory=list)  # the 10 Hz ticks (the clip's clock), seconds
    indices: list[int] = field(default_factory=list)  # source frame nearest to each tick
    source_frames: int = 0  # frames the clip holds


def clip_folders(logs: Path) -> list[Path]:
    """The clip folders of ``logs``: its sub-folders that are not hidden, in name order."""
    return sorted(p for p in logs.iterdir() if p.is_dir() and not p.name.startswith("."))


def open_clip(folder: Path) -> Clip:
    """The frames, video, trajectory and timestamps of a clip folder; one line for a folder off the rules."""
    files = sorted(p for p in folder.iterdir() if not p.name.startswith(".") and p.is_file())
    images = tuple(p for p in files if p.suffix.lower() in IMAGE_SUFFIXES)
    videos = [p for p in files if p.suffix.lower() in VIDEO_SUFFIXES]
    timestamps = folder / TIMESTAMPS_FILE if (folder / TIMESTAMPS_FILE) in files else None
    if images and videos:
        raise TerraInputError(f"holds both images and a video ({videos[0].name}); keep one of them per clip")
    if len(videos) > 1:
        names = ", ".join(p.name for p in videos[:3])
        raise TerraInputError(f"holds {len(videos)} videos ({names}); keep one per clip")
    if not images and not videos:
        raise TerraInputError(f"holds no frames ({', '.join('*' + s for s in IMAGE_SUFFIXES)}) and no video "
                              f"({', '.join('*' + s for s in VIDEO_SUFFIXES)})")
    if videos and timestamps is not None:
        raise TerraInputError(f"holds a video and {TIMESTAMPS_FILE}; a video's frames carry their own timestamps, "
                              f"remove {TIMESTAMPS_FILE}")
    candidates = [p for p in files if p.suffix.lower() in TRAJECTORY_SUFFIXES and p.name not in ROAD_FILES]
    chosen = [p for p in candidates if p.stem.lower() == TRAJECTORY_STEM] or candidates
    if len(chosen) != 1:
        names = ", ".join(p.name for p in chosen[:4])
        raise TerraInputError(
            "has no trajectory file (trajectory.json, .csv or .npy)" if not chosen else
            f"holds {len(chosen)} possible trajectory files ({names}); keep one, or name the one to use "
            "trajectory.json, .csv or .npy")
    roads = [folder / name for name in (*ROAD_FILES, *CLIPGT_MAPS) if (folder / name).exists()]
    if len(roads) > 1:
        raise TerraInputError(f"holds {len(roads)} roads ({', '.join(p.name for p in roads)}); keep one of road.json, "
                              "road.csv, clipgt/ and clipgt.zip")
    return Clip(images, videos[0] if videos else None, chosen[0], timestamps, roads[0] if roads else None)


def read_motion(path: Path) -> EgoTrajectory | np.ndarray:
    """A clip's trajectory file: a world-frame :class:`EgoTrajectory` or checked per-frame actions ``[T, 6, 3]``."""
    source = str(path)
    with trajectory_file_errors(source):
        value = read_trajectory_file(path)
        carried = [key for key in ROUTE_KEYS if isinstance(value, dict) and value.get(key) is not None]
        if carried:
            raise TerraInputError(f"{source}: carries {carried[0]!r}, but a clip's road is read from road.json, "
                                  "road.csv or clipgt/ beside its trajectory (docs/train.md); move it there")
        motion = motion_of(value, source, None, manoeuvre=False)
    return motion if isinstance(motion, EgoTrajectory) else validate_actions(motion, source, 1)


def clip_frames(clip: Clip, image_size: tuple[int, int], resize: str, frame_rate_hz: float,
                kept: Resampled) -> Iterator[Callable[[], np.ndarray]]:
    """The clip's 10 Hz frames as calls that each read one and fit it to ``image_size`` (uint8 ``[H, W, 3]``)."""
    if clip.video is not None:
        for frame in resample(_video_frames(clip.video), kept):
            yield partial(_fit_video_frame, frame, str(clip.video), image_size, resize)
    else:
        times = _image_times(clip, frame_rate_hz)
        for path in resample(zip(times, clip.images), kept):
            yield partial(_read_image, path, image_size, resize)


def _fit_video_frame(frame: Any, source: str, image_size: tuple[int, int], resize: str) -> np.ndarray:
    """A decoded PyAV frame fitted to ``image_size``."""
    return fit_frame(frame.to_image(), image_size, source, resize)


def _read_image(path: Path, image_size: tuple[int, int], resize: str) -> np.ndarray:
    """An image file read and fitted as context frames are."""
    from terra.tokenizer.images import load_frames

    return load_frames([path], image_size, resize=resize)[0]


def resample(frames: Iterable[tuple[float | None, Any]], kept: Resampled) -> Iterator[Any]:
    """The frame nearest each 10 Hz tick of time-ordered ``(time, frame)`` pairs; ``kept`` records them."""
    first = previous = None  # previous: (time, index, frame)
    tick = 0
    for index, (time, frame) in enumerate(frames):
        kept.source_frames = index + 1
        if time is None or not np.isfinite(time):
            raise TerraInputError(f"frame {index} has no timestamp")
        if previous is None:
            first = time
        elif time <= previous[0]:
            raise TerraInputError(f"frame times must increase, but frame {index} is at {time:.6g} s after "
                                  f"{previous[0]:.6g} s")
        while (at := first + tick / FRAME_RATE_HZ) <= time + 1e-6:  # 1 us: float error of Unix times
            if tick >= MAX_FRAMES:
                raise TerraInputError(f"spans more than {MAX_FRAMES} frames at {FRAME_RATE_HZ:g} Hz; split it")
            near = previous if previous is not None and at - previous[0] <= time - at else (time, index, frame)
            if abs(near[0] - at) > MAX_TICK_OFFSET_S:
                raise TerraInputError(f"has no frame within {MAX_TICK_OFFSET_S:g} s of {at - first:.2f} s into the "
                                      f"clip (dropped frames, or fewer than about 8 per second)")
            kept.times.append(at)
            kept.indices.append(near[1])
            yield near[2]
            tick += 1
        previous = (time, index, frame)


def clip_actions(motion: EgoTrajectory | np.ndarray, kept: Resampled, shared_clock: bool) -> np.ndarray:
    """Actions ``[T, 6, 3]`` of the kept frames from :func:`read_motion`'s result."""
    if isinstance(motion, np.ndarray):
        if len(motion) != kept.source_frames:
            raise TerraInputError(f"its trajectory file holds {len(motion)} per-frame entries for "
                                  f"{kept.source_frames} frames; give one per image or video frame")
        return motion[kept.indices]
    ticks = frame_times(motion, kept, shared_clock)
    return actions_from_trajectory(_starting_at(motion, ticks[0]), len(ticks))


def frame_times(trajectory: EgoTrajectory, kept: Resampled, shared_clock: bool) -> np.ndarray:
    """The kept frames' 10 Hz ticks on the trajectory's clock, which it must cover."""
    ticks = np.asarray(kept.times)
    if not shared_clock:
        ticks = ticks - ticks[0] + trajectory.t[0]
    if trajectory.t[0] > ticks[0] + TIME_SLACK_S or trajectory.t[-1] < ticks[-1] - TIME_SLACK_S:
        span = (f"spans {trajectory.duration:.3f} s but the frames {ticks[-1] - ticks[0]:.3f} s" if not shared_clock
                else f"covers {trajectory.t[0]:.3f} to {trajectory.t[-1]:.3f} s but the frames {ticks[0]:.3f} to "
                     f"{ticks[-1]:.3f} s")
        raise TerraInputError(f"its trajectory {span}; give poses for the whole clip")
    return ticks


def _starting_at(trajectory: EgoTrajectory, start: float) -> EgoTrajectory:
    """The same motion from ``start`` on, so that frame 0 of its instruction trajectories lies at ``start``."""
    if start <= trajectory.t[0] + TIME_SLACK_S:
        return trajectory
    later = trajectory.t > start
    x, y, yaw = trajectory.poses_at(np.array([start]))[0]
    return EgoTrajectory(t=np.r_[start, trajectory.t[later]], x=np.r_[x, trajectory.x[later]],
                         y=np.r_[y, trajectory.y[later]], yaw=np.r_[yaw, trajectory.yaw[later]])


def _image_times(clip: Clip, frame_rate_hz: float) -> np.ndarray:
    """Each image's time: from ``timestamps.txt``, else at ``frame_rate_hz`` from 0 s."""
    if clip.timestamps is None:
        return np.arange(len(clip.images)) / frame_rate_hz
    times = []
    for number, line in enumerate(read_input_text(clip.timestamps, "timestamps file").splitlines(), 1):
        try:
            times += [float(line)] if line.strip() else []
        except ValueError:
            raise TerraInputError(f"{clip.timestamps}: line {number} is not a number of seconds") from None
    if len(times) != len(clip.images):
        raise TerraInputError(f"{clip.timestamps} holds {len(times)} times for {len(clip.images)} images; give one "
                              "per image, in file-name order")
    times = np.array(times, dtype=np.float64)
    if not np.all(np.isfinite(times)) or np.abs(times).max() > MAX_TIME_S:
        raise TerraInputError(f"{clip.timestamps} holds a time that is not finite or beyond {MAX_TIME_S:g}; give "
                              "seconds")
    steps = np.diff(times)
    if np.any(steps <= 0):  # said before resampling, which would find a gap around the misplaced time
        i = int(np.argmax(steps <= 0)) + 1
        raise TerraInputError(f"{clip.timestamps}: times must increase in the images' file-name order, but "
                              f"{one_line(clip.images[i].name)} is at {times[i]:.6g} s, not after "
                              f"{one_line(clip.images[i - 1].name)} at {times[i - 1]:.6g} s; put the times in "
                              "that order")
    if len(steps) and np.median(steps) >= MILLISECONDS_HINT_S:
        raise TerraInputError(f"{clip.timestamps}: the images are {np.median(steps):.6g} s apart (median), which "
                              "looks like milliseconds; give the times in seconds")
    return times


def _video_frames(path: Path) -> Iterator[tuple[float | None, Any]]:
    """``(seconds, PyAV frame)`` of every frame of a video in order; one line for an undecodable or truncated video."""
    import av

    with open_input_file(path, "video", MAX_VIDEO_BYTES) as fh:
        try:
            with av.open(fh) as container:
                if not container.streams.video:
                    raise TerraInputError(f"video {path} has no video stream")
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                count = 0
                for frame in container.decode(stream):
                    count += 1
                    yield frame.time, frame
                if count == 0 or count < stream.frames:
                    raise TerraInputError(f"video {path} holds {count} of the {stream.frames} frames its header "
                                          "lists; the file is truncated or damaged")
        except av.FFmpegError as err:
            raise TerraInputError(f"video {path} cannot be decoded ({type(err).__name__}); the file is truncated "
                                  "or damaged") from None
