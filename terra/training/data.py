"""Training data: tokenized clips in memory, and the windows a training step draws from them."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from terra.contract.routes import no_route, resample_routes, slot_routes
from terra.core.errors import TerraInputError
from terra.sim.tokens import load_tokens
from terra.training.shards import read_index, read_shard

# a clip as loaded: id, codes [T, P], actions [T, 6, 3], routes [T, M, 3] or None
ClipPart = tuple[str, np.ndarray, np.ndarray, "np.ndarray | None"]


class Windows(NamedTuple):
    """A batch of windows as the training-style forward takes them."""

    codes: torch.Tensor  # int64 [B, W*P]
    actions: torch.Tensor  # float32 [B, W*6, 3]
    routes: torch.Tensor | None  # float32 [B, W*K, 3] the route slots' values (NaN: no route); None: no route data
    first_target_frame: torch.Tensor | None = None  # int64 [B] no frame before it is trained; None: none held back

    def rows(self, part: slice) -> "Windows":
        return Windows(*(None if t is None else t[part] for t in self))

    def to(self, device: torch.device | str) -> "Windows":
        return Windows(*(None if t is None else t.to(device) for t in self))


@dataclass(frozen=True)
class ClipSet:
    """Clips one after another: codes ``[F, P]`` int32, actions ``[F, 6, 3]``, routes ``[F, M, 3]`` or None."""

    codes: torch.Tensor
    actions: torch.Tensor
    starts: torch.Tensor  # int64 [n]
    lengths: torch.Tensor  # int64 [n]
    ids: tuple[str, ...]
    routes: torch.Tensor | None = None
    off_pose_frames: torch.Tensor | None = None  # int64 [n] each clip's first frames seen from off the car's pose

    @classmethod
    def concat(cls, parts: list[ClipPart]) -> "ClipSet":
        """A set of ``(id, codes [T, P], actions [T, 6, 3], routes [T, M, 3] or None)`` clips."""
        lengths = torch.tensor([len(c) for _, c, _, _ in parts], dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        codes = np.concatenate([c for _, c, _, _ in parts]) if parts else np.zeros((0, 0))
        actions = np.concatenate([a for _, _, a, _ in parts]) if parts else np.zeros((0, 6, 3))
        return cls(torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(actions.astype(np.float32)),
                   starts, lengths, tuple(i for i, _, _, _ in parts), _joined_routes(parts))

    def __len__(self) -> int:
        return len(self.ids)

    def window(self, clip: int, start: int, frames: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Codes ``[frames, P]``, actions ``[frames, 6, 3]``, slot routes ``[frames, M, 3]`` or None from ``start``."""
        lo = int(self.starts[clip]) + start
        routes = None
        if self.routes is not None:
            end = int(self.starts[clip] + self.lengths[clip])
            routes = torch.from_numpy(slot_routes(self.routes[lo:end].numpy(), frames))
        return self.codes[lo:lo + frames], self.actions[lo:lo + frames], routes

    def frame_routes(self, clip: int, start: int, frames: int) -> np.ndarray | None:
        """One clip's routes ``[frames, M, 3]`` from ``start`` (``routes[t]``: frame ``t``'s); None without."""
        lo = int(self.starts[clip]) + start
        return None if self.routes is None else self.routes[lo:lo + frames].numpy()

    def with_route_tokens(self, route_tokens: int) -> "ClipSet":
        """The set with its routes resampled to a model's ``route_tokens``; none for 0."""
        if self.routes is None or not route_tokens:
            return replace(self, routes=None)
        return replace(self, routes=torch.from_numpy(resample_routes(self.routes.numpy(), route_tokens)))


def _joined_routes(parts: list[ClipPart]) -> torch.Tensor | None:
    """The clips' routes one after another; NaN for a clip without them among others, None when no clip has them."""
    given = [r for _, _, _, r in parts if r is not None]
    if not given:
        return None
    points = max(r.shape[1] for r in given)
    rows = [no_route(len(c), points) if r is None else resample_routes(r, points) for _, c, _, r in parts]
    return torch.from_numpy(np.concatenate(rows).astype(np.float32))


