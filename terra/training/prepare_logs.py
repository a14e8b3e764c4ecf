"""Driving logs → training shards: each clip tokenized in batches, shards written as clips finish, resumable."""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Optional, Union

import numpy as np
from omegaconf import DictConfig

from terra.config.backend import device_setting, num_threads_setting
from terra.config.checks import MAX_FRAMES, Range, check_choice, one_line, required_path
from terra.config.files import content_digest
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.schema import check_schema, flag, group, setting
from terra.config.snapshot import checkpoint_path
from terra.config.spec import changed_inputs, fingerprint
from terra.contract.actions import FRAME_RATE_HZ
from terra.core.errors import TerraInputError
from terra.core.media import VIDEO_SUFFIXES
from terra.inputs.driving_logs import (
    CLIPGT_MAPS,
    Resampled,
    clip_actions,
    clip_folders,
    clip_frames,
    frame_times,
    open_clip,
    read_motion,
)
from terra.inputs.log_routes import ROUTE_SOURCES, clip_routes
from terra.inputs.trajectory import RATE_HZ
from terra.sim.clips import DATASET_ROUTE_POINTS
from terra.tokenizer.resize import RESIZE_MODES
from terra.training.shards import INDEX_FILE, SHARD_FILES, ShardIndex, open_shards, write_shard

# a clip as written into a shard: id, codes [T, h, w], actions [T, 6, 3], routes [T, 16, 3] or None
PreparedClip = tuple[str, np.ndarray, np.ndarray, "np.ndarray | None"]
APP = "terra-prepare-logs"  # the app whose run folders these are


@dataclass
class PrepareLogsConfig:
    """terra-prepare-logs' settings."""

    tokenizer: Dict[str, Any] = group()
    sampling: Dict[str, Any] = group()
    model: Dict[str, Any] = group()
    terra_root: Optional[str] = setting(None, "a download of turing-motors/Terra (lfq_tokenizer_B_256/, ...); see "
                                              "conf/model/terra_v1.yaml")
    logs: Optional[str] = setting(None, "folder of clip folders (each: *.jpg|*.jpeg|*.png frames or one *.mp4, and "
                                        "trajectory.json|csv|npy)")
    output_dir: Optional[str] = setting(None, "shard folder: index.json + {train,val}-NNNNN.safetensors; rerun the "
                                              "same command to resume")
    frame_rate_hz: float = setting(10.0, "frames per second of image clips without timestamps.txt", RATE_HZ)
    min_frames: int = setting(2, "clips with fewer frames at 10 Hz are skipped (training needs 2 or more)",
                              Range(2, MAX_FRAMES, 2, whole=True))
    val_fraction: float = setting(0.05, "share of clips in the val split, by a hash of the clip id",
                                  Range(0, 0.5, 0.05))
    shard_clips: int = setting(64, "clips per shard file", Range(1, 100_000, 64, whole=True))
    batch_size: int = setting(64, "frames per tokenizer call", Range(1, 4096, 64, whole=True))
    read_threads: int = setting(8, "threads reading and resizing a batch's frames", Range(1, 256, 8, whole=True))
    device: str = device_setting()
    num_threads: Optional[Union[int, str]] = num_threads_setting()
    routes: str = setting("road", "each frame's route in the shards: road = the clip's road.json | road.csv | "
                                  "clipgt/ | clipgt.zip where it has one (none without); driven_path = the car's own "
                                  "path ahead: it tells the model where the car goes; only where no map exists "
                                  "(docs/train.md)", choices=ROUTE_SOURCES)
    progress: Any = flag(True, "bars on a terminal (clips with an ETA, frames tokenized); in a log a line a "
                               "minute")


@dataclass(frozen=True)
class PrepareSpec:
    logs: Path
    clips: tuple[Path, ...]  # the clip folders of ``logs``, in name order
    output: OutputDir  # claimed: apart from logs and the tokenizer
    tokenizer: str  # checkpoint folder (exists)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    resize: str = "crop"  # crop | stretch
    frame_rate_hz: float = 10.0  # image clips without timestamps.txt
    min_frames: int = 2
    val_fraction: float = 0.05
    shard_clips: int = 64
    batch_size: int = 64
    read_threads: int = 8  # threads reading and resizing frames while the tokenizer works
    progress: bool = True
    routes: str = "road"  # road | driven_path
    num_threads: int | None = None  # torch CPU threads


@dataclass
class PrepareSummary:
    """Clips used, skipped and found done, and the frames and clips written per split (and those with a route)."""

    used: int = 0
    skipped: int = 0
    already_done: int = 0
    frames: int = 0
    train: int = 0
    val: int = 0
    routed_frames: int = 0
    any_routes: bool = False

    def line(self, index: ShardIndex, output: Path) -> str:
        held = {split: sum(len(e.clips) for e in index.shards if e.split == split) for split in ("train", "val")}
        routes = f"; {self.routed_frames} of them with a route" if self.any_routes else ""
        return (f"{self.used} clips used ({self.train} train, {self.val} val; {self.frames} frames written{routes}), "
                f"{self.skipped} skipped, {self.already_done} already done; {output} holds {held['train']} train "
                f"and {held['val']} val clips in {len(index.shards)} shards")


