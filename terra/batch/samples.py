"""A batch run's samples against its settings: each sample's context paths and actions, its inputs checked before
any model loads, and how lines are split into shards.

The samples are read by :func:`terra.inputs.samples.read_samples` (the JSONL format; the two sample formats are
described in terra/batch/__init__.py). :func:`check_inputs` checks a sample's context files (inside
``image_root``, regular, image headers within :data:`terra.tokenizer.images.MAX_PIXELS`) and builds its actions and
routes, all without decoding an image, so a bad sample fails alone before the run generates anything.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Sequence

from terra.batch.config import BatchSpec
from terra.core.errors import TerraInputError
from terra.config.checks import shown
from terra.config.files import check_inside, open_input_file
from terra.config.output_dir import check_apart
from terra.inputs.context import resolve_path
from terra.inputs.actions import TRAJECTORY_KEYS
from terra.inputs.requests import RolloutInputs, manoeuvre_actions, trajectory_inputs, with_routes
from terra.inputs.samples import Sample
from terra.core.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES
from terra.tokenizer.images import image_file_size

MAX_IMAGE_BYTES = 1 << 30  # one context image file
MAX_VIDEO_BYTES = 64 << 30  # one context video file
ALLOW_OUTSIDE = "allow_paths_outside_image_root"


def context_paths(sample: Sample, config: BatchSpec) -> list[str]:
    """The sample's context sources as absolute paths, relative ones taken from ``image_root`` (default: its
    JSONL's folder); one outside that folder is refused unless ``allow_paths_outside_image_root``."""
    record = sample.record
    items = record["context_frames"] if sample.kind == "actbench" else record["context"]
    items = [items] if isinstance(items, str) else list(items)
    root = Path(config.image_root).expanduser() if config.image_root else Path(sample.file).resolve().parent
    if config.allow_paths_outside_image_root:
        return [resolve_path(item, root) for item in items]
    return [check_inside(item, root, "context path", ALLOW_OUTSIDE) for item in items]


def _image_files(sources: Sequence[str]) -> tuple[list[Path], bool]:
    """The image files ``sources`` expand to, in the order tokenizer/images.py reads them, and whether a video
    is among them (its frames are counted only when decoded)."""
    files: list[Path] = []
    video = False
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
                video = True
            else:
                files.append(file)
    return files, video


def _check_image(path: Path) -> None:
    """A regular, readable image file whose header gives a sane size (nothing is decoded)."""
    with open_input_file(path, "context image", MAX_IMAGE_BYTES) as fh:
        image_file_size(fh, str(path))


def sample_inputs(sample: Sample, config: BatchSpec, loaded: int, num_frames: int,
                  route_points: int = 0) -> RolloutInputs:
    """The actions and routes of ``sample`` for ``loaded`` context frames read (ACT-Bench: all its frames, of which
    the last ``num_context`` are used, their first rows dropped with the frames not used; Terra's format: the frames
    used) and ``num_frames`` generated ones, its routes checked against a model of ``route_points`` route slots.
    A sample's ``routes`` sit beside its trajectory form, or in its trajectory file (JSON), not in both."""
    record, where = sample.record, f"sample {shown(sample.sample_id)}"
    jsonl_dir = Path(sample.file).resolve().parent
    drop = 0
    if sample.kind == "actbench":
        drop = max(0, loaded - config.run.num_context)  # instruction_trajs[0] belongs to context_frames[0]
        given = trajectory_inputs({"instruction_trajs": record["instruction_trajs"]}, loaded - drop, num_frames,
                                  route_points, f"{where}: instruction_trajs", skip=drop)
    elif not any(k in record for k in TRAJECTORY_KEYS):
        if config.default_manoeuvre is None:
            raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)} "
                                  "or set default_manoeuvre")
        given = RolloutInputs(manoeuvre_actions(config.default_manoeuvre, loaded, num_frames))
    else:
        key = [k for k in TRAJECTORY_KEYS if k in record][0]
        # a "trajectory" string is a file next to the JSONL; everything else is inline
        trajectory = record[key] if key == "trajectory" and isinstance(record[key], str) else {key: record[key]}
        given = trajectory_inputs(trajectory, loaded, num_frames, route_points, f"{where}: {key}", base=jsonl_dir)
    if record.get("routes") is None:
        return given
    if given.routes is not None or given.unused_routes:
        raise TerraInputError(f"{where} gives routes twice, in the sample and in its trajectory file "
                              f"{shown(record['trajectory'])}; keep one")
    return with_routes(given.actions, record["routes"], loaded - drop, num_frames, route_points, where, skip=drop)


def check_inputs(sample: Sample, config: BatchSpec, num_frames: int,
                 route_points: int = 0) -> tuple[RolloutInputs, bool]:
    """Check everything of ``sample`` that can be checked without a model: its context paths (apart from
    output.dir) and files (image headers, not pixels) and its trajectory, built into the actions and routes the
    rollout takes (:func:`sample_inputs`); return them and whether they are final (not with a video context: its
    frames are counted only when decoded, so its inputs are built again then). Raises :class:`TerraInputError`."""
    sources = context_paths(sample, config)
    for source in sources:  # no output may land on an input (terra/config/output_dir.py)
        check_apart(Path(config.output_dir), "output.dir", "context", source)
    files, video = _image_files(sources)
    # ACT-Bench samples read every context frame; Terra's the last num_context (with a video: unknown which)
    used = files if sample.kind == "actbench" or video else files[-config.run.num_context :]
    for file in used:
        _check_image(file)
    return sample_inputs(sample, config, 1 if video else len(used), num_frames, route_points), not video


def shard_indices(num_lines: int, shard_index: int, num_shards: int) -> list[int]:
    """Line indices of one shard: ``i % num_shards == shard_index`` (every line in exactly one shard)."""
    if not 0 <= shard_index < num_shards:
        raise TerraInputError(f"shard_index={shard_index} must be in [0, {num_shards - 1}]")
    return list(range(shard_index, num_lines, num_shards))


def in_shard(index: int, shard_index: int, num_shards: int) -> bool:
    """Whether line ``index`` belongs to shard ``shard_index`` of ``num_shards``."""
    return index % num_shards == shard_index
