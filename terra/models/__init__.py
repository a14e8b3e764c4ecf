"""Terra's world model for Transformers: the ``llama_action`` config and the v1 / v2 causal-LM classes.

Importing this package registers them with Transformers' Auto classes, so
``AutoModelForCausalLM.from_pretrained(folder)`` loads Terra's checkpoints without ``trust_remote_code``
(the v1 class; v2 checkpoints load with :class:`LlamaActionV2ForCausalLM`).
"""

from transformers import AutoConfig, AutoModelForCausalLM

from terra.models.configuration_llama_action import LlamaActionConfig
from terra.models.modeling_llama_action import LlamaActionForCausalLM, LlamaActionV2ForCausalLM

AutoConfig.register(LlamaActionConfig.model_type, LlamaActionConfig, exist_ok=True)
AutoModelForCausalLM.register(LlamaActionConfig, LlamaActionForCausalLM, exist_ok=True)

__all__ = ["LlamaActionConfig", "LlamaActionForCausalLM", "LlamaActionV2ForCausalLM"]
