"""A planned batch's model side: the world model checked against the settings, then the samples run here or on Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from terra.batch.concurrency import planned_rollouts
from terra.batch.config import BatchSpec
from terra.batch.plan import Item
from terra.batch.stream import run_items
from terra.core.device import set_threads
from terra.generation.resolve import check_model
from terra.pipeline import WorldModelPipeline, check_compatible
from terra.refiner import RefinerSettings, check_decoder
from terra.run import resolve_run
from terra.tokenizer import load_tokenizer


@dataclass
class Execution:
    """What runs a plan's samples: a pipeline here (``executor=local``) or Ray's actors."""

    config: BatchSpec
    pipeline: WorldModelPipeline | None
    executor: Any  # RayExecutor, for executor=ray
    refiner: RefinerSettings | None
    model_config: Any  # the world model's config, read once (None: a pipeline given)
    own: bool  # whether it built the pipeline (and closes it)

    @classmethod
    def start(cls, config: BatchSpec, num_to_run: int, pipeline: WorldModelPipeline | None = None) -> Execution:
        """The settings checked against the model (even with no sample left to run); the pipeline or Ray's actors
        started when ``num_to_run`` samples are to run. ``pipeline`` reuses a loaded one."""
        model_config = check_model(config.run) if config.executor == "ray" or pipeline is None else None
        executor = run = None
        if config.executor == "ray":  # the actors resolve their runs on their devices, with the config read here
            refiner = check_decoder(config.run)
        elif pipeline is None:
            streams, most = planned_rollouts(config, num_to_run)
            run = resolve_run(config.run, streams, model=model_config, max_rollouts=most)
            refiner = run.refiner
        else:  # a loaded pipeline: its device
            set_threads(config.run.num_threads)
            refiner = check_decoder(config.run.replace(device=pipeline.device))
        own = False
        if num_to_run:
            if config.executor == "ray":
                set_threads(config.run.num_threads)  # the tokenizer's load here
                check_compatible(model_config, load_tokenizer(config.run.tokenizer))  # the actors load their own
                from terra.batch.ray_executor import RayExecutor

                executor = RayExecutor(config)
            elif pipeline is None:  # the pair is checked before any output is written
                pipeline, own = WorldModelPipeline.from_run(run), True
        return cls(config, pipeline, executor, refiner, model_config, own)

    def run(self, items: list[Item], emit: Callable[[dict], None], on_frame: Callable[..., None]) -> None:
        """Run ``items``, each record to ``emit``."""
        if self.executor is not None:
            self.executor.run(items, self.model_config, emit, on_frame)
        elif items:
            run_items(items, self.config, self.pipeline, emit, None if self.refiner is None else self.refiner.load(),
                      on_frame=on_frame)

    def close(self) -> None:
        if self.executor is not None:
            self.executor.close()
        if self.own:
            self.pipeline.close()
