"""The "plain vLLM Llama" baseline: vLLM's own ``LlamaForCausalLM`` of Terra's shape, driven like Terra.

The difference between its numbers and Terra's is what the action items and the spatio-temporal position
table cost (benchmarks/generation.md, "Targets ... and where the time goes").
"""

from __future__ import annotations

from typing import Any

from terra.generation.rollout import RolloutState
from terra.generation.vllm_backend import VLLMBackend
from terra.models.configuration_llama_action import LlamaActionConfig


class PlainLlamaBackend(VLLMBackend):
    """:class:`VLLMBackend`'s step loop on a plain Llama: same prompts, minus the action items.

    ``model_path`` holds the plain Llama's config.json (vLLM loads it), ``terra_config`` the Terra config whose
    token layout the prompts follow. Action slots hold the placeholder id as an ordinary token; one request per
    frame, resubmitted as soon as a frame ends, with prefix caching, exactly as for Terra. Sampling covers the
    whole vocabulary (one id more than Terra's image codebook).
    """

    def __init__(self, model_path: str, terra_config: LlamaActionConfig, **engine_kwargs: Any) -> None:
        super().__init__(model_path, config=terra_config, **engine_kwargs)

    def prompt_limits(self) -> dict[str, Any]:
        """No multimodal limit: a plain Llama takes no items, and older vLLM releases reject the setting for it."""
        return {}

    def frame_prompt(self, state: RolloutState, frames: int = 1) -> dict[str, Any]:
        """The window's token ids only."""
        ids, _, _ = state.prompt()
        return {"prompt_token_ids": ids}
