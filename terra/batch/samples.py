"""A batch run's samples checked against its settings before any model loads; shard splitting."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from terra.batch.config import BatchSpec
from terra.core.errors import TerraInputError
from terra.config.checks import shown
from terra.config.files import MAX_TRAJECTORY_BYTES, check_inside, file_digest, open_input_file
from terra.config.output_dir import check_apart
from terra.inputs.context import resolve_path
from terra.inputs.actions import TRAJECTORY_KEYS, manoeuvre_motion
from terra.inputs.requests import RolloutInputs, manoeuvre_actions, trajectory_inputs, with_routes
from terra.inputs.routes import given_routes
from terra.inputs.samples import Sample
from terra.core.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES
from terra.tokenizer.images import image_file_size

MAX_IMAGE_BYTES = 1 << 30  # one context image file
MAX_VIDEO_BYTES = 64 << 30  # one context video file
ALLOW_OUTSIDE = "allow_paths_outside_image_root"


@dataclass(frozen=True)
class SampleFiles:
    """The files a sample reads, found and checked to be regular (:func:`sample_files`)."""

    images: list[Path]  # the context images read
    videos: list[Path]  # context videos (their frames are counted only when decoded)
    trajectory: Path | None  # its trajectory file, if it names one


def context_paths(sample: Sample, config: BatchSpec) -> list[str]:
    """The sample's context sources as absolute paths under ``image_root``; outside paths refused unless allowed."""
    record = sample.record
    items = record["context_frames"] if sample.kind == "actbench" else record["context"]
    items = [items] if isinstance(items, str) else list(items)
    root = Path(config.image_root).expanduser() if config.image_root else Path(sample.file).resolve().parent
    if config.allow_paths_outside_image_root:
        return [resolve_path(item, root) for item in items]
    return [check_inside(item, root, "context path", ALLOW_OUTSIDE) for item in items]


def trajectory_file(sample: Sample) -> Path | None:
    """The trajectory file a sample names (relative to its JSONL), or None."""
    value = sample.record.get("trajectory") if sample.kind != "actbench" else None
    return Path(resolve_path(value, Path(sample.file).resolve().parent)) if isinstance(value, str) else None


def _image_files(sources: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """The image files ``sources`` expand to, in reading order, and the videos among them."""
    files: list[Path] = []
    videos: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise TerraInputError(f"folder {path} holds no images ({', '.join(IMAGE_SUFFIXES)}); check the folder")
        elif os.path.lexists(path):
            found = [path]
        elif glob.has_magic(source):
            found = sorted(Path(p) for p in glob.glob(source) if not Path(p).is_dir())
            if not found:
                raise TerraInputError(f"pattern {source} matches no files; check the glob")
        else:
            raise TerraInputError(f"image path {source} does not exist; check the path")
        for file in found:
            if file.suffix.lower() in VIDEO_SUFFIXES:
                open_input_file(file, "context video", MAX_VIDEO_BYTES).close()  # regular and readable; decoded later
                videos.append(file)
            else:
                files.append(file)
    return files, videos


def sample_inputs(sample: Sample, config: BatchSpec, loaded: int, num_frames: int,
                  route_tokens: int = 0) -> RolloutInputs:
    """The actions and routes of ``sample`` for ``loaded`` context frames and ``num_frames`` generated ones.

    Routes are checked against a model of ``route_tokens`` route slots.
    """
    record, where = sample.record, f"sample {shown(sample.sample_id)}"
    beside = given_routes(record, where, Path(sample.file).resolve().parent)
    if sample.kind == "actbench":
        drop = max(0, loaded - config.run.num_context)  # instruction_trajs[0] belongs to context_frames[0]
        return trajectory_inputs({"instruction_trajs": record["instruction_trajs"]}, loaded - drop, num_frames,
                                 route_tokens, f"{where}: instruction_trajs", skip=drop, beside=beside)
    if not any(k in record for k in TRAJECTORY_KEYS):
        if config.default_manoeuvre is None:
            raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)} "
                                  "or set default_manoeuvre")
        actions = manoeuvre_actions(config.default_manoeuvre, loaded, num_frames)
        return with_routes(actions, beside, loaded, num_frames, route_tokens,
                           motion=manoeuvre_motion(config.default_manoeuvre, len(actions)))
    key = [k for k in TRAJECTORY_KEYS if k in record][0]
    file = trajectory_file(sample)
    return trajectory_inputs({key: record[key]} if file is None else file, loaded, num_frames, route_tokens,
                             f"{where}: {key}", beside=beside)


def sample_files(sample: Sample, config: BatchSpec) -> SampleFiles:
    """Every file ``sample`` reads; raises :class:`TerraInputError` for one missing or not regular."""
    sources = context_paths(sample, config)
    for source in sources:  # no output may land on an input
        check_apart(Path(config.output_dir), "output.dir", "context", source)
    files, videos = _image_files(sources)
    # ACT-Bench samples read every context frame; Terra's the last num_context (with a video: unknown which)
    used = files if sample.kind == "actbench" or videos else files[-config.run.num_context :]
    return SampleFiles(used, videos, trajectory_file(sample))


def input_digests(files: SampleFiles) -> list[str]:
    """The SHA-256 of each file's content: images, videos, trajectory file."""
    trajectory = [files.trajectory] if files.trajectory else []
    return ([file_digest(path, "context image", MAX_IMAGE_BYTES) for path in files.images]
            + [file_digest(path, "context video", MAX_VIDEO_BYTES) for path in files.videos]
            + [file_digest(path, "trajectory file", MAX_TRAJECTORY_BYTES) for path in trajectory])


def check_inputs(sample: Sample, config: BatchSpec, files: SampleFiles, num_frames: int,
                 route_tokens: int = 0) -> tuple[RolloutInputs, bool]:
    """Check ``sample`` without a model; return its inputs and whether they are final (not for a video context)."""
    for file in files.images:  # regular, readable, and a sane size in its header (nothing is decoded)
        with open_input_file(file, "context image", MAX_IMAGE_BYTES) as fh:
            image_file_size(fh, str(file))
    video = bool(files.videos)
    return sample_inputs(sample, config, 1 if video else len(files.images), num_frames, route_tokens), not video


def shard_indices(num_lines: int, shard_index: int, num_shards: int) -> list[int]:
    """Line indices of one shard: ``i % num_shards == shard_index``."""
    if not 0 <= shard_index < num_shards:
        raise TerraInputError(f"shard_index={shard_index} must be in [0, {num_shards - 1}]")
    return list(range(shard_index, num_lines, num_shards))


def in_shard(index: int, shard_index: int, num_shards: int) -> bool:
    return index % num_shards == shard_index
