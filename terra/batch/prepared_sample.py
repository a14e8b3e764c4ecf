"""A sample made ready for the engine: context encoded, actions and routes built, rollout request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from terra.batch.config import BatchSpec
from terra.batch.plan import Item
from terra.batch.samples import context_paths, sample_inputs
from terra.generation.rollout import RolloutRequest
from terra.inputs.context import load_context
from terra.inputs.requests import rollout_requests
from terra.pipeline import WorldModelPipeline


@dataclass
class PreparedSample:
    """A sample ready to generate: its request and what its sidecar and overlays need."""

    item: Item
    request: RolloutRequest
    actions: np.ndarray
    context: list[str]  # the context sources read
    num_context: int
    started: float  # perf_counter when it began preparing
    route_source: str | None = None  # where the request's routes came from (RolloutInputs.route_source)
    route_told: tuple[str, ...] | None = None  # each frame's verdict (RolloutInputs.route_told)


def prepare_sample(item: Item, pipeline: WorldModelPipeline, config: BatchSpec, started: float) -> PreparedSample:
    """Load and encode a sample's context, build its actions, routes and request; raises on bad input."""
    sample = item.sample
    every = sample.kind == "actbench"  # ACT-Bench samples read every context frame, then use the last ones
    images, sources = load_context(context_paths(sample, config), pipeline.image_size,
                                   None if every else config.run.num_context, resize=config.run.resize)
    inputs = item.inputs  # built when planned, unless the context is a video
    if inputs is None:
        inputs = sample_inputs(sample, config, len(images), item.num_frames, pipeline.backend.layout.route_tokens)
    images = images[max(0, len(images) - config.run.num_context) :]
    codes = pipeline.encode(images)
    [request] = rollout_requests(codes, inputs.actions, item.num_frames, [item.seed], config.run.overlap,
                                 inputs.routes)
    return PreparedSample(item, request, inputs.actions, sources, len(images), started, inputs.route_source,
                          inputs.route_told)
