"""Batch rollouts: a JSONL of samples → one video (+ JSON sidecar) per sample, resumable, sharded, multi-GPU.

The Python API behind ``scripts/rollout.py``; notebooks call it directly::

    from terra.batch import BatchConfig, run_batch
    result = run_batch(BatchConfig(samples="samples.jsonl", output_dir="out", backend="hf", num_frames=16))
    result.counts        # {"ok": 3, "failed": 0, "skipped": 0}
    result.records       # one manifest record per sample

Sample formats (one JSON object per line; blank lines are ignored)
---------------------------------------------------------------
* ACT-Bench: ``sample_id``, ``context_frames`` (image paths relative to ``image_root``), ``instruction_trajs``
  (``[T, 60, 3]`` future trajectories, one per frame, frame 0 = ``context_frames[0]``), optional ``label``.
* Terra's own: ``sample_id``, ``context`` (an image/video path, folder, glob, or a list of them; relative paths
  are resolved against ``image_root``) and at most one trajectory form (SPEC §3): ``trajectory`` (a file path,
  resolved against the JSONL's folder, or an inline world-frame ego trajectory ``{"x": [...], "y": [...]}``),
  ``actions`` (``[T, 6, 3]``), ``instruction_trajs`` or ``manoeuvre`` (a name or ``{"name": ..., "speed_kmh":
  ...}``). Without any, ``default_manoeuvre`` is used. Frame 0 of the trajectory is the first context frame
  used (the last ``num_context`` frames of ``context``), as in ``terra-generate``.
* Both may set ``seed`` (default: ``seed + index``, index = 0-based line number over all input lines, so a
  sample's seed does not depend on sharding or batching), ``num_frames`` and ``label``.

``sample_id`` is an integer or a string without path separators; it must be unique.

Outputs (under ``output_dir``)
------------------------------
* Videos: ``video_pattern`` per format (fields ``sample_id``, ``ext``, ``line``, ``label``), every frame of the
  rollout (context frames first). ``naming="default"``: ``{sample_id}.{ext}``. ``naming="actbench"``:
  ``NUSCENES_ACTION_{sample_id:06d}.{ext}`` — the name Terra's ACT-Bench generation script writes; ACT-Bench's
  scorer globs ``*.mp4`` in one folder and parses the sample id from the ``_<digits>`` suffix of each file name,
  so integer sample ids are needed and ``num_frames`` must leave at least 44 frames (it scores the last 44:
  ``num_frames=44`` with 3 context frames); overlays stay off for scoring. ``png`` writes a folder
  ``<stem>_frames/``.
* Sidecar: ``sidecar_pattern`` (default ``{sample_id}.json``), :func:`decoder.write_sidecar` plus a ``batch``
  block (fingerprint of the sample and the generation settings). It is written last: a sample is complete when
  its sidecar exists, carries the same fingerprint and every file it lists exists. All writes are atomic
  (temporary file + rename); temporary files left by a killed run are removed when the sample is planned again.
* Manifest: ``manifest.jsonl`` (``manifest.shard-<i>-of-<n>.jsonl`` when sharded), rewritten by every run, one
  record per sample as it finishes: ``sample_id``, ``line``, ``file``, ``status`` (``ok`` | ``failed`` |
  ``skipped`` = already complete), ``stage`` of a failure (``parse`` | ``input`` | ``generate`` | ``write``),
  ``error`` (one line), ``seconds``, ``seed``, ``files``, ``finished_at`` (Unix time).
  ``<manifest stem>.summary.json`` holds the counts. Malformed lines are recorded as failed with stage ``parse``
  (``sample_id`` null, ``line`` set).

Concurrency and scale-out
-------------------------
Samples go to the backend in chunks of ``max_concurrent`` rollouts per ``generate`` call; the next chunk is read
and encoded on a helper thread while the current one generates. A sample's video is decoded and written by one
of ``writer_threads`` threads as soon as its last frame is generated, while the others keep going.
``shard_index``/``num_shards`` split the input by line index modulo ``num_shards`` (every line in exactly one
shard, malformed ones included). ``num_gpus``/``gpus`` start one engine per GPU (or per group of
``tensor_parallel_size`` GPUs) in spawned worker processes with ``CUDA_VISIBLE_DEVICES`` set; worker ``w`` of
``n`` takes every n-th pending sample. Only the parent writes the manifest.

Changing the model or tokenizer does not invalidate finished samples: use a new ``output_dir`` (or
``resume=False``) for another checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import numbers
import os
import re
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from terra.errors import TerraInputError, check_whole_number

FORMATS = ("gif", "mp4", "png")
NAMING = {
    "default": ("{sample_id}.{ext}", "{sample_id}.json"),
    "actbench": ("NUSCENES_ACTION_{sample_id:06d}.{ext}", "NUSCENES_ACTION_{sample_id:06d}.json"),
}
TRAJECTORY_KEYS = ("actions", "instruction_trajs", "trajectory", "manoeuvre")
STATUSES = ("ok", "failed", "skipped")
SIDECAR_VERSION = 1
# atomic_path's temporary names: ".<stem>.<8 random chars>.tmp<suffix>" next to the target.
_TEMP_NAME = re.compile(r"^\.(?P<stem>.+)\.[A-Za-z0-9_]{8}\.tmp(?P<suffix>(\.[^.]*)?)$")
_PATTERN_FIELDS = {"sample_id", "ext", "line", "label"}
DEMO = Path(__file__).resolve().parent / "assets" / "demo"  # the shipped demo checkpoints


# ------------------------------------------------------------------------------------------------ config


@dataclass
class BatchConfig:
    """Everything a batch run needs; ``scripts/rollout.py`` builds it from ``conf/rollout.yaml``."""

    samples: str | Sequence[str]  # JSONL file(s); lines are numbered over all files in order
    output_dir: str
    world_model: str = ""  # default: the shipped demo model
    tokenizer: str = ""  # default: the shipped demo tokenizer
    backend: str = "auto"  # auto | vllm | hf
    backend_options: dict = field(default_factory=dict)  # e.g. max_num_seqs, tensor_parallel_size, max_batch_size
    device: str = "auto"
    dtype: str = "auto"
    sampling: dict = field(default_factory=dict)  # temperature, top_k, top_p (terra.generation.sampling.SamplingConfig)
    num_frames: int = 16  # frames generated after the context (a sample's "num_frames" overrides it)
    num_context: int = 3  # context frames used: the last ones of a sample's context
    overlap: int = 3  # frames carried into the next window for rollouts longer than one window
    seed: int = 0  # sample at input index i uses seed + i unless it sets "seed"
    image_root: str | None = None  # relative image paths resolve against it; None = the JSONL's folder
    default_manoeuvre: str | None = None  # for samples of Terra's format that give no trajectory
    max_concurrent: int = 64  # rollouts per backend.generate call
    resume: bool = True  # skip samples whose outputs are complete
    shard_index: int = 0
    num_shards: int = 1
    num_gpus: int = 1  # engines on this machine (one per GPU); -1 = every visible GPU; 0/1 = in-process
    gpus: Sequence[int | str] | None = None  # explicit GPU ids (overrides num_gpus)
    num_threads: int | None = None  # torch CPU threads (None = torch's default)
    naming: str = "default"  # default | actbench (see the module docstring)
    video_pattern: str | None = None  # overrides the naming preset
    sidecar_pattern: str | None = None
    formats: Sequence[str] = ("mp4",)
    fps: float = 10.0
    writer_threads: int = 4  # threads decoding and writing finished rollouts (beside the engine loop)
    mark_context: bool = False  # border + label on context frames
    overlay_trajectory: bool = False  # draw the commanded path
    save_codes: bool = False  # also write <sidecar stem>.codes.npy (all frames' codes, int32)
    manifest: str = "manifest.jsonl"
    progress: bool = True
    record: dict | None = None  # run configuration stored in every sidecar (default: this config)

    def __post_init__(self) -> None:
        if not self.world_model:
            self.world_model = str(DEMO / "world_model")
        if not self.tokenizer:
            self.tokenizer = str(DEMO / "tokenizer")

    @property
    def sample_files(self) -> list[Path]:
        files = [self.samples] if isinstance(self.samples, (str, os.PathLike)) else list(self.samples)
        return [Path(f).expanduser() for f in files]

    @property
    def patterns(self) -> tuple[str, str]:
        video, sidecar = NAMING[self.naming]
        return self.video_pattern or video, self.sidecar_pattern or sidecar

    @property
    def manifest_path(self) -> Path:
        name = self.manifest
        if self.num_shards > 1:
            name = f"{name[: -len('.jsonl')]}.shard-{self.shard_index}-of-{self.num_shards}.jsonl"
        return Path(self.output_dir) / name

    @property
    def summary_path(self) -> Path:
        """``manifest.jsonl`` → ``manifest.summary.json`` (per shard like the manifest)."""
        path = self.manifest_path
        return path.with_name(path.name[: -len(".jsonl")] + ".summary.json")

    def generation_settings(self) -> dict:
        """The settings that shape a sample's outputs (part of its fingerprint)."""
        from terra.generation.sampling import SamplingConfig

        return {
            "num_context": self.num_context, "overlap": self.overlap,
            "sampling": dataclasses.asdict(SamplingConfig(**self.sampling)),
            "formats": sorted(self.formats), "fps": float(self.fps), "mark_context": bool(self.mark_context),
            "overlay_trajectory": bool(self.overlay_trajectory), "save_codes": bool(self.save_codes),
            "default_manoeuvre": self.default_manoeuvre,
        }


