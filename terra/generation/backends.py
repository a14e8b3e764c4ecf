"""Building a generation backend from a run resolved once; the only module that knows both backends exist."""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec
from terra.contract.layout import TokenLayout
from terra.core.errors import TerraInputError
from terra.generation.resolve import BackendRun, resolve_backend_run
from terra.generation.rollout import WorldModelBackend

def build_backend(run: BackendRun) -> WorldModelBackend:
    spec = run.spec
    config = copy.deepcopy(run.model)
    config.zero_embed_code_0 = spec.zero_embed_code_0
    options = dict(run.engine_options)
    if spec.backend == "vllm":
        from terra.generation.vllm_backend import VLLMBackend
        from terra.generation.vllm_streaming import StreamingVLLMBackend

        options.pop("requests", None)
        options.pop("passes_per_step", None)
        if spec.sampling.decoding == "speculative":
            options.update(draft_tokens=spec.sampling.draft_tokens, passes_per_step=run.passes_per_step)
        chosen = StreamingVLLMBackend if run.requests == "streaming" else VLLMBackend
        build = lambda: chosen(spec.world_model, dtype=run.dtype, config=config, **options)  # noqa: E731
    else:
        from terra.generation.hf_backend import HFBackend

        build = lambda: HFBackend(spec.world_model, spec.device, getattr(torch, run.dtype),  # noqa: E731
                                  config=config, layout=run.layout, decoding=spec.sampling.decoding,
                                  draft_tokens=spec.sampling.draft_tokens, **options)
    try:
        return build()
    except TypeError as err:  # an unknown key in backend.options (ours or vLLM's engine arguments)
        if "unexpected keyword argument" not in str(err):
            raise
        raise TerraInputError(f"backend.options of backend={spec.backend}: {err}; remove or rename that option"
                              ) from None


def create_backend(
    kind: str, world_model: str | Path, device: str = "auto", dtype: str = "auto", config=None,
    sampling: SamplingConfig | None = None, max_rollouts: int | None = None, **options
) -> WorldModelBackend:
    """A backend for a caller without a run, resolved as a run of at most ``max_rollouts`` rollouts.

    Args:
        kind: auto | vllm | hf.
        world_model: the checkpoint folder.
        options: passed to the backend (``max_num_seqs`` for vLLM, ``max_batch_size`` for hf).
        config: the world model's config if already read (None: its config.json).
    """
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(world_model))
    spec = RunSpec(str(world_model), "", backend=kind, backend_options=options, device=device, dtype=dtype,
                   sampling=sampling or SamplingConfig(),
                   zero_embed_code_0=bool(getattr(config, "zero_embed_code_0", False)))
    return build_backend(resolve_backend_run(spec, max_rollouts or 1, config, max_rollouts=max_rollouts))


def model_backend(model: torch.nn.Module | str | Path, device: str | torch.device = "cpu", streams: int = 1,
                  dtype: torch.dtype | None = None, **options) -> WorldModelBackend:
    """The Transformers backend over a world model in memory or a checkpoint folder (float32 unless ``dtype``)."""
    from terra.generation.decoding import resolve_decoding
    from terra.generation.hf_backend import HFBackend

    if isinstance(model, torch.nn.Module):
        config, dtype = model.config, dtype or model.dtype
    else:
        from transformers import AutoConfig

        config, dtype = AutoConfig.from_pretrained(str(model)), dtype or torch.float32
    sampling = resolve_decoding(SamplingConfig(), "hf", str(device), streams, config=config)
    return HFBackend(model, device, dtype, config=config, layout=TokenLayout.from_config(config),
                     decoding=sampling.decoding, draft_tokens=sampling.draft_tokens, **options)


def backend_kind(backend: WorldModelBackend) -> str:
    """``hf`` for a Transformers backend, else ``vllm``."""
    from terra.generation.hf_backend import HFBackend

    return "hf" if isinstance(backend, HFBackend) else "vllm"
