"""A ``terra-drive`` run from its checked settings (terra/closedloop/recording/settings.py): the worlds opened once and the
scenarios read (terra/closedloop/recording/open_run.py), here or on Ray's actors (terra/closedloop/recording/ray_executor.py), every
drive made and recorded in its world (terra/closedloop/recording/run.py), and with ``world=both`` the fidelity report
(terra/closedloop/study/report.py; with ``exploitability=true`` its exploitability study:
terra/closedloop/study/exploit.py). :func:`drive` runs it all and returns how the run ended.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Sequence

from terra.closedloop.study.report import study_settings
from terra.closedloop.loop import DriveSpec
from terra.closedloop.recording.open_run import frame_size, load_specs, open_worlds
from terra.closedloop.recording.run import Recorded, RunSettings, recorded_drives, specs_of
from terra.closedloop.recording.settings import DriveSettings
from terra.closedloop.worlds import TRUTH


@dataclass
class DriveOutcome:
    """How a run ended: the lines to print and the exit code (0 every drive ok, 1 some failed)."""

    lines: list[str] = field(default_factory=list)
    exit_code: int = 0


def recorded_worlds(settings: DriveSettings, specs: Sequence[DriveSpec], run_settings: RunSettings
                    ) -> dict[str, Recorded]:
    """What each world's folder of the run holds of its drives (terra/closedloop/recording/run.py, ``recorded_drives``), read
    once before any world opens: :func:`worlds_to_drive` decides from it, and the run's records reuse it."""
    if settings.world == "both":
        folders, ids = {w: f.path for w, f in settings.fidelity.worlds.items()}, settings.fidelity.drive_ids
        run_settings = study_settings(run_settings)
    else:
        folders, ids = {settings.world: settings.output.path}, {settings.world: settings.drive_ids}
    return {world: recorded_drives(world, specs_of(specs, ids[world]), run_settings, folder, settings.model_settings)
            for world, folder in folders.items()}


def worlds_to_drive(settings: DriveSettings, recorded: dict[str, Recorded]) -> list[str]:
    """The worlds of the run with a drive not yet complete (and with ``exploitability=true`` the model's and the
    truth's, which that study drives when the run writes the report): the only worlds opened, so that a rerun whose
    drives are all recorded, as the report step after a study's shards, starts no engine."""
    names = [world for world, found in recorded.items() if found.todo]
    exploit = settings.exploitability and settings.fidelity.report
    return list(dict.fromkeys([*names, *(("model", TRUTH) if exploit else ())]))


def drive(settings: DriveSettings, progress: bool | None = None) -> DriveOutcome:
    """Make and record every drive of ``settings`` (here, or on Ray's actors with ``executor=ray``); ``progress``
    (default: the setting, on a terminal) shows the frame bar."""
    from terra.closedloop.study.exploit import exploit_study
    from terra.closedloop.study.report import fidelity_run
    from terra.closedloop.recording.run import LocalDrives, record_run

    progress = settings.progress and sys.stderr.isatty() if progress is None else progress
    run_settings = settings.run_settings(progress)
    exploit = None
    if settings.executor == "ray":
        from terra.closedloop.recording.ray_executor import RayDrives

        runner = closing = RayDrives(settings)
        runner.start()  # the actors open the worlds on their devices
    else:
        from terra.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(settings.run.tokenizer)
        specs = load_specs(settings, frame_size(tokenizer))
        recorded = recorded_worlds(settings, specs, run_settings)
        closing = open_worlds(settings, worlds_to_drive(settings, recorded), tokenizer)
        runner = LocalDrives(closing.worlds, specs, settings.model_settings, closing.plan_following, recorded)
        if settings.exploitability:  # executor=local only (terra/closedloop/recording/settings.py)
            exploit = partial(exploit_study, closing.worlds, specs, run_settings)
    try:
        if settings.world != "both":
            result = record_run(runner, settings.world, settings.drive_ids, run_settings, settings.output)
            line = f"terra-drive: {result.line()}; {settings.output.path / run_settings.manifest}"
            return DriveOutcome([line], 1 if result.counts["failed"] else 0)
        report, runs = fidelity_run(runner, run_settings, settings.fidelity, exploit)
        lines = [f"terra-drive: {world} world: {result.line()}" for world, result in runs.items()]
        out = settings.fidelity.top.path
        if report is None:
            part = "" if settings.shard_worlds == "all" else f", {settings.shard_worlds} worlds"
            lines.append(f"terra-drive: shard {settings.shard_index} of {settings.num_shards}{part}: its drives are "
                         f"in {out}/<world>/; the same command without shard_index/num_shards/shard_worlds writes the "
                         "fidelity report once every shard is done (it drives nothing again)")
        else:
            lines = [report.table(), *lines, f"terra-drive: wrote {out}/fidelity.md, fidelity.json and a folder per "
                                             f"world ({', '.join(runs)})"]
        return DriveOutcome(lines, 1 if any(r.counts["failed"] for r in runs.values()) else 0)
    finally:
        closing.close()
