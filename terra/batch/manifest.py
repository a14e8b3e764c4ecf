"""A batch run's manifest records and a sample's failure as one line."""

from __future__ import annotations

import time
from typing import Any, Sequence

from terra.core.errors import error_line
from terra.inputs.samples import Sample


def sample_record(sample: Sample, status: str, *, error: str | None = None, stage: str | None = None,
                  seconds: float | None = None, seed: int | None = None, files: Sequence[str] = (),
                  **extra: Any) -> dict:
    """The manifest record of ``sample`` with ``status``; ``extra`` adds fields."""
    label = None if sample.record is None else sample.record.get("label")
    return {
        "sample_id": sample.sample_id, "line": sample.line, "file": sample.file, "index": sample.index,
        "status": status, "stage": stage, "error": error,
        "seconds": None if seconds is None else round(seconds, 3), "seed": seed, "files": list(files),
        "finished_at": round(time.time(), 3),  # Unix time; with seconds, when the sample's work ran
        **({} if label is None else {"label": label}), **extra,
    }


# What frees memory in a batch run: the tokenizer and the writers share the GPU with the engine's KV cache.
MEMORY_ADVICE = ("lower backend.options.gpu_memory_utilization (vLLM's share beside the engine), writer_threads or "
                 "max_concurrent")


def sample_error(err: BaseException) -> str:
    """A sample's failure as one line, a lack of memory answered with the settings that free it."""
    return error_line(err, memory_advice=MEMORY_ADVICE)