@dataclass(frozen=True)
class TrainingData:
    """Train and validation clips, and what tokenized them (the model's layout must match)."""

    train: ClipSet
    val: ClipSet
    codebook_size: int
    grid: tuple[int, int]
    tokenizer: str  # the tokenizer's folder, for decoding sample rollouts ('' when unknown)
    recoveries: ClipSet | None = None  # recovery clips trained on (module docstring); None: none given
    val_recoveries: ClipSet | None = None  # and held out

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def has_routes(self) -> bool:
        return self.train.routes is not None

    def for_route_slots(self, route_tokens: int) -> "TrainingData":
        resampled = {name: getattr(self, name).with_route_tokens(route_tokens)
                     for name in ("train", "val", "recoveries", "val_recoveries") if getattr(self, name) is not None}
        return replace(self, **resampled)


def load_training_data(path: str, val_clips: int, recoveries: str | None = None) -> TrainingData:
    """A shard folder or a tokenized-clips file in memory, with the recovery clips of ``recoveries`` when given."""
    data = _load_source(path, val_clips)
    if recoveries is None:
        return data
    clips = load_tokens(recoveries)
    grid = clips.grid_shape
    if (clips.codebook_size, grid) != (data.codebook_size, tuple(data.grid)):
        raise TerraInputError(
            f"data.recoveries={recoveries} holds codes of a {clips.codebook_size}-code tokenizer on a {grid[0]}x"
            f"{grid[1]} grid, data.tokens of a {data.codebook_size}-code one on {data.grid[0]}x{data.grid[1]}; "
            "tokenize both with the same tokenizer")
    if clips.routes is None:
        raise TerraInputError(f"data.recoveries={recoveries} holds no routes, and recovery clips teach a route model "
                              "to read its route; render them with terra-make-dataset recipe=recoveries")
    if int(clips.off_pose_frames.min()) < 1:
        raise TerraInputError(f"data.recoveries={recoveries} holds clips with no frame seen from off the car's pose "
                              "(not recovery clips, or rendered before they counted them); render them with "
                              "terra-make-dataset recipe=recoveries and tokenize them again")
    parts, off_pose = _file_parts(clips), torch.from_numpy(clips.off_pose_frames)
    cut = len(parts) - min(val_clips, len(parts) - 1)
    return replace(data, recoveries=replace(ClipSet.concat(parts[:cut]), off_pose_frames=off_pose[:cut]),
                   val_recoveries=replace(ClipSet.concat(parts[cut:]), off_pose_frames=off_pose[cut:])
                   if cut < len(parts) else None)


def _file_parts(clips) -> list[ClipPart]:
    return [(str(i), clips.codes[i].reshape(clips.codes.shape[1], -1), clips.actions[i],
             None if clips.routes is None else clips.routes[i]) for i in range(len(clips.codes))]


def _load_source(path: str, val_clips: int) -> TrainingData:
    if Path(path).is_dir():
        index = read_index(path)
        splits: dict[str, list] = {"train": [], "val": []}
        for entry in index.shards:
            codes, actions, routes = read_shard(path, index, entry)
            codes = codes.reshape(len(codes), -1)
            offset = 0
            for clip in entry.clips:
                part = slice(offset, offset + clip.frames)
                splits[entry.split].append((clip.id, codes[part], actions[part],
                                            None if routes is None else routes[part]))
                offset += clip.frames
        if not splits["train"]:
            raise TerraInputError(f"{path} holds no training clips; prepare more driving logs")
        return TrainingData(ClipSet.concat(splits["train"]), ClipSet.concat(splits["val"]), index.codebook_size,
                            tuple(index.grid), index.tokenizer)
    clips = load_tokens(path)
    num_clips = len(clips.codes)
    if val_clips >= num_clips:
        raise TerraInputError(f"data.val_clips must be in [0, {num_clips - 1}] for {num_clips} clips "
                              f"(got {val_clips})")
    parts = _file_parts(clips)
    cut = num_clips - val_clips
    return TrainingData(ClipSet.concat(parts[:cut]), ClipSet.concat(parts[cut:]), clips.codebook_size,
                        clips.grid_shape, clips.tokenizer)


