"""A ``terra-drive`` run made ready: the worlds opened once on the run's device, the scenarios read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from terra.closedloop.loop import DriveSpec, drive_specs
from terra.closedloop.recording.settings import DriveSettings
from terra.closedloop.user_world import UserWorld
from terra.closedloop.worlds import TRUTH, ModelWorld, TrueWorld, World


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
    except BaseException:
        opened.close()
        raise
    if settings.estimator is not None:
        from terra.closedloop.outcomes.plan_following import PlanFollowing

        device = str(spec.device) if "model" in opened.worlds else "cpu"
        try:
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
    wanted = set(settings.drive_ids)
    specs = drive_specs(scenarios, settings.policies, settings.seed, indices, settings.policy_args, settings.num_seeds)
    return [spec for spec in specs if spec.id in wanted]
