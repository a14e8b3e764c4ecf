"""The videos to score: finding them, matching them to samples, decoding and preprocessing them."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from terra.config.actbench import sample_id_in_name, video_name
from terra.core.errors import TerraInputError
from terra.scoring.samples import BenchSample

RESIZE_RATIO = 256 / 224  # ACT-Bench resizes to 256x256 and crops 224x224


def find_videos(folder: Path) -> dict[int, Path]:
    """``{sample_id: path}`` of the ``*.mp4`` files in ``folder``; one line for a badly named or unreadable one."""
    videos: dict[int, Path] = {}
    for path in sorted(folder.glob("*.mp4")):
        if path.name.startswith("."):
            continue
        sample_id = sample_id_in_name(path.stem)
        if sample_id is None:
            raise TerraInputError(f"video {path} is not named <name>_<sample_id>.mp4 (e.g. {video_name(123)}, "
                                  "as output.naming=actbench writes); rename it or move it out of the folder")
        if not path.is_file():
            raise TerraInputError(f"video {path} is not a regular file")
        if sample_id in videos:
            raise TerraInputError(f"videos {videos[sample_id].name} and {path.name} both end in sample id {sample_id}; "
                                  "keep one")
        videos[sample_id] = path
    return videos


def match_videos(samples: Sequence[BenchSample], videos: dict[int, Path], folder: Path) -> list[Path]:
    """The video of each sample, in order; one line listing the first samples that have none."""
    missing = [s.sample_id for s in samples if s.sample_id not in videos]
    if missing:
        first = ", ".join(map(str, missing[:5]))
        raise TerraInputError(f"{len(missing)} of {len(samples)} samples have no video in {folder} (first: sample "
                              f"{first}; expected e.g. {video_name(missing[0])}); generate them or pass "
                              "the folder that holds them")
    return [videos[s.sample_id] for s in samples]


def resize_size(crop: tuple[int, int]) -> tuple[int, int]:
    """The size frames are resized to before the centre crop ``crop`` (256x256 for 224x224)."""
    return round(crop[0] * RESIZE_RATIO), round(crop[1] * RESIZE_RATIO)


def count_frames(path: Path) -> int:
    """A video's frames, counted from its packets; :class:`TerraInputError` if PyAV cannot open it."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise TerraInputError(f"video {path} has no video stream")
            return sum(1 for packet in container.demux(container.streams.video[0]) if packet.size)
    except av.FFmpegError as err:
        raise TerraInputError(f"video {path} cannot be read ({type(err).__name__}: {err.strerror or err})") from None


def decode_last(path: Path, num_frames: int) -> list:
    """The last ``num_frames`` frames of a video as PyAV frames, in the video's own pixel format."""
    import av

    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise TerraInputError(f"video {path} cannot be decoded (it has no video stream); generate it again")
            kept: deque = deque(maxlen=num_frames)
            count = 0
            for frame in container.decode(container.streams.video[0]):
                kept.append(frame)
                count += 1
    except av.FFmpegError as err:
        raise TerraInputError(f"video {path} cannot be decoded ({type(err).__name__}: {err.strerror or err}); "
                              "generate it again") from None
    if count < num_frames:
        raise TerraInputError(f"video {path} has {count} frames; scoring needs at least {num_frames} (it scores the "
                              f"last {num_frames}: num_frames={num_frames} after the context frames)")
    return list(kept)


def preprocess(frames: Sequence, crop: tuple[int, int]) -> Tensor:
    """Frames → uint8 ``[3, T, crop_h, crop_w]``, resized and centre-cropped as torchvision does."""
    size = resize_size(crop)
    top, left = int(round((size[0] - crop[0]) / 2.0)), int(round((size[1] - crop[1]) / 2.0))
    clip = torch.empty((3, len(frames), *crop), dtype=torch.uint8)
    for t, frame in enumerate(frames):
        rgb = frame if isinstance(frame, np.ndarray) else frame.to_ndarray(format="rgb24")
        image = torch.from_numpy(rgb).permute(2, 0, 1)[None].float()
        image = F.interpolate(image, size=size, mode="bilinear", align_corners=False, antialias=True)
        clip[:, t] = image[0, :, top: top + crop[0], left: left + crop[1]].round_().to(torch.uint8)
    return clip


class VideoClips(Dataset):
    """Item ``i``: ``(i, frames uint8 [3, T, h, w], None)``, or ``(i, None, error line)`` for a bad video."""

    def __init__(self, paths: Sequence[Path], num_frames: int, crop: tuple[int, int]) -> None:
        self.paths, self.num_frames, self.crop = list(paths), num_frames, crop

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[int, Tensor | None, str | None]:
        try:
            return index, preprocess(decode_last(self.paths[index], self.num_frames), self.crop), None
        except TerraInputError as err:
            return index, None, str(err)


def collate(items: list[tuple[int, Tensor | None, str | None]]) -> tuple[list[int], Tensor | None, list[str]]:
    """A batch of :class:`VideoClips` items: indices, stacked frames (None when an item failed), error lines."""
    errors = [error for _, _, error in items if error is not None]
    frames = None if errors else torch.stack([clip for _, clip, _ in items])
    return [index for index, _, _ in items], frames, errors
