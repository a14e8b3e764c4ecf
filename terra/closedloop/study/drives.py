"""A fidelity study from its checked settings: every world's drives made and recorded, then the report."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from terra.closedloop.recording.drives import DriveOutcome, drive, start_drives
from terra.closedloop.recording.settings import DriveSettings
from terra.closedloop.study.settings import StudySettings
from terra.closedloop.worlds import TRUTH
from terra.core.progress import announce

if TYPE_CHECKING:
    from terra.closedloop.study.exploit import ExploitStudy


def terra_drive(settings: DriveSettings | StudySettings, progress: bool | None = None) -> DriveOutcome:
    """Make and record every drive of ``settings``."""
    if isinstance(settings, StudySettings) and settings.until is not None:
        from terra.closedloop.study.rounds import drive_until_decided

        return drive_until_decided(settings.until, len(settings.drive.scenarios.ids), settings.exploitability,
                                   partial(drive_study, progress=progress))
    if isinstance(settings, StudySettings):
        return drive_study(settings, progress)
    return drive(settings, progress)


def drive_study(settings: StudySettings, progress: bool | None = None,
                exploit: ExploitStudy | None = None) -> DriveOutcome:
    """Make and record the drives of every world of the study's shard, then the report with the whole study."""
    from terra.closedloop.study.exploit import exploit_study
    from terra.closedloop.study.report import measured_settings, study_plan, study_run

    run, folders = settings.drive, settings.folders
    # the study's child processes run BLAS on one thread each unless the environment says otherwise
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    progress = run.progress if progress is None else progress
    run_settings = run.run_settings(progress, folders.top.path)
    announce(study_plan(folders.drive_ids, run.num_steps), progress)
    if run.executor == "ray":  # the shards, the exploitability study and the report on the cluster's workers
        from terra.closedloop.study.ray_shards import study_on_ray

        return study_on_ray(settings, drive_study)
    lines, code = [], 0
    if settings.shard_processes.groups:  # the drives made by shard processes first, then the report here
        lines, code, exploit = _beside_shards(settings, exploit)
    here = settings.exploitability and folders.report and exploit is None  # its worlds opened here
    started = start_drives(run, measured_settings(run_settings), {w: f.path for w, f in folders.worlds.items()},
                           folders.drive_ids, ("model", TRUTH) if here else ())
    study = (partial(exploit_study, started.worlds, started.specs, run_settings) if here
             else (lambda: exploit) if settings.exploitability else None)
    try:
        report, runs = study_run(started.runner, run_settings, folders, study, settings.within_horizon)
        lines += [f"terra-drive: {world} world: {result.line()}" for world, result in runs.items()]
        lines += [f"terra-drive: {world} world: {result.route_line()}" for world, result in runs.items()
                  if result.route_line()]
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


def _beside_shards(settings: StudySettings, exploit: ExploitStudy | None) -> tuple[list[str], int, ExploitStudy | None]:
    """The study's drives made by its shard processes, with the exploitability study made here meanwhile if needed."""
    from terra.closedloop.study.exploit import exploit_beside
    from terra.closedloop.study.processes import drive_in_shards, engine_share, shard_plan

    folders, processes = settings.folders, settings.shard_processes
    shards = ([*settings.overrides, f"output_dir={folders.top.path}"], processes, folders.top.path,
              sum(len(ids) for ids in folders.drive_ids.values()))
    if exploit is not None or not (settings.exploitability and folders.report):
        return (*drive_in_shards(*shards), exploit)
    per_card = shard_plan(processes.groups, beside=1)[2]
    spec = settings.drive.run
    share = engine_share(processes.kv_cache_gib, per_card or 1) if spec.backend == "vllm" else {}
    run = replace(settings.drive, run=spec.replace(backend_options={**spec.backend_options, **share}))
    driven: Future = Future()
    follower = threading.Thread(target=_made, args=(driven, drive_in_shards, *shards, 1), name="terra-shards",
                                daemon=True)  # Ctrl-C ends the command at once (the shards get it too)
    follower.start()
    try:
        exploit = exploit_beside(run, folders.top.path)
    except Exception:
        follower.join()  # the shards' drives are kept: the same command again resumes them
        raise
    follower.join()
    return (*driven.result(), exploit)


def _made(future: Future, function, *args) -> None:
    """``function(*args)``'s value or exception into ``future`` (a thread's work)."""
    try:
        future.set_result(function(*args))
    except BaseException as err:  # noqa: BLE001  (raised where the value is taken)
        future.set_exception(err)
