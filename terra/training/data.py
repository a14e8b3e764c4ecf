"""Training data: tokenized clips in memory, and the windows a training step draws from them.

Two sources, told apart by what ``data.tokens`` names:

* a folder of shards (terra/training/shards.py, written by ``terra-prepare-logs``): clips of any
  length, already split into train and validation by clip;
* a tokenized-clips file (terra/sim/tokens.py, written by ``terra-tokenize``): clips of equal
  length, of which the last ``data.val_clips`` are held out.

Every process draws the same global batch of windows from one seeded generator and takes its own slice, so a
run on N processes trains on exactly the windows a one-process run would (terra/training/run.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from terra.core.errors import TerraInputError
from terra.sim.tokens import load_tokens
from terra.training.shards import read_index, read_shard


@dataclass(frozen=True)
class ClipSet:
    """Clips one after another: codes ``[F, P]`` (int32), actions ``[F, 6, 3]``, each clip's first frame."""

    codes: torch.Tensor
    actions: torch.Tensor
    starts: torch.Tensor  # int64 [n]
    lengths: torch.Tensor  # int64 [n]
    ids: tuple[str, ...]

    @classmethod
    def concat(cls, parts: list[tuple[str, np.ndarray, np.ndarray]]) -> "ClipSet":
        """A set of ``(id, codes [T, P], actions [T, 6, 3])`` clips."""
        lengths = torch.tensor([len(c) for _, c, _ in parts], dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        width = parts[0][1].shape[1] if parts else 0
        codes = np.concatenate([c for _, c, _ in parts]) if parts else np.zeros((0, width))
        actions = np.concatenate([a for _, _, a in parts]) if parts else np.zeros((0, 6, 3))
        return cls(torch.from_numpy(codes.astype(np.int32)), torch.from_numpy(actions.astype(np.float32)),
                   starts, lengths, tuple(i for i, _, _ in parts))

    def __len__(self) -> int:
        return len(self.ids)

    def window(self, clip: int, start: int, frames: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Codes ``[frames, P]`` and actions ``[frames, 6, 3]`` of one clip from frame ``start``."""
        lo = int(self.starts[clip]) + start
        return self.codes[lo:lo + frames], self.actions[lo:lo + frames]


@dataclass(frozen=True)
class TrainingData:
    """Train and validation clips, and what tokenized them (the model's layout must match)."""

    train: ClipSet
    val: ClipSet
    codebook_size: int
    grid: tuple[int, int]
    tokenizer: str  # the tokenizer's folder, for decoding sample rollouts ('' when unknown)

    @property
    def patches(self) -> int:
        return self.grid[0] * self.grid[1]


def load_training_data(path: str, val_clips: int) -> TrainingData:
    """Read a shard folder or a tokenized-clips file (module docstring) into memory."""
    if Path(path).is_dir():
        index = read_index(path)
        splits: dict[str, list] = {"train": [], "val": []}
        for entry in index.shards:
            codes, actions = read_shard(path, index, entry)
            codes = codes.reshape(len(codes), -1)
            offset = 0
            for clip in entry.clips:
                splits[entry.split].append((clip.id, codes[offset:offset + clip.frames],
                                            actions[offset:offset + clip.frames]))
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
    parts = [(str(i), clips.codes[i].reshape(clips.codes.shape[1], -1), clips.actions[i]) for i in range(num_clips)]
    cut = num_clips - val_clips
    return TrainingData(ClipSet.concat(parts[:cut]), ClipSet.concat(parts[cut:]), clips.codebook_size,
                        clips.grid_shape, clips.tokenizer)


class WindowSampler:
    """Uniformly random windows of ``frames`` consecutive frames among all clips long enough to hold one.

    Its generator state is part of the checkpoint (terra/training/checkpoint.py), so a resumed run draws the
    windows an uninterrupted one would.
    """

    def __init__(self, clips: ClipSet, frames: int, seed: int) -> None:
        counts = (clips.lengths - frames + 1).clamp(min=0)
        if int(counts.sum()) == 0:
            longest = int(clips.lengths.max()) if len(clips) else 0
            raise TerraInputError(f"no training clip holds a window of {frames} frames (the longest has {longest}); "
                                  f"lower train.window or prepare longer clips")
        self.clips, self.frames, self.counts = clips, frames, counts
        self.ends = torch.cumsum(counts, 0)
        self.generator = torch.Generator().manual_seed(seed)

    def sample(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Image codes ``[B, frames*P]`` (int64) and actions ``[B, frames*6, 3]`` of ``batch_size`` windows."""
        picks = torch.randint(int(self.ends[-1]), (batch_size,), generator=self.generator)
        clip = torch.searchsorted(self.ends, picks, right=True)
        start = picks - (self.ends[clip] - self.counts[clip])
        return stack_windows(self.clips, clip.tolist(), start.tolist(), self.frames)


def stack_windows(clips: ClipSet, clip: list[int], start: list[int], frames: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The given windows, flattened as the training-style forward takes them (terra/models/modeling_llama_action.py)."""
    pairs = [clips.window(c, s, frames) for c, s in zip(clip, start)]
    codes = torch.stack([p[0] for p in pairs]).flatten(1).long()
    actions = torch.stack([p[1] for p in pairs]).flatten(1, 2)
    return codes, actions


def validation_windows(clips: ClipSet, frames: int) -> list[int]:
    """Validation clips long enough for a window (each is scored on its first window)."""
    return [i for i in range(len(clips)) if int(clips.lengths[i]) >= frames]