def config_from_omegaconf(cfg) -> BatchConfig:
    """``conf/rollout.yaml`` (a Hydra/OmegaConf config) → :class:`BatchConfig`."""
    from omegaconf import OmegaConf

    def plain(value):
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    out = cfg.output
    samples = plain(cfg.samples)
    if samples is None or samples == "":
        raise TerraInputError("no samples file given; pass samples=path/to/samples.jsonl")
    first = samples if isinstance(samples, str) else samples[0]
    output_dir = out.dir or str(Path("outputs") / "rollouts" / Path(first).stem)
    return BatchConfig(
        samples=samples, output_dir=str(output_dir), world_model=str(cfg.model.world_model),
        tokenizer=str(cfg.tokenizer.path), backend=cfg.backend.name, backend_options=plain(cfg.backend.options) or {},
        device=cfg.device, dtype=cfg.dtype, sampling=plain(cfg.sampling) or {}, num_frames=cfg.num_frames,
        num_context=cfg.num_context, overlap=cfg.model.overlap, seed=cfg.seed,
        image_root=None if cfg.image_root is None else str(cfg.image_root), default_manoeuvre=cfg.default_manoeuvre,
        max_concurrent=cfg.max_concurrent, resume=cfg.resume, shard_index=cfg.shard_index, num_shards=cfg.num_shards,
        num_gpus=cfg.num_gpus, gpus=plain(cfg.gpus), num_threads=cfg.num_threads, naming=out.naming,
        video_pattern=out.video_pattern, sidecar_pattern=out.sidecar_pattern, formats=plain(out.formats),
        fps=out.fps, writer_threads=out.writer_threads, mark_context=out.mark_context, overlay_trajectory=out.overlay_trajectory,
        save_codes=out.save_codes, manifest=out.manifest, progress=cfg.progress,
        record=OmegaConf.to_container(cfg, resolve=True),
    )


