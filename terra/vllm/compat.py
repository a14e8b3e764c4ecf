"""The only place that knows how vLLM releases differ (0.26 on the GPU machine, 0.32 in CI, later ones).

Everything else in :mod:`terra.vllm.llama_action` and :mod:`terra.generation.vllm_backend` uses names that are the same in
every supported release (``SupportsMultiModal``, ``embed_input_ids``/``embed_multimodal``,
``BaseMultiModalProcessor.apply``, ``LLMEngine.add_request``/``step``). The differences handled here:

* ``ProcessorInputs.get_mm_hashes`` takes the hash algorithm as a second argument since 0.3x
  (``model_id`` only in 0.26).
* ``EngineArgs`` fields come and go; :func:`supported_engine_kwargs` drops the optional ones a release
  does not know, so one set of defaults serves every release.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import vllm
from vllm.engine.arg_utils import EngineArgs

VLLM_VERSION: str = vllm.__version__


def mm_hashes(inputs: Any, model_id: str, mm_config: Any) -> dict[str, list[str]]:
    """Content hashes of a processor call's multimodal items (prefix caching keys blocks by them)."""
    params = inspect.signature(inputs.get_mm_hashes).parameters
    if len(params) >= 2:  # 0.3x: (model_id, hash_algorithm)
        return inputs.get_mm_hashes(model_id, mm_config.mm_hasher_algorithm)
    return inputs.get_mm_hashes(model_id)  # 0.26


def prompt_token_ids(prompt: str | list[int]) -> list[int]:
    """The processor's prompt as ids: 0.26 hands the dummy (profiling) prompt over as text, always ``""``."""
    if isinstance(prompt, str):
        if prompt:
            raise ValueError("the Terra world model takes token-id prompts only (it has no text tokenizer)")
        return []
    return list(prompt)


def supported_engine_kwargs(**optional: Any) -> dict[str, Any]:
    """Keep the optional engine arguments this vLLM release knows (others are silently left out)."""
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    return {k: v for k, v in optional.items() if k in known}


def use_spawn_workers() -> None:
    """Make vLLM spawn (not fork) its engine processes unless the user chose otherwise.

    A forked child cannot re-initialise CUDA, and vLLM 0.26 does not always notice that the parent already
    touched the GPU (seen on the H100: a benchmark part whose engine core died with "Cannot re-initialize
    CUDA in forked subprocess"). Spawn is always safe; it needs the ``if __name__ == "__main__":`` guard
    that scripts using vLLM keep anyway.
    """
    import os

    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


def num_cached_tokens(request_output: Any) -> int:
    """Prompt tokens served from the prefix cache for one finished request (0 when not reported)."""
    return int(getattr(request_output, "num_cached_tokens", None) or 0)


__all__ = [
    "VLLM_VERSION", "mm_hashes", "num_cached_tokens", "prompt_token_ids", "supported_engine_kwargs",
    "use_spawn_workers",
]
