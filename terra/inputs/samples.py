"""The JSONL format of samples (ACT-Bench's and Terra's own): each line parsed into a :class:`Sample` and checked as
one record, nothing read from disk but the JSONL itself."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from terra.config.actbench import MAX_SAMPLES_BYTES, is_actbench_row
from terra.config.checks import MAX_FRAMES, SEED, Range, check_keys, shown
from terra.config.files import MAX_TRAJECTORY_BYTES, parse_json, read_input_text
from terra.core.errors import TerraInputError, past
from terra.inputs.actions import TRAJECTORY_KEYS
from terra.inputs.routes import ROUTE_HINTS, ROUTE_KEYS

MAX_LINE_BYTES = MAX_TRAJECTORY_BYTES  # one sample, its inline trajectory included
# A sample's own settings and their ranges (the batch's defaults of the same names use these ranges too)
SAMPLE_SETTINGS = {"seed": SEED, "num_frames": Range(1, MAX_FRAMES, 16, whole=True)}
# the keys of each format; an ACT-Bench row keeps ACT-Bench's other columns (reference_traj, ...), but a near miss
# of one of these keys is refused there too
TERRA_KEYS = ("sample_id", "context", *TRAJECTORY_KEYS, *ROUTE_KEYS, *SAMPLE_SETTINGS, "label")
ACTBENCH_KEYS = ("sample_id", "context_frames", "instruction_trajs", *ROUTE_KEYS, *SAMPLE_SETTINGS, "label")
HOLDS = (f"a sample holds sample_id, context (or context_frames), one of {', '.join(TRAJECTORY_KEYS)}, and "
         f"optionally {' or '.join(ROUTE_KEYS)}, {', '.join(SAMPLE_SETTINGS)}, label (docs/rollout.md)")


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
    """Parse JSONL file(s) into :class:`Sample` entries; malformed or invalid lines get ``error`` set."""
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
            problem = problem or _check_record(record)
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
        return None, (f"is {past(size / 2**20, MAX_LINE_BYTES / 2**20)} MiB, more than the "
                      f"{MAX_LINE_BYTES / 2**20:g} MiB a sample may have")
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
    known = ACTBENCH_KEYS if "context_frames" in record else TERRA_KEYS
    try:
        check_keys(record, known, "a sample", HOLDS, {**{key: key for key in known}, **ROUTE_HINTS},
                   strict="context_frames" not in record)
    except TerraInputError as err:
        return str(err).removeprefix("a sample: ")
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
