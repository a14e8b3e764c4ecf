"""Terra's world model for Transformers: the ``llama_action`` config and the v1 / v2 causal-LM classes."""

from transformers import AutoConfig, AutoModelForCausalLM

from terra.models.configuration_llama_action import LlamaActionConfig
from terra.models.modeling_llama_action import LlamaActionForCausalLM, LlamaActionV2ForCausalLM

AutoConfig.register(LlamaActionConfig.model_type, LlamaActionConfig, exist_ok=True)
AutoModelForCausalLM.register(LlamaActionConfig, LlamaActionForCausalLM, exist_ok=True)

__all__ = ["LlamaActionConfig", "LlamaActionForCausalLM", "LlamaActionV2ForCausalLM"]
