"""Terra toolkit: action-conditioned autoregressive world-model video generation.

Importing ``terra`` registers the world model with Transformers' Auto classes, so
``AutoModelForCausalLM.from_pretrained(folder)`` loads Terra's checkpoints without ``trust_remote_code``.
"""

from transformers import AutoConfig, AutoModelForCausalLM

from terra.configuration_llama_action import LlamaActionConfig
from terra.errors import TerraInputError
from terra.modeling_llama_action import LlamaActionForCausalLM, LlamaActionV2ForCausalLM

AutoConfig.register(LlamaActionConfig.model_type, LlamaActionConfig, exist_ok=True)
AutoModelForCausalLM.register(LlamaActionConfig, LlamaActionForCausalLM, exist_ok=True)

__all__ = ["LlamaActionConfig", "LlamaActionForCausalLM", "LlamaActionV2ForCausalLM", "TerraInputError"]
