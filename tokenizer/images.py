"""Loading context frames: image files, folders, globs, video files or arrays → model-sized tensors."""

from __future__ import annotations

import glob
import io
import os
import stat
import warnings
from contextlib import contextmanager
from collections import deque
from pathlib import Path
from typing import IO, TYPE_CHECKING, Iterable, Iterator, Sequence, Union

import numpy as np
from PIL import Image

from terra.core.errors import TerraInputError
from terra.core.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES
from terra.tokenizer.resize import RESIZE_MODES, fit_frame

if TYPE_CHECKING:
    import torch

# 8-bit colour modes PIL converts to RGB without guessing (alpha dropped, grey replicated, palette expanded).
RGB_COMPATIBLE_MODES = ("RGB", "RGBA", "RGBX", "L", "LA", "P", "PA", "CMYK", "YCbCr", "1")

MAX_PIXELS = 8192 * 8192  # larger frames are no camera image (and a "decompression bomb" claims billions)

UPLOAD_FORMATS = ("PNG", "JPEG")  # a client's image (terra-serve's uploads, terra-alpasim's initial frames)
FILE_FORMATS = ("PNG", "JPEG", "BMP", "WEBP", "TIFF")  # a context frame's file: terra.core.media.IMAGE_SUFFIXES
_MAGIC = ((b"\x89PNG\r\n\x1a\n", "PNG"), (b"\xff\xd8\xff", "JPEG"), (b"BM", "BMP"), (b"II*\x00", "TIFF"),
          (b"MM\x00*", "TIFF"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"))

Source = Union[str, Path, np.ndarray, Image.Image]


def load_images(sources: Source | Sequence[Source], image_size: tuple[int, int], last_n: int | None = None,
                resize: str = "crop") -> torch.Tensor:
    """Frames from files/folders/globs/videos/arrays → float tensor ``[N, 3, H, W]`` in [-1, 1]."""
    return frames_to_tensor(load_frames(sources, image_size, last_n, resize))


def load_frames(sources: Source | Sequence[Source], image_size: tuple[int, int], last_n: int | None = None,
                resize: str = "crop") -> np.ndarray:
    """Like :func:`load_images` but returns uint8 ``[N, H, W, 3]`` (compact, for training data)."""
    if last_n is not None and last_n < 1:
        raise TerraInputError(f"last_n must be at least 1 (got {last_n})")
    if resize not in RESIZE_MODES:
        raise TerraInputError(f"unknown resize mode {resize!r}; choose one of: {', '.join(RESIZE_MODES)}")
    items = [sources] if isinstance(sources, (str, Path, np.ndarray, Image.Image)) else list(sources)
    if not items:
        raise TerraInputError("no images given; pass image files, a folder, a glob or a video file")
    frames: deque[tuple[str, Image.Image | Path]] = deque(maxlen=last_n)  # image files are read once kept
    for item in items:
        frames.extend(_expand(item))
    return np.stack([fit_frame(_read_image(frame) if isinstance(frame, Path) else frame, image_size, source, resize)
                     for source, frame in frames])


def frames_to_tensor(frames: np.ndarray) -> torch.Tensor:
    """uint8 ``[N, H, W, 3]`` → float32 ``[N, 3, H, W]`` in [-1, 1]."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def _expand(item: Source) -> Iterator[tuple[str, Image.Image | Path]]:
    """One source → (name for messages, RGB PIL frame, or the path of an image file still to read) pairs."""
    if isinstance(item, Image.Image):
        yield "image", _to_rgb(item, "image")
    elif isinstance(item, np.ndarray):
        yield from (("image array", frame) for frame in _from_array(item))
    else:
        path = Path(item).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not files:
                raise TerraInputError(f"folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)}); check the folder")
            yield from ((str(file), file) for file in files)
        elif os.path.lexists(path):
            yield from _read_file(path)
        elif glob.has_magic(str(item)):
            files = sorted(Path(p) for p in glob.glob(str(path)) if not Path(p).is_dir())
            if not files:
                raise TerraInputError(f"pattern {item} matches no files; check the glob")
            for file in files:
                yield from _read_file(file)
        else:
            raise TerraInputError(f"image path {item} does not exist; check the path")


def _read_file(path: Path) -> Iterator[tuple[str, Image.Image | Path]]:
    """An image or video file → (name, frame or path) pairs."""
    if path.suffix.lower() in VIDEO_SUFFIXES:
        with _open_regular(path) as fh:  # imageio would block on a FIFO
            gif = sniff_format(fh.read(12)) == "GIF"
        if path.suffix.lower() == ".gif" and not gif:
            raise TerraInputError(f"{path} cannot be read as a video (not a GIF file); pass an MP4/GIF file or "
                                  "extracted frames")
        yield from ((str(path), frame) for frame in _read_video(path, gif))
    else:
        yield str(path), path


def _open_regular(path: Path) -> IO[bytes]:
    """``path`` opened without blocking if it is a regular file; a FIFO, device or socket is refused at once."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise TerraInputError(f"image path {path} does not exist; check the path") from None
    except OSError as err:
        raise TerraInputError(f"{path} cannot be opened ({err.strerror}); check the path and its permissions") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TerraInputError(f"{path} is not a regular file (a FIFO, device or socket); pass an image or video file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _read_image(path: Path) -> Image.Image:
    """Decode one image file, after checking from its header that it is of a sane size."""
    with _open_regular(path) as fh:
        return _decode(fh, str(path), FILE_FORMATS, MAX_PIXELS)


def image_from_bytes(data: bytes, source: str, max_pixels: int = MAX_PIXELS) -> Image.Image:
    """An encoded PNG or JPEG image → an RGB PIL image, refused from its header above ``max_pixels`` pixels."""
    return _decode(io.BytesIO(data), source, UPLOAD_FORMATS, max_pixels)


def image_file_size(fh: IO[bytes], source: str) -> tuple[int, int]:
    """Width and height of the image in ``fh`` from its header, refused as :func:`load_images` refuses it."""
    with _opened(fh, source, FILE_FORMATS, MAX_PIXELS) as image:
        return image.size


def sniff_format(head: bytes) -> str | None:
    """The image format a file's first 12 bytes announce (PNG, JPEG, BMP, WEBP, TIFF, GIF; None: other)."""
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    return next((name for magic, name in _MAGIC if head.startswith(magic)), None)


def _decode(fh: IO[bytes], source: str, formats: tuple[str, ...], max_pixels: int) -> Image.Image:
    with _opened(fh, source, formats, max_pixels) as image:
        image.load()
    return _to_rgb(image, source)


@contextmanager
def _opened(fh: IO[bytes], source: str, formats: tuple[str, ...], max_pixels: int) -> Iterator[Image.Image]:
    """The image in ``fh`` opened by the one decoder its first bytes name, size checked; any failure is one line."""
    kind = sniff_format(fh.read(12))
    fh.seek(0)
    if kind not in formats:
        raise TerraInputError(f"{source} cannot be read as an image ({kind or 'unknown'} format, not "
                              f"{', '.join(formats)}); pass a PNG or JPEG file")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(fh, formats=[kind]) as image:
                _check_pixels(image.width, image.height, source, max_pixels)
                yield image
    except TerraInputError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise TerraInputError(f"{source} claims more than {max_pixels} pixels; pass camera frames, "
                              "e.g. 1920x1080") from None
    except Exception as err:  # a decoder fed a stranger's bytes may fail in any way: each is a refusal
        raise TerraInputError(f"{source} cannot be read as an image ({type(err).__name__}); pass a PNG or "
                              "JPEG file") from None


def _check_pixels(width: int, height: int, source: str, max_pixels: int = MAX_PIXELS) -> None:
    if width * height > max_pixels:
        raise TerraInputError(f"{source} is {width}x{height} pixels, more than the {max_pixels} a frame may have; "
                              "pass camera frames, e.g. 1920x1080")


def _to_rgb(image: Image.Image, source: str) -> Image.Image:
    if image.mode not in RGB_COMPATIBLE_MODES:
        raise TerraInputError(f"{source} has pixel mode {image.mode} ({len(image.getbands())} channel(s)), not an "
                              "8-bit colour image; save it as an 8-bit RGB PNG or JPEG")
    return image.convert("RGB")  # alpha is dropped


def _from_array(array: np.ndarray) -> Iterable[Image.Image]:
    """uint8 ``[H, W, 3]`` or ``[N, H, W, 3]`` arrays (RGB)."""
    arr = array[None] if array.ndim == 3 else array
    if arr.ndim != 4 or arr.shape[-1] != 3:
        raise TerraInputError(f"image array of shape {list(array.shape)} is not RGB; give [H, W, 3] or [N, H, W, 3]")
    if arr.dtype != np.uint8:
        raise TerraInputError(f"image array has dtype {arr.dtype}; give uint8 pixels in [0, 255]")
    return [Image.fromarray(frame, "RGB") for frame in arr]


def _read_video(path: Path, gif: bool) -> Iterator[Image.Image]:
    """The frames of a video file: a GIF by Pillow, any other by ffmpeg."""
    import imageio.v3 as iio

    try:
        count = 0
        for frame in iio.imiter(path, plugin="pillow" if gif else "FFMPEG"):
            frame = np.asarray(frame)
            _check_pixels(frame.shape[1], frame.shape[0], str(path))
            if frame.ndim == 2:
                frame = np.repeat(frame[..., None], 3, axis=-1)
            count += 1
            yield Image.fromarray(np.ascontiguousarray(frame[..., :3]).astype(np.uint8), "RGB")
    except TerraInputError:
        raise
    except (OSError, ValueError, RuntimeError, IndexError) as err:
        raise TerraInputError(f"{path} cannot be read as a video ({type(err).__name__}); pass an MP4/GIF file or "
                              "extracted frames") from None
    if count == 0:
        raise TerraInputError(f"video {path} has no frames; pass a video with at least one frame")
