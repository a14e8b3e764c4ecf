"""The input of a batch run: JSONL lines parsed into :class:`Sample`\\ s, and how lines are split into shards.

The two sample formats (ACT-Bench and Terra's own) are described in terra/batch/__init__.py.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from terra.errors import TerraInputError
from terra.inputs import TRAJECTORY_KEYS


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
        return "actbench" if self.record is not None and "context_frames" in self.record else "terra"


def read_samples(files: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Sample]:
    """Parse JSONL file(s) into :class:`Sample` entries; malformed or invalid lines get ``error`` set.

    Blank lines are skipped (they still count for line numbers and indices). A second line with an
    already-seen ``sample_id`` is an error. Reading a missing file raises :class:`TerraInputError`.
    """
    files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
    samples: list[Sample] = []
    seen: dict[str, Sample] = {}  # str(sample_id) -> its first line: 7 and "7" name the same files
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
                key = str(record["sample_id"])
                if key in seen:
                    problem = f"duplicate sample_id {record['sample_id']!r} (first on line {seen[key].line})"
                else:
                    seen[key] = sample
            if problem is not None:
                sample.error = f"line {number}: {problem}"
                sample.record = record if isinstance(record, dict) else None
            samples.append(sample)
    return samples


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
    """Whether line ``index`` belongs to shard ``shard_index`` of ``num_shards``."""
    return index % num_shards == shard_index
