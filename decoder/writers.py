"""Video writers: GIF, MP4 (H.264), PNG sequences and grids of several rollouts. Every write is atomic."""

from __future__ import annotations

import io
import os
import shutil
import signal
import subprocess
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Sequence

import imageio.v3 as iio
import numpy as np
from PIL import Image

from terra.core.atomic import atomic_path, write_failed
from terra.core.errors import TerraInputError

PNG_PATTERN = "frame_{:05d}.png"
MIN_FPS, MAX_FPS = 1.0, 60.0  # slower is a slide show; faster than GIF delays (1/100 s) and most players


def check_frames(frames: np.ndarray, what: str = "frames") -> np.ndarray:
    """Validate uint8 ``[T, H, W, 3]`` frames (T >= 1) and return them contiguous."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise TerraInputError(f"{what} must be uint8 [T>=1, H, W, 3] RGB, got {frames.dtype} {list(frames.shape)}; "
                              "convert with terra.decoder.frames.images_to_uint8")
    return np.ascontiguousarray(frames)


def check_fps(fps: float, name: str = "fps") -> float:
    """``fps`` as a float if it is a number from :data:`MIN_FPS` to :data:`MAX_FPS`; ``name`` is the setting."""
    try:
        ok = not isinstance(fps, (bool, str)) and MIN_FPS <= float(fps) <= MAX_FPS
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        raise TerraInputError(f"{name} must be a number from {MIN_FPS:g} to {MAX_FPS:g} (got {str(fps)[:40]}); "
                              f"e.g. {name}=10")
    return float(fps)


@contextmanager
def atomic_output(path: str | os.PathLike) -> Iterator[Path]:
    """:func:`atomic_path` whose OS errors (no space, file too large, not writable) become one-line errors."""
    try:
        with atomic_path(path) as tmp:
            yield tmp
    except OSError as err:
        raise write_failed(path, err) from None


def write_gif(path: str | os.PathLike, frames: np.ndarray, fps: float = 10.0, loop: int = 0) -> Path:
    """Looping GIF (``loop=0``: forever)."""
    frames, fps = check_frames(frames), check_fps(fps)
    images = [Image.fromarray(frame, "RGB") for frame in frames]
    with atomic_output(path) as tmp, tmp.open("wb") as fh:  # Pillow itself: a failed write raises once, here
        images[0].save(fh, format="GIF", save_all=True, append_images=images[1:], duration=round(1000.0 / fps),
                       loop=loop)
    return Path(path)


def ffmpeg_exe() -> str:
    """The ffmpeg binary for MP4 output (imageio-ffmpeg's, or ``IMAGEIO_FFMPEG_EXE``); one error line when none runs."""
    try:
        import imageio_ffmpeg
    except ImportError:
        raise TerraInputError("MP4 output needs imageio-ffmpeg; `pip install imageio[ffmpeg]` or write "
                              "GIF/PNG") from None
    try:
        exe = imageio_ffmpeg.get_ffmpeg_exe()  # IMAGEIO_FFMPEG_EXE is returned unchecked: which() checks it runs
    except RuntimeError:  # its binary is missing or not executable (a copy that lost its permissions, say)
        exe = None
    if exe is None or shutil.which(exe) is None:
        raise TerraInputError("MP4 output needs an ffmpeg binary that runs and imageio-ffmpeg found none; reinstall "
                              "imageio-ffmpeg, point IMAGEIO_FFMPEG_EXE at an ffmpeg, or write GIF/PNG")
    return exe


MACRO_BLOCK = 16  # frames are scaled up to multiples of it, as imageio.get_writer(path, fps=10) encodes


def mp4_command(exe: str, width: int, height: int, fps: float, path: str | os.PathLike) -> list[str]:
    """ffmpeg's arguments for raw RGB ``width`` x ``height`` frames on stdin → H.264 ``path``, as imageio-ffmpeg's."""
    command = [exe, "-y", "-f", "rawvideo", "-vcodec", "rawvideo", "-s", f"{width}x{height}", "-pix_fmt", "rgb24",
               "-r", str(Fraction(fps).limit_denominator()), "-i", "-", "-an",
               "-vcodec", "libx264", "-pix_fmt", "yuv420p"]
    out_width, out_height = -(-width // MACRO_BLOCK) * MACRO_BLOCK, -(-height // MACRO_BLOCK) * MACRO_BLOCK
    if (out_width, out_height) != (width, height):
        command += ["-vf", f"scale={out_width}:{out_height}"]
    return command + ["-v", "error", str(path)]


def write_mp4(path: str | os.PathLike, frames: np.ndarray, fps: float = 10.0) -> Path:
    """H.264 MP4 encoded by :func:`ffmpeg_exe` as :func:`mp4_command` says."""
    exe = ffmpeg_exe()
    frames, fps = check_frames(frames), check_fps(fps)
    height, width = frames.shape[1:3]
    with atomic_output(path) as tmp:
        command = mp4_command(exe, width, height, fps, tmp)
        # A session of its own: a Ctrl-C meant for this program reaches ffmpeg only through the kill below.
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, start_new_session=True)
        try:
            _, log = process.communicate(frames.tobytes())
        except BaseException:
            process.kill()
            process.wait()
            raise
        if process.returncode != 0:
            code = process.returncode
            stopped = f"stopped: {signal.strsignal(-code)}" if code < 0 else f"exit code {code}"
            reason = (log.decode(errors="replace").strip().splitlines() or [stopped])[-1]
            raise TerraInputError(f"cannot write {path} (ffmpeg: {reason[:200]}); free disk space or choose another "
                                  "output folder")
    return Path(path)


def encode_image(rgb: np.ndarray, image_format: str, quality: int = 90) -> bytes:
    """One uint8 ``[H, W, 3]`` frame → JPEG (``quality`` 1-100) or lossless PNG bytes."""
    buffer = io.BytesIO()
    options = dict(format="JPEG", quality=quality) if image_format == "jpeg" else dict(format="PNG", compress_level=1)
    Image.fromarray(rgb).save(buffer, **options)
    return buffer.getvalue()


def write_png_sequence(directory: str | os.PathLike, frames: np.ndarray) -> list[Path]:
    """``directory/frame_00000.png, ...``; leftover frames of an earlier, longer sequence are removed."""
    frames = check_frames(frames)
    directory = Path(directory)
    paths = []
    for index, frame in enumerate(frames):
        target = directory / PNG_PATTERN.format(index)
        with atomic_output(target) as tmp:  # creates the folder
            iio.imwrite(tmp, frame, extension=".png")
        paths.append(target)
    for old in set(directory.glob("frame_[0-9][0-9][0-9][0-9][0-9].png")) - set(paths):
        old.unlink()
    return paths


def write_video(path: str | os.PathLike, frames: np.ndarray, fps: float = 10.0) -> Path:
    """Write by suffix: ``.gif``, ``.mp4``, or a folder of PNGs when the path has no suffix."""
    suffix = Path(path).suffix.lower()
    if suffix == ".gif":
        return write_gif(path, frames, fps)
    if suffix == ".mp4":
        return write_mp4(path, frames, fps)
    if suffix == "":
        write_png_sequence(path, frames)
        return Path(path)
    raise TerraInputError(f"output {path} has an unsupported type {suffix}; use .gif, .mp4 or a folder name")


def tile_grid(rollouts: Sequence[np.ndarray], columns: int | None = None, gap: int = 4) -> np.ndarray:
    """Tile rollouts ``[T_i, H, W, 3]`` frame by frame into one video (row-major, ``gap`` black pixels)."""
    if not rollouts:
        raise TerraInputError("a grid needs at least one rollout")
    videos = [check_frames(v, f"rollout {i}") for i, v in enumerate(rollouts)]
    if len({v.shape[1:] for v in videos}) != 1:
        sizes = sorted({v.shape[1:3] for v in videos})
        raise TerraInputError(f"grid rollouts differ in frame size {sizes}; decode all at one size")
    columns = columns or int(np.ceil(np.sqrt(len(videos))))
    rows = int(np.ceil(len(videos) / columns))
    length = max(len(v) for v in videos)
    height, width = videos[0].shape[1:3]
    grid = np.zeros((length, rows * height + (rows - 1) * gap, columns * width + (columns - 1) * gap, 3), np.uint8)
    for i, video in enumerate(videos):
        r, c = divmod(i, columns)
        y, x = r * (height + gap), c * (width + gap)
        grid[:, y : y + height, x : x + width] = video[np.minimum(np.arange(length), len(video) - 1)]  # last one held
    return grid


def write_grid(path: str | os.PathLike, rollouts: Sequence[np.ndarray], fps: float = 10.0, columns: int | None = None,
               gap: int = 4) -> Path:
    """Tile several rollouts side by side (see :func:`tile_grid`) and write them with :func:`write_video`."""
    return write_video(path, tile_grid(rollouts, columns, gap), fps)
