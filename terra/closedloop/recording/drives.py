"""A ``terra-drive`` run from its checked settings: worlds opened once, scenarios read, drives made and recorded."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from terra.closedloop.loop import DriveSpec, drive_specs
from terra.closedloop.outcomes.alpasim import scene_scores
from terra.closedloop.recording.run import (DriveRunner, LocalDrives, RunSettings, record_run, recorded_drives,
                                            specs_of)
from terra.closedloop.recording.settings import DriveSettings
from terra.closedloop.user_world import UserWorld
from terra.closedloop.worlds import ModelWorld, TRUTH, TrueWorld, World
from terra.core.progress import announce
from terra.stats import Bootstrap


HEADER = ("world", "policy", "drives", "scene score [95% CI]", "distance m", "in lane", "off road", "collided",
          "comfortable")
LEGEND = ("scene score: AlpaSim's, 0 .. 1 (0: a collision at fault, off road or a failed drive), mean over scenarios",
          "in lane: share of frames; off road, collided, comfortable (NAVSIM's history comfort): drives measured; "
          "-: none")


def _metric(content: Mapping, *path: str):
    """``content["metrics"][path...]``, or None where a drive lacks it."""
    value = content.get("metrics") or {}
    for key in path:
        if not isinstance(value, Mapping) or value.get(key) is None:
            return None
        value = value[key]
    return value


def _share(values: list) -> str:
    """``k/n``: how many of the measured drives were flagged; ``-`` when none was measured."""
    flags = [bool(v) for v in values if v is not None]
    return f"{sum(flags)}/{len(flags)}" if flags else "-"


def _mean(values: list, form: str) -> str:
    numbers = [float(v) for v in values if v is not None]
    return format(float(np.mean(numbers)), form) if numbers else "-"


def _interval(found: Mapping | None) -> str:
    if not found or found.get("estimate") is None:
        return "-"
    if found.get("low") is None or found["low"] == found["high"]:
        return f"{found['estimate']:.2f}"
    return f"{found['estimate']:.2f} [{found['low']:.2f}, {found['high']:.2f}]"


def policy_rows(world: str, drives: Iterable[Mapping], bootstrap: Bootstrap = Bootstrap()) -> list[tuple[str, ...]]:
    """The table's rows of one world: per policy (in the order the drives name them) of its drives' JSON contents."""
    contents = list(drives)
    scores = (scene_scores(contents, bootstrap) or {}).get("by_policy", {})
    rows = []
    for policy in dict.fromkeys(c["policy"] for c in contents):
        mine = [c for c in contents if c["policy"] == policy]
        ok = [c for c in mine if c.get("status") == "ok"]
        failed = len(mine) - len(ok)
        rows.append((
            world, policy, f"{len(ok)} ok" + (f", {failed} failed" if failed else ""),
            _interval(scores.get(policy)),
            _mean([_metric(c, "progress", "distance_m") for c in ok], ".1f"),
            _mean([_metric(c, "truth", "time_in_lane") for c in ok], ".0%"),
            _share([_metric(c, "truth", "off_road") for c in ok]),
            _share([_metric(c, "truth", "collision") for c in ok]),
            _share([_metric(c, "history_comfort", "comfortable") for c in ok]),
        ))
    return rows


def run_table(worlds: Mapping[str, Iterable[Mapping]], bootstrap: Bootstrap = Bootstrap()) -> list[str]:
    """The table's lines for each world's drives, and the legend; none when there is no drive."""
    rows = [row for world, drives in worlds.items() for row in policy_rows(world, drives, bootstrap)]
    if not rows:
        return []
    widths = [max(len(row[i]) for row in (HEADER, *rows)) for i in range(len(HEADER))]
    left = 2  # world and policy read left-aligned, the numbers right-aligned

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.ljust(w) if i < left else cell.rjust(w)
                         for i, (cell, w) in enumerate(zip(cells, widths))).rstrip()

    return [line(HEADER), *(line(row) for row in rows), *LEGEND]


@dataclass
class OpenWorlds:
    """The worlds of a run by name, the frames' size and the plan-following scorer."""

    worlds: dict[str, World]
    image_size: tuple[int, int]
    plan_following: Any = None  # a terra.closedloop.outcomes.plan_following.PlanFollowing, with estimator=

    def close(self) -> None:
        """Stop the model world's sessions and close its pipeline (once)."""
        model = self.worlds.pop("model", None)
        if model is not None:
            model.shutdown()
            model.pipeline.close()


