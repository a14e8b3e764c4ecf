"""Terra toolkit: action-conditioned autoregressive world-model video generation.

Importing ``terra`` is light (no torch, no Transformers). The parts, by data flow (docs/ARCHITECTURE.md):
:mod:`terra.inputs` (context frames + trajectory → rollout requests), :mod:`terra.generation` (backends),
:mod:`terra.pipeline` (tokenizer → backend → frames), :mod:`terra.outputs`; the world model itself is in
:mod:`terra.models` (importing it registers ``llama_action`` with Transformers' Auto classes), its vLLM
port in :mod:`terra.vllm`, batch rollouts in :mod:`terra.batch`, the synthetic driving world in
:mod:`terra.sim`.
"""

from terra.core.errors import TerraInputError

__all__ = ["TerraInputError"]
