"""A ``terra-drive`` run from its checked settings (terra/closedloop/settings.py): the worlds opened once, the
scenarios read, every drive made and recorded in its world (terra/closedloop/run.py), and with ``world=both`` the
fidelity report (terra/closedloop/fidelity.py).

:func:`open_worlds` builds what a run drives in (the world model as a session host, the synthetic world's
renderer, the ACT-Estimator for plan following); :func:`drive` runs it all and returns how the run ended.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from terra.closedloop.loop import DriveSpec, drive_specs
from terra.closedloop.settings import DriveSettings
from terra.closedloop.worlds import ModelWorld, TrueWorld, World


@dataclass
class OpenWorlds:
    """The worlds of a run (by name: ``model``, ``truth``), the frames' size and the plan-following scorer."""

    worlds: dict[str, World]
    image_size: tuple[int, int]
    plan_following: Any = None  # a terra.closedloop.plan_following.PlanFollowing, with estimator=
    host: Any = None  # the world model's session host (closed with the worlds)

    def close(self) -> None:
        if self.host is not None:
            self.host.close()
            self.host.pipeline.close()
            self.host = None


def open_worlds(settings: DriveSettings) -> OpenWorlds:
    """The worlds ``settings.world`` names, on the device its settings choose (once: terra/generation/backends.py);
    the world model's checkpoint and window are checked against the settings before it loads."""
    from terra.pipeline import WorldModelPipeline, resolve_run
    from terra.session import SessionHost
    from terra.tokenizer import load_tokenizer

    run = resolve_run(settings.run, settings.max_concurrent)  # a vLLM engine decodes for the drives at once
    spec = run.spec
    tokenizer = load_tokenizer(spec.tokenizer)
    size = (int(tokenizer.image_size[0]), int(tokenizer.image_size[1]))
    opened = OpenWorlds({}, size)
    if settings.world != "truth":
        pipeline = WorldModelPipeline.from_run(run, tokenizer)
        opened.host = SessionHost(pipeline, spec.sampling, max_frames=settings.num_steps, overlap=spec.overlap,
                                  num_context=spec.num_context, resize=spec.resize)
        opened.worlds["model"] = ModelWorld(opened.host)
    if settings.world != "model":
        opened.worlds["truth"] = TrueWorld(size)
    if settings.estimator is not None:
        from terra.closedloop.plan_following import PlanFollowing

        device = str(spec.device) if settings.world != "truth" else "cpu"
        try:
            opened.plan_following = PlanFollowing(settings.estimator, device)
        except BaseException:
            opened.close()
            raise
    return opened


def load_specs(settings: DriveSettings, image_size: tuple[int, int]) -> list[DriveSpec]:
    """The run's drives, their scenarios read (only those the drives start from)."""
    indices = settings.scenario_indices
    scenarios = settings.scenarios.load(image_size, settings.run.num_context, settings.run.resize, indices)
    wanted = set(settings.drive_ids)
    return [spec for spec in drive_specs(scenarios, settings.policies, settings.seed, indices) if spec.id in wanted]


@dataclass
class DriveOutcome:
    """How a run ended: the lines to print and the exit code (0 every drive ok, 1 some failed)."""

    lines: list[str] = field(default_factory=list)
    exit_code: int = 0


def drive(settings: DriveSettings, progress: bool | None = None) -> DriveOutcome:
    """Make and record every drive of ``settings`` (here, or on Ray's actors with ``executor=ray``); ``progress``
    (default: the setting, on a terminal) shows the frame bar."""
    from terra.closedloop.fidelity import fidelity_run
    from terra.closedloop.run import LocalDrives, record_run

    progress = settings.progress and sys.stderr.isatty() if progress is None else progress
    run_settings = settings.run_settings(progress)
    if settings.executor == "ray":
        from terra.closedloop.ray_executor import RayDrives

        runner = closing = RayDrives(settings)
        runner.start()  # the actors open the worlds on their devices
    else:
        closing = open_worlds(settings)
        try:
            specs = load_specs(settings, closing.image_size)
        except BaseException:
            closing.close()
            raise
        runner = LocalDrives(closing.worlds, specs, settings.model_settings, closing.plan_following)
    try:
        if settings.world != "both":
            result = record_run(runner, settings.world, settings.drive_ids, run_settings, settings.output)
            line = f"terra-drive: {result.line()}; {settings.output.path / run_settings.manifest}"
            return DriveOutcome([line], 1 if result.counts["failed"] else 0)
        report, runs = fidelity_run(runner, settings.drive_ids, run_settings, settings.fidelity)
        lines = [f"terra-drive: {world} world: {result.line()}" for world, result in runs.items()]
        out = settings.fidelity.top.path
        if report is None:
            lines.append(f"terra-drive: shard {settings.shard_index} of {settings.num_shards}: its drives are in "
                         f"{out}/model and truth/; the same command without shard_index/num_shards writes the "
                         "fidelity report once every shard is done (it drives nothing again)")
        else:
            lines = [report.table(), *lines, f"terra-drive: wrote {out}/fidelity.md, fidelity.json, model/ and truth/"]
        return DriveOutcome(lines, 1 if any(r.counts["failed"] for r in runs.values()) else 0)
    finally:
        closing.close()
