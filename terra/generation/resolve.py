"""A run's backend resolved once: every ``auto`` of its settings made concrete for this machine and world model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from terra.config.backend import resolve_backend
from terra.config.memory import ModelShape, plan_memory, tokenizer_pixels
from terra.config.spec import RunSpec
from terra.contract.layout import TokenLayout, check_window
from terra.core.device import auto_dtype, check_device, resolve_device, set_threads
from terra.generation.decoding import auto_passes_per_step, auto_streams, resolve_decoding
from terra.models import LlamaActionConfig
from terra.models.checkpoint import read_world_model_config

GPU_ROLLOUTS = 512  # the most rollouts a vLLM engine on a GPU makes room for unless told
DEFAULT_ROLLOUTS = 64  # the same on a CPU, and what a run keeps in flight where the backend knows no bound


@dataclass(frozen=True)
class BackendRun:
    """A run's backend as :func:`resolve_backend_run` made it: every setting it is built with, concrete."""

    # the settings the apps carry and record, resolved: threads set; device, backend and sampling (decoding,
    # draft_tokens, guesses) concrete; backend_options with the memory preset's choices
    spec: RunSpec
    model: LlamaActionConfig  # the world model's config.json, read once, its window checked against the spec
    dtype: str  # float32 | bfloat16 | float16: the spec's, ``auto`` made the device's
    requests: str  # vLLM's request path: streaming | per_frame (per_frame on the Transformers backend)
    layout: TokenLayout  # the model's token layout, read from ``model`` once
    tokenizer_pixels: int  # pixels the tokenizer takes at once beside the engine
    refiner_device: str | None  # decoder=refiner's device, resolved: refiner.device, else the run's; None: no refiner
    engine_options: dict[str, Any]  # what the backend is built with and the run records, a vLLM engine's room too
    passes_per_step: int | None  # a speculative vLLM engine's verifying passes a step; None: any other backend


def resolve_backend_run(spec: RunSpec, streams: int = 1, model: LlamaActionConfig | None = None,
                        refiner: str = "off", max_rollouts: int | None = None) -> BackendRun:
    """``spec`` made concrete for this process: model config, device, dtype, backend, engine options and decoding.

    Args:
        model: the world model's config, if the run already read it.
        streams: the most rollouts the run keeps in flight.
        refiner: off | after (the engine) | shared (beside it), for fitting the engine's memory.
        max_rollouts: a vLLM engine's room, when given.
    """
    model = model or check_model(spec)
    layout = TokenLayout.from_config(model)
    set_threads(spec.num_threads)
    device = resolve_device(spec.device)
    dtype = auto_dtype(device, spec.dtype)
    refiner_device = None
    if spec.decoder == "refiner":  # its own device (refiner.device, checked here), else the run's
        own = spec.refiner.get("device")
        refiner_device = resolve_device(check_device(own)) if own else device
    kind = resolve_backend(spec.backend, device)
    asked = spec.backend_options.get("requests", "per_frame")
    requests = "per_frame"
    if kind == "vllm" and asked != "per_frame":  # auto | streaming: what this vLLM release takes
        from terra.vllm.compat import request_path

        requests = request_path(asked)
    options = spec.backend_options
    if spec.memory != "full" and kind == "vllm" and device.startswith("cuda"):
        free, total = torch.cuda.mem_get_info(torch.device(device))
        plan = plan_memory(spec.memory, total, ModelShape.of(model, layout), refiner, streams, options, free)
        options = {**options, **plan.engine_options()}
    # what the backend is built with and the run records: the options above and a vLLM engine's room for the
    # rollouts the run keeps in flight, when it says how many
    engine = dict(options)
    if kind == "vllm" and max_rollouts is not None:
        engine["max_num_seqs"] = max_rollouts
    sampling = resolve_decoding(spec.sampling, kind, device, streams, asked, model)
    passes = None
    if kind == "vllm" and sampling.decoding == "speculative":  # its graphs and passes a step are for this room
        room = engine.setdefault("max_num_seqs", DEFAULT_ROLLOUTS)
        passes = options.get("passes_per_step")
        passes = auto_passes_per_step(room, sampling.draft_tokens, model) if passes is None else passes
    spec = spec.replace(device=device, backend=kind, sampling=sampling, backend_options=options)
    return BackendRun(spec, model, dtype, requests, layout, tokenizer_pixels(spec.memory), refiner_device, engine,
                      passes)


def check_model(spec: RunSpec) -> LlamaActionConfig:
    """The world model's config, with the spec's ``num_context`` and ``model.overlap`` checked against its window."""
    config = read_world_model_config(spec.world_model)
    check_window(config.num_temporal_embeddings, spec.num_context, spec.overlap)
    return config


def most_rollouts(backend: str, device: str, decoding: str = "auto") -> int:
    """Rollouts an engine is built for when the run leaves it open: 1 where hf decodes speculatively, else by device."""
    return auto_streams(backend, device, decoding) or (GPU_ROLLOUTS if device.startswith("cuda") else DEFAULT_ROLLOUTS)
