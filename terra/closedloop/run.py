"""A recorded run of many drives: plan (resume), drive in chunks of ``max_concurrent``, write, manifest, summary.

:func:`drive_and_record` is what ``terra-drive`` (terra/apps/drive.py) and the fidelity study
(terra/closedloop/fidelity.py) call; the files are terra/closedloop/record.py's.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from tqdm.auto import tqdm

from terra.core.lock import output_lock
from terra.batch.manifest import Manifest, count_statuses
from terra.closedloop.loop import DriveSpec, run_drives
from terra.closedloop.record import MANIFEST, completed, fingerprint, manifest_record, write_drive
from terra.closedloop.worlds import World
from terra.core.atomic import write_text


@dataclass(frozen=True)
class RunSettings:
    """How drives run and where they go."""

    output_dir: Path
    num_steps: int = 20
    policy_timeout_s: float = 30.0
    history: int = 16  # newest frames a policy sees (1.5 s: NAVSIM's history at 2 Hz)
    max_concurrent: int = 64  # drives in the world at once
    resume: bool = True
    fps: float = 10.0
    progress: bool = True
    videos: bool = True  # False: the JSON files and manifest only (no video writer needed)


@dataclass
class RunResult:
    """The records of a run (one per drive) and the drives' JSON contents (complete ones read back)."""

    records: list[dict]
    drives: dict[str, dict]  # drive id -> its JSON content
    seconds: float
    generate_s: float = 0.0  # in the world (model engine or renderer), summed over chunks
    policy_s: float = 0.0  # wall time the policies took, summed over steps

    @property
    def counts(self) -> dict[str, int]:
        return count_statuses(self.records)


def drive_and_record(world: World, specs: Sequence[DriveSpec], settings: RunSettings,
                     model_settings: dict[str, Any] | None = None, plan_following=None) -> RunResult:
    """Drive every spec not already complete in ``settings.output_dir`` and record it; return the run's records.
    ``plan_following``: a :class:`~terra.closedloop.plan_following.PlanFollowing` scoring each drive's clip."""
    started = time.perf_counter()
    out = Path(settings.output_dir).expanduser()
    prints = {spec.id: fingerprint(spec, world.name, settings.num_steps, model_settings or {}) for spec in specs}
    if len(prints) != len(specs):
        raise ValueError("drive ids must be distinct (scenario ids x policy names)")
    with output_lock(out / MANIFEST, setting="output_dir"):
        manifest = Manifest(out / MANIFEST)
        result = RunResult([], {}, 0.0)
        todo = []
        for spec in specs:
            done = completed(out, spec, prints[spec.id]) if settings.resume else None
            if done is None:
                todo.append(spec)
                continue
            result.drives[spec.id] = done
            manifest.add(manifest_record(done, "skipped"))
        bar = tqdm(total=len(todo) * settings.num_steps, unit="frame", desc=f"drives ({world.name})",
                   disable=not settings.progress, dynamic_ncols=True)
        try:
            for first in range(0, len(todo), settings.max_concurrent):
                chunk = todo[first: first + settings.max_concurrent]
                chunk_start = time.perf_counter()
                counted = [0]

                def advance(step: int, n: int = len(chunk)) -> None:
                    bar.update((step - counted[0]) * n)
                    counted[0] = step

                drives = run_drives(world, chunk, settings.num_steps, settings.policy_timeout_s, settings.history,
                                    advance)
                bar.update((settings.num_steps - counted[0]) * len(chunk))
                seconds = (time.perf_counter() - chunk_start) / max(1, len(chunk))
                scores = plan_following.score(drives) if plan_following is not None else [None] * len(drives)
                for drive, score in zip(drives, scores):
                    result.policy_s += sum(drive.policy_s)
                    content = write_drive(out, drive, prints[drive.spec.id], settings.fps if settings.videos else None,
                                          None if plan_following is None else {"plan_following": score})
                    result.drives[drive.spec.id] = content
                    record = manifest_record(content, "ok" if drive.ok else "failed", seconds)
                    manifest.add(record)
                    if not drive.ok:
                        tqdm.write(f"drive: {drive.spec.id} failed ({drive.stage}): {drive.error}", file=sys.stderr)
        finally:
            bar.close()
            manifest.close()
            result.records = manifest.records
            result.seconds = time.perf_counter() - started
            result.generate_s = float(getattr(world, "generate_s", 0.0))
            summary = {"counts": result.counts, "drives": len(result.records), "seconds": round(result.seconds, 3),
                       "world": world.name, "num_steps": settings.num_steps,
                       "generate_s": round(result.generate_s, 3), "policy_s": round(result.policy_s, 3)}
            write_text(out / "manifest.summary.json", json.dumps(summary, indent=2) + "\n")
    return result