def prepare_spec(cfg: DictConfig) -> PrepareSpec:
    """Every setting of ``prepare_driving_logs`` checked once, without importing torch."""
    values = check_schema(cfg, PrepareLogsConfig)
    logs = required_path(cfg, "logs", "the folder of clip folders")
    if not logs.is_dir():
        raise TerraInputError(f"logs={logs} is not a folder; pass logs=DIR, a folder of clip folders")
    clips = tuple(clip_folders(logs))
    if not clips:
        raise TerraInputError(f"logs={logs} holds no clip folders; put each clip's frames or video and its "
                              "trajectory in a sub-folder of its own")
    routes = values["routes"]
    tokenizer = checkpoint_path(cfg, "tokenizer", "path")
    output = claim_output_dir(required_path(cfg, "output_dir", "the shard folder"), "output_dir",
                              files=[INDEX_FILE, *SHARD_FILES],
                              inputs=[("logs folder", logs), ("tokenizer", tokenizer)], app=APP)
    if importlib.util.find_spec("av") is None and any(path.suffix.lower() in VIDEO_SUFFIXES
                                                      for folder in clips for path in folder.iterdir()):
        raise TerraInputError("reading the clips' videos needs PyAV: pip install av (or give the frames as images)")
    if (routes == "road" and importlib.util.find_spec("pyarrow") is None
            and any((folder / name).exists() for folder in clips for name in CLIPGT_MAPS)):
        raise TerraInputError("reading the clips' AlpaSim maps (clipgt) needs pyarrow: pip install pyarrow (or give "
                              "each road as road.json / road.csv)")
    return PrepareSpec(
        logs=logs, clips=clips, output=output, tokenizer=tokenizer,
        resize=check_choice(cfg.tokenizer.get("resize", "crop"), "tokenizer.resize", RESIZE_MODES),
        **{key: values[key] for key in ("device", "frame_rate_hz", "min_frames", "val_fraction", "shard_clips",
                                        "batch_size", "read_threads", "progress", "routes", "num_threads")},
    )


def open_index(spec: PrepareSpec, tokenizer: Any) -> tuple[ShardIndex, dict[str, str]]:
    """The output's index (or a new one) and why each listed shard that is not whole is not."""
    wanted = ShardIndex(int(tokenizer.codebook_size), tuple(tokenizer.grid_shape), tuple(tokenizer.image_size),
                        FRAME_RATE_HZ, os.path.realpath(spec.tokenizer), routes=spec.routes)
    if not (spec.output.path / INDEX_FILE).is_file():
        return wanted, {}
    index, damaged = open_shards(spec.output.path)
    keys = ("tokenizer", "codebook_size", "grid", "image_size", "frame_rate_hz")
    if any(getattr(index, k) != getattr(wanted, k) for k in keys):
        def held(i: ShardIndex) -> str:
            return (f"tokenizer {i.tokenizer}, {i.grid[0]}x{i.grid[1]} codes of {i.codebook_size}, frames "
                    f"{i.image_size[0]}x{i.image_size[1]} at {i.frame_rate_hz:g} Hz")
        raise TerraInputError(f"output_dir={spec.output.path} holds shards of another tokenizer ({held(index)}), not "
                              f"this run's ({held(wanted)}); choose another output_dir or the tokenizer it was made "
                              "with")
    if index.routes != spec.routes:
        raise TerraInputError(f"output_dir={spec.output.path} holds shards prepared with routes={index.routes}, not "
                              f"routes={spec.routes}; a folder's clips take their routes from one source: choose "
                              f"another output_dir or routes={index.routes}")
    return index, damaged


def clip_inputs(spec: PrepareSpec, folder: Path, tokenizer: str) -> dict[str, str]:
    """What a clip's shard rows are made from: its folder's content, the tokenizer's digest and the shaping settings."""
    settings = fingerprint({"resize": spec.resize, "frame_rate_hz": spec.frame_rate_hz, "routes": spec.routes})
    return {"tokenizer": tokenizer, "clip": content_digest([folder], "clip file"), "settings": settings}


def clips_to_redo(index: ShardIndex, damaged: dict[str, str], inputs: dict[str, dict[str, str]]
                  ) -> dict[str, str]:
    """The indexed clips to make again, and why: a damaged shard, or inputs other than ``inputs``."""
    redo = {}
    for entry in index.shards:
        for clip in entry.clips:
            if clip.id not in inputs:
                continue
            if entry.file in damaged:
                redo[clip.id] = f"their shard {entry.file} {damaged[entry.file]}"
            elif clip.inputs != inputs[clip.id]:
                redo[clip.id] = changed_inputs(clip.inputs, inputs[clip.id])
    return redo


