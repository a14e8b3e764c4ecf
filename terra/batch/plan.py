"""Planning a batch run: each sample's outputs and fingerprint, which are complete (resume), stale temporaries.

A sample is complete when its sidecar exists with the same fingerprint and every file it lists is as written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from terra.batch.config import BatchSpec
from terra.batch.manifest import sample_error, sample_record
from terra.batch.samples import check_inputs, in_shard, input_digests, sample_files
from terra.config.checks import shown
from terra.config.files import MAX_TRAJECTORY_BYTES, checkpoint_digest, load_json
from terra.config.output_dir import check_output_names
from terra.config.spec import changed_inputs
from terra.config.spec import fingerprint as spec_fingerprint
from terra.core.atomic import marked, remove_abandoned, temporary_target, whole_files
from terra.core.errors import TerraInputError
from terra.inputs.requests import RolloutInputs
from terra.inputs.samples import Sample, read_samples



@dataclass
class Item:
    """A valid sample of this shard with its seed, frame count and output files."""

    sample: Sample
    seed: int
    num_frames: int
    videos: dict[str, Path]  # format -> file (png: folder)
    sidecar: Path
    codes: Path | None
    made_from: dict[str, str] = field(default_factory=dict)  # what shapes its outputs, by part (:func:`made_from`),
    # set once its input files are read (a sample whose files cannot be read has none)
    inputs: RolloutInputs | None = None  # actions and routes, built when planned (None: a video context, whose
    # frames count when read)

    @property
    def fingerprint(self) -> str:
        return spec_fingerprint(self.made_from)

    @property
    def targets(self) -> list[Path]:
        """Every output path: videos, sidecar, codes."""
        return [*self.videos.values(), self.sidecar] + ([self.codes] if self.codes else [])


@dataclass
class BatchPlan:
    """What one run will do: samples of this shard to run, already complete ones, unusable lines."""

    config: BatchSpec
    samples: list[Sample]  # every line of this shard (blank lines excluded)
    to_run: list[Item]
    skipped: list[dict]  # manifest records of complete samples
    failed: list[dict]  # manifest records of malformed/invalid lines and unusable outputs
    items: list[Item] = field(default_factory=list)  # every valid sample of this shard (to run or complete)
    redone: list[str] = field(default_factory=list)  # why each sample with an outdated or cut output is rerun
    unused_routes: int = 0  # samples to run that carry routes, which a model without route slots does not take


def _file_name(pattern: str, sample: Sample, ext: str) -> str:
    """``pattern`` filled in for ``sample``; a digit-string id also fits ``{sample_id:06d}`` (ACT-Bench naming)."""
    sid = sample.sample_id
    fields = dict(ext=ext, line=sample.line, label=str(sample.record.get("label", "")))
    try:
        return pattern.format(sample_id=sid, **fields)
    except (ValueError, TypeError):
        if isinstance(sid, str) and sid.isdigit():
            return pattern.format(sample_id=int(sid), **fields)
        raise TerraInputError(f"sample_id {sid!r} does not fit the file name pattern {pattern!r} "
                              "(ACT-Bench naming needs integer sample ids)") from None


def _outputs(config: BatchSpec, sample: Sample) -> tuple[dict[str, Path], Path, Path | None]:
    """``(videos by format, sidecar, codes or None)`` of ``sample``; raises when one falls outside output_dir."""
    out = Path(config.output_dir)
    video_pattern, sidecar_pattern = config.patterns
    videos = {}
    for fmt in config.formats:
        name = _file_name(video_pattern, sample, fmt)
        if fmt == "png":
            name = (name[: -len(".png")] if name.endswith(".png") else name) + "_frames"
        videos[fmt] = out / name
    sidecar = out / _file_name(sidecar_pattern, sample, "json")
    codes = sidecar.with_name(sidecar.name[: -len(".json")] + ".codes.npy") if config.save_codes else None
    names = [os.path.relpath(path, out) for path in [*videos.values(), sidecar] + ([codes] if codes else [])]
    for name in names:
        if ".." in Path(name).parts:
            raise TerraInputError(f"output file {out / name} of sample {shown(sample.sample_id)} falls outside "
                                  "output.dir")
    check_output_names(out, names, f"sample {shown(sample.sample_id)}: output file")
    return videos, sidecar, codes


def made_from(config: BatchSpec, sample: Sample, seed: int, num_frames: int, inputs: Sequence[str],
              checkpoints: dict[str, str]) -> dict[str, str]:
    """What shapes a sample's outputs, by part: checkpoint digests, input digests, and settings fingerprint."""
    root = None if config.image_root is None else os.path.realpath(os.path.expanduser(config.image_root))
    return {**checkpoints, "sample": spec_fingerprint(list(inputs)),
            "settings": spec_fingerprint({"record": sample.record, "seed": seed, "num_frames": num_frames,
                                          "image_root": root,  # a path as resolved
                                          **config.generation_settings()})}