class WindowSampler:
    """Uniformly random windows of ``frames`` consecutive frames; with routes, no route with ``no_route_share``."""

    def __init__(self, clips: ClipSet, frames: int, seed: int, no_route_share: float = 0.0,
                 recoveries: ClipSet | None = None, recovery_share: float = 0.0) -> None:
        counts = (clips.lengths - frames + 1).clamp(min=0)
        if int(counts.sum()) == 0:
            longest = int(clips.lengths.max()) if len(clips) else 0
            raise TerraInputError(f"no training clip holds a window of {frames} frames (the longest has {longest}); "
                                  f"lower train.window or prepare longer clips")
        if recoveries is not None and int(recoveries.lengths.min()) < frames:
            raise TerraInputError(f"data.recoveries has clips of {int(recoveries.lengths.min())} frames, shorter than "
                                  f"the training window of {frames}; render them with num_frames={frames}")
        if recoveries is not None and int(recoveries.off_pose_frames.max()) >= frames:
            raise TerraInputError(f"data.recoveries has clips seen from off the car's pose for "
                                  f"{int(recoveries.off_pose_frames.max())} frames, a whole training window of "
                                  f"{frames} or more; render them with num_frames={frames}")
        self.clips, self.frames, self.counts = clips, frames, counts
        self.no_route_share = no_route_share
        self.recoveries = recoveries
        self.recovery_share = recovery_share if recoveries is not None else 0.0
        self.ends = torch.cumsum(counts, 0)
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> Windows:
        """``batch_size`` random windows (:class:`Windows`): the recovery windows first."""
        recovering = 0  # no draw without recovery clips: such runs keep the windows they always drew
        if self.recovery_share:
            recovering = int((torch.rand(batch_size, generator=self.generator) < self.recovery_share).sum())
        picks = torch.randint(int(self.ends[-1]), (batch_size - recovering,), generator=self.generator)
        clip = torch.searchsorted(self.ends, picks, right=True)
        start = picks - (self.ends[clip] - self.counts[clip])
        windows = stack_windows(self.clips, clip.tolist(), start.tolist(), self.frames)
        if windows.routes is not None and self.no_route_share:  # no draw: runs without routes keep their windows
            blank = torch.rand(len(picks), generator=self.generator) < self.no_route_share
            windows = windows._replace(routes=windows.routes.masked_fill(blank[:, None, None], float("nan")))
        if not recovering:
            return windows
        chosen = torch.randint(len(self.recoveries), (recovering,), generator=self.generator).tolist()
        recovery = stack_windows(self.recoveries, chosen, [0] * recovering, self.frames)
        routes = recovery.routes
        if routes is not None:  # the other windows' routes, no route where their data has none
            routes = torch.cat([routes, windows.routes if windows.routes is not None
                                else torch.from_numpy(no_route(len(picks), routes.shape[1]))])
        first_target = torch.cat([recovery.first_target_frame, torch.zeros(len(picks), dtype=torch.int64)])
        return Windows(torch.cat([recovery.codes, windows.codes]), torch.cat([recovery.actions, windows.actions]),
                       routes, first_target)


def stack_windows(clips: ClipSet, clip: list[int], start: list[int], frames: int) -> Windows:
    """The windows as the training forward takes them; clips off the car's pose trained from their first on it."""
    parts = [clips.window(c, s, frames) for c, s in zip(clip, start)]
    width, slots = int(clips.codes.shape[1]) * frames, frames * int(clips.actions.shape[1])
    codes = torch.stack([p[0] for p in parts]).flatten(1).long() if parts else torch.zeros(0, width, dtype=torch.long)
    actions = torch.stack([p[1] for p in parts]).flatten(1, 2) if parts else torch.zeros(0, slots, 3)
    routes = None
    if clips.routes is not None:
        points = frames * int(clips.routes.shape[1])
        routes = torch.stack([p[2] for p in parts]).flatten(1, 2) if parts else torch.zeros(0, points, 3)
    first_target = None
    if clips.off_pose_frames is not None:
        first_target = (clips.off_pose_frames[clip] - torch.tensor(start, dtype=torch.int64)).clamp(min=0)
    return Windows(codes, actions, routes, first_target)


def validation_windows(clips: ClipSet, frames: int) -> list[int]:
    """Validation clips long enough for a window (each is scored on its first window)."""
    return [i for i in range(len(clips)) if int(clips.lengths[i]) >= frames]