def clip_score(clip_id: str) -> float:
    """The clip's place in [0, 1): the first 8 bytes of the SHA-256 of its id (UTF-8) over 2^64."""
    return int.from_bytes(hashlib.sha256(clip_id.encode("utf-8")).digest()[:8], "big") / 2.0**64


def assign_splits(new: list[str], val_fraction: float) -> dict[str, str]:
    """``train`` or ``val`` for each new clip id by :func:`clip_score` against ``val_fraction``."""
    return {clip: "val" if clip_score(clip) < val_fraction else "train" for clip in new}


def prepare_shards(spec: PrepareSpec, tokenizer: Any, index: ShardIndex, folders: Iterable[Path],
                   splits: dict[str, str], report: Callable[[str], None],
                   on_frames: Callable[[int], None] = lambda count: None,
                   inputs: dict[str, dict[str, str]] | None = None) -> PrepareSummary:
    """Tokenize the clips of ``folders`` into shards of their split; ``report`` names each clip that cannot be used."""
    summary = PrepareSummary(already_done=len(spec.clips) - len(splits))
    pending: dict[str, list[PreparedClip]] = {"train": [], "val": []}
    held: PreparedClip | None = None  # the val candidate while no val clip exists

    def add(split: str, clip: PreparedClip) -> None:
        pending[split].append(clip)
        setattr(summary, split, getattr(summary, split) + 1)
        if len(pending[split]) == spec.shard_clips:
            _write(spec.output.path, index, split, pending[split], inputs)
            pending[split] = []

    with ThreadPoolExecutor(spec.read_threads, thread_name_prefix="read-frames") as pool:
        for folder in folders:
            try:
                codes, actions, routes = tokenize_clip(folder, tokenizer, spec, pool, on_frames)
            except TerraInputError as err:
                report(f"skipped clip {one_line(folder.name)}: {err}")
                summary.skipped += 1
                continue
            summary.used += 1
            summary.frames += len(codes)
            if routes is not None:
                summary.any_routes = True
                summary.routed_frames += int(np.isfinite(routes).all(axis=(1, 2)).sum())
            clip, split = (folder.name, codes, actions, routes), splits[folder.name]
            if split == "train" and spec.val_fraction > 0:
                if held is None or clip_score(clip[0]) < clip_score(held[0]):
                    clip, held = held, clip
                if clip is None:
                    continue
            add(split, clip)
    if held is not None:
        has_val = summary.val > 0 or any(e.split == "val" for e in index.shards)
        add("train" if has_val or len(index.clip_ids()) + summary.used < 2 else "val", held)
    for split, clips in pending.items():
        if clips:
            _write(spec.output.path, index, split, clips, inputs)
    return summary


def tokenize_clip(folder: Path, tokenizer: Any, spec: PrepareSpec, pool: ThreadPoolExecutor,
                  on_frames: Callable[[int], None] = lambda count: None
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Codes ``[T, h, w]``, actions ``[T, 6, 3]`` and routes ``[T, 16, 3]`` of one clip folder at 10 Hz."""
    clip = open_clip(folder)
    motion = read_motion(clip.trajectory)  # before any frame is decoded
    routes = clip_routes(clip, motion, spec.routes)  # the road read, or the driven path's poses checked
    kept, codes = Resampled(), []
    reads = clip_frames(clip, tuple(tokenizer.image_size), spec.resize, spec.frame_rate_hz, kept)
    while batch := list(itertools.islice(reads, spec.batch_size)):
        codes.append(_encode(tokenizer, pool, batch))
        on_frames(len(batch))
    if len(kept.times) < spec.min_frames:
        raise TerraInputError(f"has {len(kept.times)} frame(s) at {FRAME_RATE_HZ:g} Hz, fewer than "
                              f"min_frames={spec.min_frames}")
    actions = clip_actions(motion, kept, clip.shared_clock)
    return np.concatenate(codes), actions, None if routes is None else routes.at(
        frame_times(motion, kept, clip.shared_clock), DATASET_ROUTE_POINTS)


def _encode(tokenizer: Any, pool: ThreadPoolExecutor, reads: list[Callable[[], np.ndarray]]) -> np.ndarray:
    """Codes ``[B, h, w]`` of a batch of frames, read and resized by ``pool``'s threads."""
    from terra.tokenizer.images import frames_to_tensor

    frames = np.stack(list(pool.map(lambda read: read(), reads)))
    return tokenizer.encode(frames_to_tensor(frames)).cpu().numpy()


def _write(output: Path, index: ShardIndex, split: str, clips: list[PreparedClip],
           inputs: dict[str, dict[str, str]] | None) -> None:
    try:
        write_shard(output, index, split, [clip[:3] for clip in clips], [clip[3] for clip in clips], inputs)
    except OSError as err:
        raise TerraInputError(f"cannot write a shard into output_dir={output} ({err.strerror or err}); free some space "
                              "or choose another output_dir, then rerun to resume") from None
