"""A ``terra-drive`` run from its checked settings: worlds opened, every drive made and recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from terra.closedloop.loop import DriveSpec
from terra.closedloop.recording.open_run import OpenWorlds, frame_size, load_specs, open_worlds
from terra.closedloop.recording.run import DriveRunner, Recorded, RunSettings, recorded_drives, specs_of
from terra.closedloop.recording.run_table import run_table
from terra.closedloop.recording.settings import DriveSettings
from terra.core.progress import announce


@dataclass
class DriveOutcome:
    """How a run ended: the lines to print and the exit code (0 every drive ok, 1 some failed)."""

    lines: list[str] = field(default_factory=list)
    exit_code: int = 0


@dataclass
class Started:
    """A run's drives ready to make."""

    runner: DriveRunner
    closing: Any  # OpenWorlds or RayDrives: close() ends it
    worlds: dict[str, Any] = field(default_factory=dict)
    specs: list[DriveSpec] = field(default_factory=list)


def recorded_worlds(settings: DriveSettings, specs: Sequence[DriveSpec], run_settings: RunSettings,
                    folders: dict[str, Path], ids: dict[str, list[str]]) -> dict[str, Recorded]:
    """What each world's folder holds of its drives, read once before any world opens."""
    return {world: recorded_drives(world, specs_of(specs, ids[world]), run_settings, folder, settings.model_settings)
            for world, folder in folders.items()}


def worlds_to_drive(recorded: dict[str, Recorded], also: Sequence[str] = ()) -> list[str]:
    """The worlds with a drive not yet complete, and ``also`` (worlds a caller drives beyond the recorded run)."""
    return list(dict.fromkeys([*(world for world, found in recorded.items() if found.todo), *also]))


def start_drives(settings: DriveSettings, run_settings: RunSettings, folders: dict[str, Path],
                 ids: dict[str, list[str]], also: Sequence[str] = ()) -> Started:
    """The drives of ``ids`` (world -> drive ids) into ``folders`` made ready."""
    from terra.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(settings.run.tokenizer)
    specs = load_specs(settings, frame_size(tokenizer))
    recorded = recorded_worlds(settings, specs, run_settings, folders, ids)
    for world, found in recorded.items():
        if found.redone:
            print(found.line(world), flush=True)
    if settings.executor == "ray":
        from terra.closedloop.recording.ray_executor import RayDrives

        runner = RayDrives(settings)
        runner.start()  # the actors open the worlds on their devices
        return Started(runner, runner)
    from terra.closedloop.recording.run import LocalDrives

    opened: OpenWorlds = open_worlds(settings, worlds_to_drive(recorded, also), tokenizer)
    runner = LocalDrives(opened.worlds, specs, settings.model_settings, opened.plan_following, recorded)
    return Started(runner, opened, opened.worlds, specs)


def run_plan(settings: DriveSettings) -> str:
    """The run in one line, said before any world opens (the world model's start is a minute of silence on a CPU)."""
    policies, scenarios = {name for _, name, _ in settings.drives}, settings.scenario_indices
    seeds = f" x {settings.num_seeds} seeds" if settings.num_seeds > 1 else ""
    return (f"terra-drive: {_counted(len(settings.drives), 'drive')}: {_counted(len(policies), 'policy', 'policies')}"
            f" x {_counted(len(scenarios), 'scenario')}{seeds}, {_counted(settings.num_steps, 'step')} each in the "
            f"{settings.world} world, into {settings.output.path}; opening the world")


def _counted(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else many or one + 's'}"


def drive(settings: DriveSettings, progress: bool | None = None) -> DriveOutcome:
    """Make and record every drive of ``settings`` in its world (here, or on Ray's actors with ``executor=ray``)."""
    from terra.closedloop.recording.run import record_run

    progress = settings.progress if progress is None else progress
    announce(run_plan(settings), progress)
    run_settings = settings.run_settings(progress)
    started = start_drives(settings, run_settings, {settings.world: settings.output.path},
                           {settings.world: settings.drive_ids})
    try:
        result = record_run(started.runner, settings.world, settings.drive_ids, run_settings, settings.output)
        line = f"terra-drive: {result.line()}; {settings.output.path / run_settings.manifest}"
        routes = result.route_line()
        table = run_table({settings.world: result.drives.values()})  # what it measured, per policy
        return DriveOutcome([line, *([f"terra-drive: {routes}"] if routes else []), *table],
                            1 if result.counts["failed"] else 0)
    finally:
        started.closing.close()