def check_config(config: BatchConfig) -> None:
    """Validate every setting that can be checked before any work (user errors → :class:`TerraInputError`)."""
    check_whole_number(config.num_frames, "num_frames", 1, "num_frames=16")
    check_whole_number(config.num_context, "num_context", 1, "num_context=3")
    check_whole_number(config.overlap, "model.overlap", 1, "model.overlap=3")
    check_whole_number(config.seed, "seed", 0, "seed=0")
    check_whole_number(config.max_concurrent, "max_concurrent", 1, "max_concurrent=32")
    check_whole_number(config.writer_threads, "output.writer_threads", 1, "output.writer_threads=4")
    check_whole_number(config.num_shards, "num_shards", 1, "num_shards=4")
    check_whole_number(config.shard_index, "shard_index", 0, "shard_index=0")
    if config.shard_index >= config.num_shards:
        raise TerraInputError(f"shard_index={config.shard_index} must be below num_shards={config.num_shards} "
                              f"(shards are numbered 0..{config.num_shards - 1})")
    if isinstance(config.num_gpus, bool) or not isinstance(config.num_gpus, numbers.Integral) or config.num_gpus < -1:
        raise TerraInputError(f"num_gpus must be -1 (all), 0 or a positive whole number (got {config.num_gpus!r})")
    if config.num_threads is not None:
        check_whole_number(config.num_threads, "num_threads", 1, "num_threads=4")
    if config.naming not in NAMING:
        raise TerraInputError(f"unknown output.naming {config.naming!r}; choose one of: {', '.join(NAMING)}")
    formats = [config.formats] if isinstance(config.formats, str) else list(config.formats)
    if not formats or any(f not in FORMATS for f in formats) or len(set(formats)) != len(formats):
        raise TerraInputError(f"output.formats {formats} must be a non-empty list of distinct names from "
                              f"{list(FORMATS)}")
    config.formats = formats
    fps = config.fps
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not (math.isfinite(fps) and fps > 0):
        raise TerraInputError(f"output.fps must be a positive number (got {fps!r}); e.g. output.fps=10")
    video, sidecar = config.patterns
    _check_pattern(video, "output.video_pattern", needs_ext=True)
    _check_pattern(sidecar, "output.sidecar_pattern", needs_ext=False)
    if not sidecar.endswith(".json"):
        raise TerraInputError(f"output.sidecar_pattern {sidecar!r} must end with .json")
    if not isinstance(config.manifest, str) or "/" in config.manifest or not config.manifest.endswith(".jsonl"):
        raise TerraInputError(f"output.manifest {config.manifest!r} must be a file name ending in .jsonl")
    from terra.generation.sampling import SamplingConfig

    SamplingConfig(**config.sampling)  # raises TerraInputError on bad values
    if config.default_manoeuvre is not None:
        from terra.trajectory import MANOEUVRES

        if config.default_manoeuvre not in MANOEUVRES:
            raise TerraInputError(f"unknown default_manoeuvre {config.default_manoeuvre!r}; "
                                  f"choose one of: {', '.join(MANOEUVRES)}")
    for file in config.sample_files:
        if not file.is_file():
            raise TerraInputError(f"samples file {file} does not exist; pass samples=path/to/samples.jsonl")
    if config.image_root is not None and not Path(config.image_root).expanduser().is_dir():
        raise TerraInputError(f"image_root {config.image_root} is not a folder; point it at the images' root")


def _check_pattern(pattern: Any, name: str, needs_ext: bool) -> None:
    import string

    if not isinstance(pattern, str) or not pattern:
        raise TerraInputError(f"{name} must be a file name pattern such as '{{sample_id}}.{{ext}}' (got {pattern!r})")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None}
    except ValueError as err:
        raise TerraInputError(f"{name} {pattern!r} is not a valid pattern ({err})") from None
    unknown = fields - _PATTERN_FIELDS
    if unknown:
        raise TerraInputError(f"{name} {pattern!r} uses unknown fields {sorted(unknown)}; "
                              f"available: {sorted(_PATTERN_FIELDS)}")
    if "sample_id" not in fields:
        raise TerraInputError(f"{name} {pattern!r} must contain {{sample_id}} so that samples get distinct files")
    if needs_ext and "ext" not in fields:
        raise TerraInputError(f"{name} {pattern!r} must contain {{ext}} (e.g. '{{sample_id}}.{{ext}}')")
    if pattern.startswith("/") or ".." in Path(pattern).parts:
        raise TerraInputError(f"{name} {pattern!r} must stay inside output.dir (no leading / or ..)")


# ------------------------------------------------------------------------------------------------ samples


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
        return None if self.record is None else self.record.get("sample_id")

    @property
    def kind(self) -> str:
        return "actbench" if self.record is not None and "context_frames" in self.record else "terra"

    def describe(self) -> str:
        name = f"sample {self.sample_id!r}" if self.sample_id is not None else "line"
        return f"{name} ({Path(self.file).name} line {self.line})"


