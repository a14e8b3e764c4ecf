"""A fidelity study from its checked settings (terra/closedloop/study/settings.py), made of the drive run's parts
(terra/closedloop/recording/drives.py): every world's drives made and recorded in its folder, then the report
(terra/closedloop/study/report.py; with ``exploitability=true`` its exploitability study:
terra/closedloop/study/exploit.py). :func:`terra_drive` runs what ``terra-drive``'s settings ask for: a study, or a
run in one world.
"""

from __future__ import annotations

import os
from functools import partial

from terra.closedloop.recording.drives import DriveOutcome, drive, start_drives
from terra.closedloop.recording.settings import DriveSettings
from terra.closedloop.study.settings import StudySettings
from terra.closedloop.worlds import TRUTH
from terra.core.progress import announce


def terra_drive(settings: DriveSettings | StudySettings, progress: bool | None = None) -> DriveOutcome:
    """Make and record every drive of ``settings``: a study's (:func:`drive_study`) or a run's in one world
    (terra/closedloop/recording/drives.py, ``drive``)."""
    if isinstance(settings, StudySettings):
        return drive_study(settings, progress)
    return drive(settings, progress)


def drive_study(settings: StudySettings, progress: bool | None = None) -> DriveOutcome:
    """Make and record the drives of every world of the study's shard (here, on Ray's actors with ``executor=ray``,
    or first by shard processes of this machine with ``shard_processes``), then with the whole study the report;
    ``progress`` (default: the setting) shows the frame bar on a terminal, lines in a log (terra/core/progress.py)."""
    from terra.closedloop.study.exploit import exploit_study
    from terra.closedloop.study.processes import drive_in_shards
    from terra.closedloop.study.report import measured_settings, study_plan, study_run

    run, folders = settings.drive, settings.folders
    # the processes this study starts (its writers, its shards) run numpy's BLAS on one thread each, unless the
    # environment says otherwise: the measurements' products otherwise spin their threads against the loop's and the
    # engine's (the temporal lag took 3.5 times the CPU with two threads on a busy 2-core machine)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    progress = run.progress if progress is None else progress
    run_settings = run.run_settings(progress, folders.top.path)
    announce(study_plan(folders.drive_ids, run.num_steps), progress)
    lines, code = [], 0
    if settings.shard_processes.groups:  # the drives made by shard processes first, then the report here
        total = sum(len(ids) for ids in folders.drive_ids.values())
        lines, code = drive_in_shards([*settings.overrides, f"output_dir={folders.top.path}"],
                                      settings.shard_processes, folders.top.path, total)
    exploit = settings.exploitability and folders.report  # executor=local only (terra/closedloop/study/settings.py)
    started = start_drives(run, measured_settings(run_settings), {w: f.path for w, f in folders.worlds.items()},
                           folders.drive_ids, ("model", TRUTH) if exploit else ())
    study = partial(exploit_study, started.worlds, started.specs, run_settings) if settings.exploitability else None
    try:
        report, runs = study_run(started.runner, run_settings, folders, study, settings.within_horizon)
        lines += [f"terra-drive: {world} world: {result.line()}" for world, result in runs.items()]
        out = folders.top.path
        if report is None:
            part = "" if settings.shard_worlds == "all" else f", {settings.shard_worlds} worlds"
            lines.append(f"terra-drive: shard {run.shard_index} of {run.num_shards}{part}: its drives are "
                         f"in {out}/<world>/; the same command without shard_index/num_shards/shard_worlds writes the "
                         "fidelity report once every shard is done (it drives nothing again)")
        else:
            lines += [f"terra-drive: wrote {out}/fidelity.md (the whole report: legend, horizons, every statistic, "
                      f"every policy), fidelity.json and a folder per world ({', '.join(runs)})", "",
                      report.terminal()]  # the verdict last, after the worlds' timings
        return DriveOutcome(lines, max(code, 1 if any(r.counts["failed"] for r in runs.values()) else 0))
    finally:
        started.closing.close()