def open_worlds(settings: DriveSettings, names: Sequence[str] | None = None, tokenizer=None) -> OpenWorlds:
    """The worlds ``names`` on their device, the model's checkpoint and window checked before it loads."""
    from terra.pipeline import WorldModelPipeline
    from terra.run import resolve_run
    from terra.tokenizer import load_tokenizer

    # a vLLM engine decodes for the drives at once, and makes room for them
    run = resolve_run(settings.run, settings.max_concurrent, max_rollouts=settings.max_concurrent)
    spec = run.spec
    tokenizer = tokenizer or load_tokenizer(spec.tokenizer)
    size = frame_size(tokenizer)
    worlds = settings.worlds if names is None else tuple(names)
    users = {name: UserWorld(*settings.user_worlds[name], size, settings.policy_timeout_s)  # before the model loads:
             for name in worlds if name in settings.user_worlds}  # a constructor that fails is one line (exit 2)
    opened = OpenWorlds({}, size)
    if set(worlds) & set(settings.model_worlds):
        pipeline = WorldModelPipeline.from_run(run, tokenizer)
        opened.worlds["model"] = ModelWorld(pipeline, spec.sampling, spec.overlap, references=settings.measure)
    try:
        for name in worlds:
            if name == TRUTH:
                opened.worlds[name] = TrueWorld(size)
            elif name in users:
                opened.worlds[name] = users[name]
            elif name != "model":
                opened.worlds[name] = settings.other_world(name, size, opened.worlds.get("model"))
        if settings.estimator is not None:
            from terra.closedloop.outcomes.plan_following import PlanFollowing

            device = str(spec.device) if "model" in opened.worlds else "cpu"
            opened.plan_following = PlanFollowing(settings.estimator, device)
    except BaseException:
        opened.close()
        raise
    return opened


def frame_size(tokenizer) -> tuple[int, int]:
    """The frames' (height, width): the tokenizer's."""
    return int(tokenizer.image_size[0]), int(tokenizer.image_size[1])


def load_specs(settings: DriveSettings, image_size: tuple[int, int]) -> list[DriveSpec]:
    """The run's drives, their scenarios read (only those the drives start from)."""
    indices = settings.scenario_indices
    scenarios = settings.scenarios.load(image_size, settings.run.num_context, settings.run.resize, indices)
    return specs_of(drive_specs(scenarios, settings.policies, settings.seed, indices, settings.policy_args,
                                settings.num_seeds), settings.drive_ids)


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


def start_drives(settings: DriveSettings, run_settings: RunSettings, folders: dict[str, Path],
                 ids: dict[str, list[str]], also: Sequence[str] = ()) -> Started:
    """The drives of ``ids`` (world -> drive ids) into ``folders`` made ready."""
    from terra.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(settings.run.tokenizer)
    specs = load_specs(settings, frame_size(tokenizer))
    recorded = {world: recorded_drives(world, specs_of(specs, ids[world]), run_settings, folder,
                                       settings.model_settings) for world, folder in folders.items()}
    for world, found in recorded.items():
        if found.redone:
            print(found.line(world), flush=True)
    if settings.executor == "ray":
        from terra.closedloop.recording.ray_executor import RayDrives

        runner = RayDrives(settings)
        runner.start()  # the actors open the worlds on their devices
        return Started(runner, runner)
    to_drive = dict.fromkeys([*(world for world, found in recorded.items() if found.todo), *also])
    opened: OpenWorlds = open_worlds(settings, list(to_drive), tokenizer)
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
