"""The input of a batch run: JSONL lines parsed into :class:`Sample`\\ s, how lines are split into shards, and
each sample's inputs checked before any model loads.

The two sample formats (ACT-Bench and Terra's own) are described in terra/batch/__init__.py. Lines are read
with terra/config/'s strict JSON (no NaN, no ``1e400``, no 400-digit integers, no nesting deeper than the
stack); :func:`check_inputs` checks a sample's context files (inside ``image_root``, regular, image headers
within :data:`terra.tokenizer.images.MAX_PIXELS`) and builds its actions, all without decoding an image, so a bad
sample fails alone before the run generates anything.
"""

from __future__ import annotations

import glob
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image, UnidentifiedImageError

from terra.batch.config import BatchSpec, SAMPLE_SETTINGS
from terra.config.actbench import MAX_SAMPLES_BYTES, is_actbench_row
from terra.core.errors import TerraInputError
from terra.config.checks import shown
from terra.config.files import MAX_TRAJECTORY_BYTES, check_inside, open_input_file, parse_json, read_input_text
from terra.config.output_dir import check_apart
from terra.inputs.context import resolve_path
from terra.inputs.actions import TRAJECTORY_KEYS
from terra.inputs.requests import manoeuvre_actions, trajectory_actions
from terra.core.media import IMAGE_SUFFIXES, VIDEO_SUFFIXES
from terra.tokenizer.images import MAX_PIXELS

MAX_LINE_BYTES = MAX_TRAJECTORY_BYTES  # one sample, its inline trajectory included
MAX_IMAGE_BYTES = 1 << 30  # one context image file
MAX_VIDEO_BYTES = 64 << 30  # one context video file
ALLOW_OUTSIDE = "allow_paths_outside_image_root"


@dataclass
class Sample:
    """One input line: its parsed record, or the one-line reason it cannot be used."""

    file: str
    line: int  # 1-based line number in ``file``
    index: int  # 0-based line index over all input files (sharding key, default seed offset)
    record: dict | None = None
    error: str | None = None

    @property
    def sample_id(self) -> int | str | None:
        """The record's ``sample_id`` (None for a line that is not a JSON object)."""
        return None if self.record is None else self.record.get("sample_id")

    @property
    def kind(self) -> str:
        """``"actbench"`` (it has ``context_frames``) or ``"terra"``."""
        return "actbench" if is_actbench_row(self.record) else "terra"


def read_samples(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Sample]:
    """Parse JSONL file(s) into :class:`Sample` entries; malformed or invalid lines get ``error`` set.

    Blank lines are skipped (they still count for line numbers and indices). A second line with an
    already-seen ``sample_id`` is an error. A missing, unreadable or non-regular file raises
    :class:`TerraInputError`.
    """
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    samples: list[Sample] = []
    seen: dict[str, Sample] = {}  # str(sample_id) -> its first line: 7 and "7" name the same files
    index = 0
    for file in files:
        text = read_input_text(Path(file).expanduser(), "samples file", MAX_SAMPLES_BYTES)
        for number, raw in enumerate(text.splitlines(), start=1):
            index += 1
            if not raw.strip():
                continue
            sample = Sample(str(file), number, index - 1)
            record, problem = _parse_line(raw, number)
            if problem is None:
                problem = _check_record(record)
            if problem is None:
                key = str(record["sample_id"])
                if key in seen:
                    problem = f"duplicate sample_id {shown(record['sample_id'])} (first on line {seen[key].line})"
                else:
                    seen[key] = sample
            if problem is not None:
                sample.error = f"line {number}: {problem}"
            sample.record = record if isinstance(record, dict) else None
            samples.append(sample)
    return samples


def _parse_line(raw: str, number: int) -> tuple[Any, str | None]:
    """A line's JSON value and None, or None and why it cannot be read (strict JSON, at most MAX_LINE_BYTES)."""
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > MAX_LINE_BYTES:
        return None, f"is {size / 2**20:.0f} MiB, more than the {MAX_LINE_BYTES >> 20} MiB a sample may have"
    try:
        return parse_json(raw, f"line {number}"), None
    except TerraInputError as err:
        cause = err.__context__  # parse_json raises from the decoder's error
        if isinstance(cause, json.JSONDecodeError):
            return None, f"malformed JSON ({cause.msg} at column {cause.colno})"
        return None, str(err).removeprefix(f"line {number}: ")


