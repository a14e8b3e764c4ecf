"""ACT-Bench's names, shared by the batch (which writes its videos) and the scorer (which reads them)."""

from __future__ import annotations

import re
from typing import Any

VIDEO_STEM = "NUSCENES_ACTION_{sample_id:06d}"  # a format string: VIDEO_STEM.format(sample_id=7)
SAMPLE_ID_IN_NAME = re.compile(r"_(\d+)$")  # the sample id at the end of a video's stem
CONTEXT_KEY = "context_frames"  # the key that makes a samples row an ACT-Bench row
MAX_SAMPLES_BYTES = 2 << 30  # one JSONL file of samples


def video_name(sample_id: int, ext: str = "mp4") -> str:
    """The file name of sample ``sample_id``'s video, e.g. ``NUSCENES_ACTION_000123.mp4``."""
    return f"{VIDEO_STEM.format(sample_id=sample_id)}.{ext}"


def sample_id_in_name(stem: str) -> int | None:
    """The sample id a video's stem ends in (``_<digits>``), or None."""
    match = SAMPLE_ID_IN_NAME.search(stem)
    return None if match is None else int(match.group(1))


def is_actbench_row(record: Any) -> bool:
    """True for a samples row in ACT-Bench's form (it carries :data:`CONTEXT_KEY`)."""
    return isinstance(record, dict) and CONTEXT_KEY in record