def is_complete(item: Item, out: Path) -> tuple[bool, dict | None, str | None]:
    """``(complete, sidecar, why)``: complete when the fingerprint matches and every file is intact."""
    try:  # a sidecar that is not a regular JSON file of sane size is rewritten
        sidecar = load_json(item.sidecar, "sidecar", MAX_TRAJECTORY_BYTES) if item.sidecar.is_file() else None
    except TerraInputError:
        sidecar = None
    if not isinstance(sidecar, dict):
        return False, None, None
    batch = sidecar.get("batch") or {}
    if not batch.get("complete"):
        return False, sidecar, "it was not finished"
    if batch.get("fingerprint") != item.fingerprint:
        return False, sidecar, changed_inputs(batch.get("inputs"), item.made_from)
    listed = sidecar.get("files")
    if not whole_files(out, listed, batch.get("file_digests")) or not all(
            os.path.relpath(path, out) in listed for path in item.targets if path != item.sidecar):
        return False, sidecar, "its files are not whole"
    return True, sidecar, None


def top_names(item: Item, out: Path) -> set[str]:
    """The names in ``out`` (files or first folders) that ``item`` writes."""
    return {Path(os.path.relpath(target, out)).parts[0] for target in item.targets}


def check_outputs(item: Item, config: BatchSpec, listed: frozenset[str]) -> None:
    """Raise unless every file ``item`` would overwrite is ``listed`` as written by the toolkit."""
    out = Path(config.output_dir)
    for top in top_names(item, out):
        if os.path.lexists(out / top) and top not in listed:
            raise TerraInputError(f"output.dir holds {shown(top, 80)}, which the sample would overwrite and which "
                                  "the toolkit did not write there; move it away or choose another output.dir")


def plan_batch(config: BatchSpec, samples: list[Sample] | None = None, route_tokens: int = 0) -> BatchPlan:
    """Plan this shard's samples: outputs, completeness; routes checked against ``route_tokens`` route slots."""
    all_samples = read_samples(config.sample_files) if samples is None else samples
    if samples is None and not all_samples:
        raise TerraInputError(f"samples file(s) {', '.join(map(str, config.sample_files))} hold no samples")
    # Output collisions are decided over all lines, so every shard agrees.
    owners: dict[str, Sample] = {}
    collisions: dict[int, str] = {}  # sample index -> why its output files cannot be used
    outputs: dict[int, tuple[dict[str, Path], Path, Path | None]] = {}  # sample index -> its files, worked out once
    for sample in all_samples:
        if sample.error is not None:
            continue
        try:
            videos, sidecar, codes = outputs[sample.index] = _outputs(config, sample)
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
    listed = marked(Path(config.output_dir))  # what the toolkit wrote there: a sample may replace only that
    checkpoints = {"world_model": checkpoint_digest(config.run.world_model),  # once per run
                   "tokenizer": checkpoint_digest(config.run.tokenizer)}
    result = BatchPlan(config, mine, [], [], [])
    for sample in mine:
        if sample.error is not None:
            result.failed.append(sample_record(sample, "failed", error=sample.error, stage="parse"))
            continue
        if sample.index in collisions:
            result.failed.append(sample_record(sample, "failed", error=collisions[sample.index], stage="input"))
            continue
        seed = sample.record.get("seed")
        seed = config.seed + sample.index if seed is None else int(seed)
        num_frames = int(sample.record.get("num_frames") or config.num_frames)
        item = Item(sample, seed, num_frames, *outputs[sample.index])
        result.items.append(item)  # its temporaries are swept, whatever its inputs
        try:
            files = sample_files(sample, config)
            item.made_from = made_from(config, sample, seed, num_frames, input_digests(files), checkpoints)
            complete, old, why = is_complete(item, Path(config.output_dir)) if config.resume else (False, None, None)
            if not complete:
                inputs, final = check_inputs(sample, config, files, num_frames, route_tokens)
                check_outputs(item, config, listed)
        except Exception as err:  # noqa: BLE001  (one bad sample fails alone)
            result.failed.append(sample_record(sample, "failed", error=sample_error(err), stage="input", seed=seed))
            continue
        if complete:
            result.skipped.append(sample_record(sample, "skipped", seed=seed, files=old.get("files", []) + [
                os.path.relpath(item.sidecar, config.output_dir)]))
            continue
        item.inputs = inputs if final else None
        result.redone += [why] if why else []
        result.unused_routes += inputs.unused_routes
        result.to_run.append(item)
    return result


def remove_stale_temporaries(items: Iterable[Item]) -> int:
    """Delete the stale temporary files of these items' outputs (their writer holds no lock); return how many."""
    targets: dict[Path, set[str]] = {}
    folders: list[Path] = []
    for item in items:
        for path in item.targets:
            targets.setdefault(path.parent, set()).add(path.name)
        folders += [p for fmt, p in item.videos.items() if fmt == "png"]
    removed = 0
    for folder, names in [*targets.items(), *((folder, None) for folder in folders)]:
        if folder.is_dir():
            for entry in os.scandir(folder):
                target = temporary_target(entry.name)
                if target is not None and (names is None or target in names):
                    removed += remove_abandoned(entry.path)
    return removed