def _check_record(record: Any) -> str | None:
    """Why a parsed line is not a usable sample, or None."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    try:
        json.dumps(record, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate escape (e.g. \\ud800), which no path or name can carry"
    if "sample_id" not in record:
        return "no sample_id; give every sample a unique sample_id"
    sid = record["sample_id"]
    if isinstance(sid, bool) or not isinstance(sid, (int, str)):
        return f"sample_id must be an integer or a string (got {shown(sid)})"
    if isinstance(sid, str) and (not sid.strip() or sid.startswith(".") or any(c in sid for c in "/\\")
                                 or any(ord(c) < 32 or ord(c) == 127 for c in sid)):
        return (f"sample_id {shown(sid)} cannot name a file; use letters, digits, '-', '_' or '.' (not first), "
                "no separators or control characters")
    if "context_frames" in record:
        frames = record["context_frames"]
        if not isinstance(frames, list) or not frames or not all(isinstance(f, str) and f for f in frames):
            return "context_frames must be a non-empty list of image paths"
        if "instruction_trajs" not in record:
            return "an ACT-Bench sample needs instruction_trajs (per-frame [T, 60, 3] future trajectories)"
    elif "context" in record:
        context = record["context"]
        items = context if isinstance(context, list) else [context]
        if not items or not all(isinstance(c, str) and c for c in items):
            return "context must be a path (image, video, folder or glob) or a non-empty list of paths"
        given = [k for k in TRAJECTORY_KEYS if k in record]
        if len(given) > 1:
            return f"give one trajectory form, not {given}"
    else:
        return "needs context_frames (ACT-Bench) or context (paths of the context frames)"
    for key, limits in SAMPLE_SETTINGS.items():
        if record.get(key) is not None:
            try:
                limits.check(record[key], key)
            except TerraInputError as err:
                return str(err)
    return None


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
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                with Image.open(fh) as image:
                    width, height = image.size
        except (Image.DecompressionBombError, Image.DecompressionBombWarning):
            raise TerraInputError(f"{path} claims more than {MAX_PIXELS} pixels; pass camera frames, "
                                  "e.g. 1920x1080") from None
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as err:
            raise TerraInputError(f"{path} cannot be read as an image ({type(err).__name__}); pass a PNG or "
                                  "JPEG file") from None
    if width * height > MAX_PIXELS:
        raise TerraInputError(f"{path} is {width}x{height} pixels, more than the {MAX_PIXELS} a frame may have; "
                              "pass camera frames, e.g. 1920x1080")


def sample_actions(sample: Sample, config: BatchSpec, loaded: int, num_frames: int) -> np.ndarray:
    """The actions of ``sample`` for ``loaded`` context frames read (ACT-Bench: all its frames, of which the
    last ``num_context`` are used; Terra's format: the frames used) and ``num_frames`` generated ones."""
    record, where = sample.record, f"sample {shown(sample.sample_id)}"
    jsonl_dir = Path(sample.file).resolve().parent
    if sample.kind == "actbench":
        drop = max(0, loaded - config.run.num_context)  # instruction_trajs[0] belongs to context_frames[0]
        return trajectory_actions({"instruction_trajs": record["instruction_trajs"]}, loaded - drop, num_frames,
                                  f"{where}: instruction_trajs", skip=drop)
    given = [k for k in TRAJECTORY_KEYS if k in record]
    if not given:
        if config.default_manoeuvre is None:
            raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)} "
                                  "or set default_manoeuvre")
        return manoeuvre_actions(config.default_manoeuvre, loaded, num_frames)
    key = given[0]
    # a "trajectory" string is a file next to the JSONL; everything else is inline
    trajectory = record[key] if key == "trajectory" and isinstance(record[key], str) else {key: record[key]}
    return trajectory_actions(trajectory, loaded, num_frames, f"{where}: {key}", base=jsonl_dir)


def check_inputs(sample: Sample, config: BatchSpec, num_frames: int) -> np.ndarray | None:
    """Check everything of ``sample`` that can be checked without a model: its context paths (apart from
    output.dir) and files (image headers, not pixels) and its trajectory, built into the actions the rollout
    takes (None with a video context: its frames are counted only when decoded, so its actions are built again
    then). Raises :class:`TerraInputError`."""
    sources = context_paths(sample, config)
    for source in sources:  # no output may land on an input (terra/config/output_dir.py)
        check_apart(Path(config.output_dir), "output.dir", "context", source)
    files, video = _image_files(sources)
    # ACT-Bench samples read every context frame; Terra's the last num_context (with a video: unknown which)
    used = files if sample.kind == "actbench" or video else files[-config.run.num_context :]
    for file in used:
        _check_image(file)
    actions = sample_actions(sample, config, 1 if video else len(used), num_frames)
    return None if video else actions


def shard_indices(num_lines: int, shard_index: int, num_shards: int) -> list[int]:
    """Line indices of one shard: ``i % num_shards == shard_index`` (every line in exactly one shard)."""
    if not 0 <= shard_index < num_shards:
        raise TerraInputError(f"shard_index={shard_index} must be in [0, {num_shards - 1}]")
    return list(range(shard_index, num_lines, num_shards))


def in_shard(index: int, shard_index: int, num_shards: int) -> bool:
    """Whether line ``index`` belongs to shard ``shard_index`` of ``num_shards``."""
    return index % num_shards == shard_index