def read_samples(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Sample]:
    """Parse JSONL file(s) into :class:`Sample` entries; malformed or invalid lines get ``error`` set.

    Blank lines are skipped (they still count for line numbers and indices). A second line with an
    already-seen ``sample_id`` is an error. Reading a missing file raises :class:`TerraInputError`.
    """
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    samples: list[Sample] = []
    seen: dict[str, Sample] = {}
    index = 0
    for file in files:
        try:
            text = Path(file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TerraInputError(f"samples file {file} cannot be read ({type(err).__name__}); "
                                  "pass a UTF-8 JSONL file") from None
        for number, raw in enumerate(text.splitlines(), start=1):
            index += 1
            if not raw.strip():
                continue
            sample = Sample(str(file), number, index - 1)
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as err:
                sample.error = f"line {number}: malformed JSON ({err.msg} at column {err.colno})"
                samples.append(sample)
                continue
            problem = _check_record(record)
            if problem is None:
                sample.record = record
                key = _id_key(record["sample_id"])
                if key in seen:
                    problem = f"duplicate sample_id {record['sample_id']!r} (first on line {seen[key].line})"
                else:
                    seen[key] = sample
            if problem is not None:
                sample.error = f"line {number}: {problem}"
                sample.record = record if isinstance(record, dict) else None
            samples.append(sample)
    return samples


def _id_key(sample_id: Any) -> str:
    return str(sample_id)


def _check_record(record: Any) -> str | None:
    """Why a parsed line is not a usable sample, or None."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    if "sample_id" not in record:
        return "no sample_id; give every sample a unique sample_id"
    sid = record["sample_id"]
    if isinstance(sid, bool) or not isinstance(sid, (int, str)):
        return f"sample_id must be an integer or a string (got {sid!r})"
    if isinstance(sid, str) and (not sid.strip() or sid.startswith(".") or any(c in sid for c in "/\\\0\n")
                                 or len(sid) > 200):
        return f"sample_id {sid!r} cannot name a file; use letters, digits, '-', '_' or '.' (not first)"
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
    for key, minimum in (("seed", 0), ("num_frames", 1)):
        value = record.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            return f"{key} must be a whole number >= {minimum} (got {value!r})"
    return None


def shard_indices(num_lines: int, shard_index: int, num_shards: int) -> list[int]:
    """Line indices of one shard: ``i % num_shards == shard_index`` (every line in exactly one shard)."""
    if not 0 <= shard_index < num_shards:
        raise TerraInputError(f"shard_index={shard_index} must be in [0, {num_shards - 1}]")
    return list(range(shard_index, num_lines, num_shards))


def in_shard(index: int, shard_index: int, num_shards: int) -> bool:
    return index % num_shards == shard_index


# ------------------------------------------------------------------------------------------------ planning


@dataclass
class Item:
    """A valid sample of this shard with its seed, frame count and output files."""

    sample: Sample
    seed: int
    num_frames: int
    videos: dict[str, Path]  # format -> file (png: folder)
    sidecar: Path
    codes: Path | None
    fingerprint: str

    @property
    def targets(self) -> list[Path]:
        return [*self.videos.values(), self.sidecar] + ([self.codes] if self.codes else [])


@dataclass
class BatchPlan:
    """What one run will do: samples of this shard to run, already complete ones, unusable lines."""

    config: BatchConfig
    samples: list[Sample]  # every line of this shard (blank lines excluded)
    to_run: list[Item]
    skipped: list[dict]  # manifest records of complete samples
    failed: list[dict]  # manifest records of malformed/invalid lines and unusable outputs
    items: list[Item] = field(default_factory=list)  # every valid sample of this shard (to run or complete)
    stale: int = 0  # samples with an earlier sidecar that is outdated (other settings) or lacks files: rerun


def _format(pattern: str, sample: Sample, ext: str) -> str:
    sid = sample.sample_id
    fields = dict(ext=ext, line=sample.line, label=str(sample.record.get("label", "")))
    try:
        return pattern.format(sample_id=sid, **fields)
    except (ValueError, TypeError):
        if isinstance(sid, str) and sid.isdigit():
            return pattern.format(sample_id=int(sid), **fields)
        raise TerraInputError(f"sample_id {sid!r} does not fit the file name pattern {pattern!r} "
                              "(ACT-Bench naming needs integer sample ids)") from None


def _outputs(config: BatchConfig, sample: Sample) -> tuple[dict[str, Path], Path, Path | None]:
    out = Path(config.output_dir)
    video_pattern, sidecar_pattern = config.patterns
    videos = {}
    for fmt in config.formats:
        name = _format(video_pattern, sample, fmt)
        if fmt == "png":
            name = (name[: -len(".png")] if name.endswith(".png") else name) + "_frames"
        videos[fmt] = out / name
    sidecar = out / _format(sidecar_pattern, sample, "json")
    codes = sidecar.with_name(sidecar.name[: -len(".json")] + ".codes.npy") if config.save_codes else None
    for path in [*videos.values(), sidecar]:
        if ".." in Path(os.path.relpath(path, out)).parts:
            raise TerraInputError(f"output file {path} of sample {sample.sample_id!r} falls outside output.dir")
    return videos, sidecar, codes


def fingerprint(config: BatchConfig, sample: Sample, seed: int, num_frames: int) -> str:
    """Hash of the sample's record and the settings that shape its outputs."""
    payload = {"record": sample.record, "seed": seed, "num_frames": num_frames,
               "image_root": config.image_root, **config.generation_settings()}
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def read_sidecar(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def is_complete(item: Item) -> tuple[bool, dict | None]:
    """``(complete, sidecar)``: the sidecar exists with this item's fingerprint and every file it lists exists."""
    sidecar = read_sidecar(item.sidecar) if item.sidecar.is_file() else None
    if sidecar is None:
        return False, None
    batch = sidecar.get("batch") or {}
    if batch.get("fingerprint") != item.fingerprint or not batch.get("complete"):
        return False, sidecar
    out = item.sidecar.parent
    frames = batch.get("frames")
    for path in item.targets:
        if path == item.sidecar:
            continue
        if path.is_dir():
            if frames is not None and len(list(path.glob("frame_*.png"))) < frames:
                return False, sidecar
        elif not path.is_file() or path.stat().st_size == 0:
            return False, sidecar
    listed = [out / f for f in sidecar.get("files", [])]
    return all(p.exists() for p in listed), sidecar


def _record(sample: Sample, status: str, *, error: str | None = None, stage: str | None = None,
            seconds: float | None = None, seed: int | None = None, files: Sequence[str] = (), **extra) -> dict:
    record = {
        "sample_id": sample.sample_id, "line": sample.line, "file": sample.file, "index": sample.index,
        "status": status, "stage": stage, "error": error,
        "seconds": None if seconds is None else round(seconds, 3), "seed": seed, "files": list(files),
        "finished_at": round(time.time(), 3),  # Unix time; with seconds, when the sample's work ran
    }
    label = None if sample.record is None else sample.record.get("label")
    if label is not None:
        record["label"] = label
    record.update(extra)
    return record


def plan(config: BatchConfig, samples: list[Sample] | None = None) -> BatchPlan:
    """Read the samples of this shard, work out their outputs and which are already complete."""
    check_config(config)
    all_samples = read_samples(config.sample_files) if samples is None else samples
    if samples is None and not all_samples:
        raise TerraInputError(f"samples file(s) {', '.join(map(str, config.sample_files))} hold no samples")
    # Output collisions are decided over all lines, so that every shard agrees.
    owners: dict[str, Sample] = {}
    collisions: dict[int, str] = {}  # sample index -> why its output files cannot be used
    for sample in all_samples:
        if sample.error is not None:
            continue
        try:
            videos, sidecar, codes = _outputs(config, sample)
        except TerraInputError as err:
            collisions[sample.index] = str(err)
            continue
        for path in [*videos.values(), sidecar]:
            key = os.path.normcase(os.path.abspath(path))
            if key in owners and collisions.get(sample.index) is None:
                other = owners[key]
                collisions[sample.index] = (f"output file {path.name} is also that of sample {other.sample_id!r} "
                                            f"(line {other.line}); make sample ids distinct")
            owners.setdefault(key, sample)
    mine = [s for s in all_samples if in_shard(s.index, config.shard_index, config.num_shards)]
    result = BatchPlan(config, mine, [], [], [])
    for sample in mine:
        if sample.error is not None:
            result.failed.append(_record(sample, "failed", error=sample.error, stage="parse"))
            continue
        if sample.index in collisions:
            result.failed.append(_record(sample, "failed", error=collisions[sample.index], stage="input"))
            continue
        seed = sample.record.get("seed")
        seed = config.seed + sample.index if seed is None else int(seed)
        num_frames = int(sample.record.get("num_frames") or config.num_frames)
        videos, sidecar, codes = _outputs(config, sample)
        item = Item(sample, seed, num_frames, videos, sidecar, codes, fingerprint(config, sample, seed, num_frames))
        result.items.append(item)
        complete, old = is_complete(item) if config.resume else (False, None)
        if complete:
            result.skipped.append(_record(sample, "skipped", seed=seed, files=old.get("files", []) + [
                os.path.relpath(sidecar, config.output_dir)]))
        else:
            result.stale += old is not None
            result.to_run.append(item)
    return result


def remove_stale_temporaries(items: Iterable[Item]) -> int:
    """Delete temporary files that a killed run left next to (or inside PNG folders of) these items' outputs."""
    targets: dict[Path, set[str]] = {}
    folders: list[Path] = []
    for item in items:
        for path in item.targets:
            targets.setdefault(path.parent, set()).add(path.name)
        folders += [p for fmt, p in item.videos.items() if fmt == "png"]
    removed = 0
    for folder, names in targets.items():
        if not folder.is_dir():
            continue
        for entry in os.scandir(folder):
            match = _TEMP_NAME.match(entry.name)
            if match and match["stem"] + match["suffix"] in names and entry.is_file():
                Path(entry.path).unlink(missing_ok=True)
                removed += 1
    for folder in folders:
        if folder.is_dir():
            for entry in os.scandir(folder):
                if _TEMP_NAME.match(entry.name) and entry.is_file():
                    Path(entry.path).unlink(missing_ok=True)
                    removed += 1
    return removed


# ------------------------------------------------------------------------------------------------ manifest


class Manifest:
    """The run's manifest: JSONL records appended (and flushed) as samples finish; thread-safe."""

    def __init__(self, path: Path, on_record: Callable[[dict], None] | None = None) -> None:
        self.path = path
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self.on_record = on_record  # called (under the lock) after each record is written
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(path, "w", encoding="utf-8")

    def add(self, record: dict) -> None:
        from decoder.sidecar import to_jsonable

        with self._lock:
            self.records.append(record)
            self._fh.write(json.dumps(to_jsonable(record)) + "\n")
            self._fh.flush()
            if self.on_record is not None:
                self.on_record(record)

    def close(self) -> None:
        with self._lock:
            self._fh.close()


def read_manifest(path: str | os.PathLike) -> list[dict]:
    """Records of a manifest; a torn last line (a killed run) is ignored."""
    records = []
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(raw))
        except ValueError:
            continue
    return records


def count_statuses(records: Iterable[dict]) -> dict[str, int]:
    counts = {status: 0 for status in STATUSES}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    return counts


@dataclass
class BatchResult:
    """Outcome of :func:`run_batch`."""

    records: list[dict]
    manifest: Path
    summary: Path
    seconds: float

    @property
    def counts(self) -> dict[str, int]:
        return count_statuses(self.records)

    @property
    def exit_code(self) -> int:
        """0 when every sample succeeded (or was already complete), 1 when some failed."""
        return 1 if self.counts["failed"] else 0

    def summary_line(self) -> str:
        c = self.counts
        return (f"{c['ok']} succeeded, {c['failed']} failed, {c['skipped']} skipped (already complete) "
                f"of {len(self.records)} samples in {self.seconds:.1f} s; manifest: {self.manifest}")


# ------------------------------------------------------------------------------------------------ running


def one_line(err: BaseException) -> str:
    """An exception as one line (user errors keep their message; others get their type name)."""
    text = " ".join(str(err).split())
    if isinstance(err, TerraInputError):
        return text
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def build_pipeline(config: BatchConfig, device: str | None = None):
    """Load the tokenizer and world model of ``config`` on ``device`` (default ``config.device``)."""
    from terra.pipeline import WorldModelPipeline

    return WorldModelPipeline.from_pretrained(
        config.world_model, config.tokenizer, backend=config.backend, device=device or config.device,
        dtype=config.dtype, **dict(config.backend_options),
    )


@dataclass
class _Prepared:
    item: Item
    request: Any  # RolloutRequest
    actions: np.ndarray
    context: list[str]
    num_context: int
    started: float


def _resolve(path: str, base: Path) -> str:
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def _prepare(item: Item, pipeline, config: BatchConfig, started: float) -> _Prepared:
    """Load and encode a sample's context, build its actions and request (raises on bad input)."""
    from terra.actions import (
        actions_from_value,
        actions_for_manoeuvre,
        actions_from_instruction_trajs,
        load_actions,
        validate_actions,
    )
    from terra.generation.rollout import RolloutRequest, RolloutState
    from tokenizer.images import load_images

    sample, record = item.sample, item.sample.record
    jsonl_dir = Path(sample.file).resolve().parent
    image_base = Path(config.image_root).expanduser() if config.image_root else jsonl_dir
    where = f"sample {sample.sample_id!r}"
    if sample.kind == "actbench":
        sources = [_resolve(p, image_base) for p in record["context_frames"]]
        images = load_images(sources, pipeline.image_size)
        drop = max(0, len(images) - config.num_context)  # instruction_trajs[0] belongs to context_frames[0]
        images = images[drop:]
    else:
        context = record["context"] if isinstance(record["context"], list) else [record["context"]]
        sources = [_resolve(p, image_base) for p in context]
        images, drop = load_images(sources, pipeline.image_size, last_n=config.num_context), 0
    num_context = len(images)
    need = num_context + item.num_frames - 1  # actions condition frames 1 .. num_context + num_frames - 1
    if sample.kind == "actbench":
        actions = actions_from_instruction_trajs(record["instruction_trajs"], f"{where}: instruction_trajs")[drop:]
        actions = validate_actions(actions, f"{where}: instruction_trajs", need)
    else:
        given = [k for k in TRAJECTORY_KEYS if k in record]
        if not given:
            if config.default_manoeuvre is None:
                raise TerraInputError(f"{where} has no trajectory; add one of {', '.join(TRAJECTORY_KEYS)} "
                                      "or set default_manoeuvre")
            actions = actions_for_manoeuvre(config.default_manoeuvre, need + 1)
        elif given[0] == "trajectory" and isinstance(record["trajectory"], str):
            actions = load_actions(_resolve(record["trajectory"], jsonl_dir), num_frames=need)
        else:
            key = given[0]
            source = f"{where}: {key}"
            actions = validate_actions(actions_from_value({key: record[key]}, source, need), source, need)
    codes = pipeline.encode(images)
    request = RolloutRequest(codes, actions, item.num_frames, seed=item.seed, overlap=config.overlap)
    RolloutState(request, pipeline.backend.layout)  # validates codes, windows and action length now
    return _Prepared(item, request, actions, sources, num_context, started)


class _Writer:
    """Decodes finished rollouts and writes their videos, codes and sidecar (sidecar last) on its threads."""

    def __init__(self, pipeline, config: BatchConfig, emit: Callable[[dict], None]) -> None:
        self.pipeline, self.config, self.emit = pipeline, config, emit
        self.pool = ThreadPoolExecutor(max_workers=config.writer_threads, thread_name_prefix="terra-batch-writer")

    def submit(self, prepared: _Prepared, generated: np.ndarray, generate_s: float) -> None:
        self.pool.submit(self._write, prepared, generated, generate_s)

    def _write(self, prepared: _Prepared, generated: np.ndarray, generate_s: float) -> None:
        item = prepared.item
        try:
            files = self.write(prepared, generated, generate_s)
        except Exception as err:  # noqa: BLE001  (recorded; the other samples go on)
            self.emit(_record(item.sample, "failed", error=one_line(err), stage="write", seed=item.seed,
                              seconds=time.perf_counter() - prepared.started))
            return
        self.emit(_record(item.sample, "ok", seconds=time.perf_counter() - prepared.started, seed=item.seed,
                          files=files, generate_s=round(generate_s, 3)))

    def write(self, prepared: _Prepared, generated: np.ndarray, generate_s: float) -> list[str]:
        from decoder import draw_trajectory, mark_frames, write_sidecar, write_video
        from tokenizer.atomic import atomic_path

        config, item, pipeline = self.config, prepared.item, self.pipeline
        t0 = time.perf_counter()
        grid = pipeline.tokenizer.grid_shape
        context = np.asarray(prepared.request.context).reshape(-1, *grid)
        codes = np.concatenate([context, np.asarray(generated).reshape(-1, *grid)])
        frames = pipeline.decode(codes)
        decode_s = time.perf_counter() - t0
        shown = frames
        if config.overlay_trajectory:
            shown = draw_trajectory(shown, prepared.actions[: len(shown)])
        if config.mark_context:
            shown = mark_frames(shown, prepared.num_context)
        out = Path(config.output_dir)
        files = []
        for path in item.videos.values():
            write_video(path, shown, fps=config.fps)
            files.append(os.path.relpath(path, out))
        if item.codes is not None:
            with atomic_path(item.codes) as tmp:
                np.save(tmp, codes.astype(np.int32))
            files.append(os.path.relpath(item.codes, out))
        sample = item.sample
        write_sidecar(
            item.sidecar, config=config.record if config.record is not None else dataclasses.asdict(config),
            seed=item.seed, actions=prepared.actions[: len(codes) - 1],
            timings={"generate_s": generate_s, "decode_s": decode_s,
                     "write_s": time.perf_counter() - t0 - decode_s,
                     "total_s": time.perf_counter() - prepared.started},
            sample_id=sample.sample_id, label=sample.record.get("label"),
            source={"file": sample.file, "line": sample.line, "format": sample.kind},
            context=prepared.context, num_context=prepared.num_context, num_generated=int(len(generated)),
            files=files, batch={"version": SIDECAR_VERSION, "fingerprint": item.fingerprint, "complete": True,
                                "frames": int(len(codes))},
        )
        return files + [os.path.relpath(item.sidecar, out)]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def _prepare_chunk(chunk: Sequence[Item], pipeline, config: BatchConfig, emit: Callable[[dict], None]) -> list[_Prepared]:
    """Load and encode a chunk's samples; a failing one is emitted as failed and left out."""
    started = time.perf_counter()
    ready: list[_Prepared] = []
    for item in chunk:
        try:
            ready.append(_prepare(item, pipeline, config, started))
        except Exception as err:  # noqa: BLE001  (one bad sample must not stop the others)
            emit(_record(item.sample, "failed", error=one_line(err), stage="input", seed=item.seed,
                         seconds=time.perf_counter() - started))
    return ready


def run_items(items: Sequence[Item], config: BatchConfig, pipeline, emit: Callable[[dict], None]) -> None:
    """Run ``items`` on ``pipeline`` in chunks of ``max_concurrent``; ``emit`` receives one record per item.

    Per chunk: load + encode every sample (a failing one is emitted as failed; a helper thread prepares the
    next chunk while this one generates), then one ``generate`` call with all requests; each rollout is
    handed to the writer threads the moment its last frame arrives.
    """
    from terra.generation.sampling import SamplingConfig

    sampling = SamplingConfig(**config.sampling)
    chunks = [items[i : i + config.max_concurrent] for i in range(0, len(items), config.max_concurrent)]
    writer = _Writer(pipeline, config, emit)
    preparer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terra-batch-prepare")
    try:
        upcoming = preparer.submit(_prepare_chunk, chunks[0], pipeline, config, emit) if chunks else None
        for k in range(len(chunks)):
            ready = upcoming.result()
            if k + 1 < len(chunks):
                upcoming = preparer.submit(_prepare_chunk, chunks[k + 1], pipeline, config, emit)
            if not ready:
                continue
            image_tokens = pipeline.backend.layout.image_tokens
            buffers = [np.zeros((p.request.num_frames, image_tokens), np.int64) for p in ready]
            handed = [False] * len(ready)
            t_gen = time.perf_counter()

            def frame_done(index: int, frame: int, codes: np.ndarray) -> None:
                try:
                    buffers[index][frame] = np.asarray(codes).reshape(-1)
                    if frame == ready[index].request.num_frames - 1 and not handed[index]:
                        handed[index] = True
                        writer.submit(ready[index], buffers[index], time.perf_counter() - t_gen)
                except Exception:  # noqa: BLE001  (never break the engine loop; the rollout is written below)
                    handed[index] = False

            try:
                generated = pipeline.backend.generate([p.request for p in ready], sampling, progress=False,
                                                      on_frame=frame_done)
            except Exception as err:  # noqa: BLE001  (the engine failed this chunk; record and go on)
                for prepared, done in zip(ready, handed):
                    if not done:
                        emit(_record(prepared.item.sample, "failed", error=one_line(err), stage="generate",
                                     seed=prepared.item.seed, seconds=time.perf_counter() - prepared.started))
                continue
            for i, prepared in enumerate(ready):  # rollouts whose last frame was not reported through on_frame
                if not handed[i]:
                    handed[i] = True
                    writer.submit(prepared, generated[i], time.perf_counter() - t_gen)
    finally:
        preparer.shutdown(wait=True, cancel_futures=True)
        writer.close()


def gpu_groups(config: BatchConfig) -> list[list[str]] | None:
    """GPU id groups, one per worker process, or None to run in this process."""
    if config.gpus is None and config.num_gpus in (0, 1):
        return None
    import torch

    visible = torch.cuda.device_count()
    if config.gpus is not None:
        gpus = [str(g) for g in (config.gpus if isinstance(config.gpus, (list, tuple)) else [config.gpus])]
        if not gpus:
            return None
    else:
        count = visible if config.num_gpus == -1 else config.num_gpus
        if visible == 0 or count > visible:
            raise TerraInputError(f"num_gpus={config.num_gpus} but {visible} CUDA GPU(s) are visible; "
                                  "use num_gpus=1 (or 0 for CPU) or list GPUs with gpus=[0,1]")
        gpus = [str(i) for i in range(count)]
    if visible == 0:
        raise TerraInputError(f"gpus={gpus} but no CUDA GPU is visible; drop gpus= to run on this machine's CPU")
    if not str(config.device).startswith(("auto", "cuda")):
        raise TerraInputError(f"device={config.device} cannot be combined with num_gpus/gpus; use device=auto")
    tp = int(dict(config.backend_options).get("tensor_parallel_size", 1) or 1)
    if len(gpus) % tp:
        raise TerraInputError(f"{len(gpus)} GPU(s) cannot be split into engines of tensor_parallel_size={tp}")
    groups = [gpus[i : i + tp] for i in range(0, len(gpus), tp)]
    return groups


def _set_threads(config: BatchConfig) -> None:
    if config.num_threads is not None:
        import torch

        torch.set_num_threads(config.num_threads)


def _worker_main(config: BatchConfig, items: list[Item], worker: int, devices: str, queue) -> None:
    """Entry point of a spawned worker: one engine on ``devices``, its share of the items."""
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    _set_threads(config)
    try:
        import torch

        # CUDA_VISIBLE_DEVICES shows this worker only its GPUs (a CPU-only machine runs it on config.device).
        pipeline = build_pipeline(config, device="cuda" if torch.cuda.is_available() else config.device)
        try:
            run_items(items, config, pipeline,
                      lambda record: queue.put(("record", worker, {**record, "gpus": devices})))
        finally:
            pipeline.close()
    except BaseException as err:  # noqa: BLE001  (reported to the parent, which records the unfinished samples)
        queue.put(("fatal", worker, one_line(err)))
        raise
    queue.put(("done", worker, None))


def _run_workers(items: list[Item], config: BatchConfig, groups: list[list[str]], emit: Callable[[dict], None]) -> None:
    """One spawned worker per GPU group; records come back through a queue and are emitted here."""
    import multiprocessing as mp
    import queue as queue_module

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    shares = [items[w :: len(groups)] for w in range(len(groups))]
    procs = {}
    for w, group in enumerate(groups):
        if not shares[w]:
            continue
        devices = ",".join(group)
        previous = os.environ.get("CUDA_VISIBLE_DEVICES")
        os.environ["CUDA_VISIBLE_DEVICES"] = devices  # inherited by the spawned interpreter from its start
        try:
            proc = ctx.Process(target=_worker_main, args=(config, shares[w], w, devices, results),
                               name=f"terra-batch-gpu{devices}", daemon=False)
            proc.start()
        finally:
            if previous is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = previous
        procs[w] = proc
    reported: dict[int, set[int]] = {w: set() for w in procs}
    fatal: dict[int, str] = {}
    running = set(procs)

    def handle(message) -> None:
        kind, w, payload = message
        if kind == "record":
            reported[w].add(payload["index"])
            emit(payload)
        elif kind == "fatal":
            fatal[w] = payload
        elif kind == "done":
            running.discard(w)

    try:
        while running:
            try:
                handle(results.get(timeout=1.0))
            except queue_module.Empty:
                pass
            for w in list(running):
                if not procs[w].is_alive():
                    while True:  # whatever it sent before exiting
                        try:
                            handle(results.get(timeout=0.5))
                        except queue_module.Empty:
                            break
                    if w in running:
                        running.discard(w)
                        reason = fatal.get(w) or f"worker exited with code {procs[w].exitcode}"
                        for item in shares[w]:
                            if item.sample.index not in reported[w]:
                                emit(_record(item.sample, "failed", stage="generate", seed=item.seed,
                                             error=f"worker on GPU(s) {','.join(groups[w])} failed: {reason}"))
    except BaseException:
        for proc in procs.values():
            if proc.is_alive():
                proc.terminate()
        raise
    finally:
        for proc in procs.values():
            proc.join(timeout=30)


def run_batch(config: BatchConfig, pipeline=None, samples: list[Sample] | None = None) -> BatchResult:
    """Plan and run a batch; return its records. ``pipeline`` reuses a loaded :class:`WorldModelPipeline`.

    User errors found before any work raise :class:`TerraInputError`; per-sample failures are recorded.
    """
    from tqdm.auto import tqdm

    from terra.outputs import prepare_output_dir
    from terra.pipeline import read_world_model_config

    started = time.perf_counter()
    the_plan = plan(config, samples)
    groups = gpu_groups(config) if the_plan.to_run else None
    if the_plan.to_run and pipeline is None:
        window = read_world_model_config(config.world_model).get("num_temporal_embeddings", 25)
        if config.num_context >= window:
            raise TerraInputError(f"num_context={config.num_context} does not fit a window of {window} frames; "
                                  f"use at most {window - 1}")
    prepare_output_dir(Path(config.output_dir))
    remove_stale_temporaries(the_plan.items)
    manifest = Manifest(config.manifest_path)
    for record in the_plan.failed + the_plan.skipped:
        manifest.add(record)
        if record["stage"] == "parse":  # the error starts with "line N:"
            tqdm.write(f"rollout: {Path(record['file']).name}: {record['error']}; skipping the line", file=sys.stderr)
        elif record["status"] == "failed":
            tqdm.write(f"rollout: {_describe(record)} failed: {record['error']}", file=sys.stderr)
    if the_plan.stale:
        tqdm.write(f"rollout: {the_plan.stale} sample(s) have earlier outputs made with other settings or with "
                   "files missing; generating them again", file=sys.stderr)
    bar = tqdm(total=len(the_plan.to_run), unit="sample", desc="rollouts", disable=not config.progress,
               dynamic_ncols=True, smoothing=0.1)

    def on_record(record: dict) -> None:
        if record["status"] == "failed":
            tqdm.write(f"rollout: {_describe(record)} failed ({record['stage']}): {record['error']}", file=sys.stderr)
        counts = count_statuses(manifest.records)
        bar.set_postfix(ok=counts["ok"], failed=counts["failed"], refresh=False)
        bar.update(1)

    manifest.on_record = on_record
    try:
        if the_plan.to_run:
            _set_threads(config)
            if groups is not None and len(groups) > 1:
                _run_workers(the_plan.to_run, config, groups, manifest.add)
            else:
                own = pipeline is None
                if own:
                    device = config.device
                    if groups is not None:  # a single GPU (group) chosen explicitly
                        device = f"cuda:{groups[0][0]}" if len(groups[0]) == 1 else config.device
                        if len(groups[0]) > 1:
                            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(groups[0])
                    pipeline = build_pipeline(config, device=device)
                try:
                    run_items(the_plan.to_run, config, pipeline, manifest.add)
                finally:
                    if own:
                        pipeline.close()
    finally:
        bar.close()
        manifest.close()
        seconds = time.perf_counter() - started
        result = BatchResult(manifest.records, config.manifest_path, config.summary_path, seconds)
        _write_summary(config, result, the_plan)
    return result


def _describe(record: dict) -> str:
    where = f"{Path(record['file']).name} line {record['line']}"
    return where if record["sample_id"] is None else f"sample {record['sample_id']!r} ({where})"


def _write_summary(config: BatchConfig, result: BatchResult, the_plan: BatchPlan) -> None:
    from tokenizer.atomic import write_text

    ran = [r for r in result.records if r["status"] == "ok" and r.get("seconds") is not None]
    summary = {
        "counts": result.counts, "samples": len(result.records), "seconds": round(result.seconds, 3),
        "mean_seconds_per_ok_sample": round(sum(r["seconds"] for r in ran) / len(ran), 3) if ran else None,
        "shard_index": config.shard_index, "num_shards": config.num_shards, "replaced_stale": the_plan.stale,
        "manifest": result.manifest.name, "exit_code": result.exit_code,
    }
    write_text(result.summary, json.dumps(summary, indent=2) + "\n")


__all__ = [
    "BatchConfig", "BatchPlan", "BatchResult", "Item", "Manifest", "Sample", "build_pipeline", "check_config",
    "config_from_omegaconf", "count_statuses", "fingerprint", "gpu_groups", "in_shard", "is_complete", "plan",
    "read_manifest", "read_samples", "remove_stale_temporaries", "run_batch", "run_items", "shard_indices",
]
