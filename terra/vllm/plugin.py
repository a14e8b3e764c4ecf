"""vLLM plugin (entry point ``vllm.general_plugins: terra``): makes vLLM know Terra's world model.

vLLM calls :func:`register` in every process it starts (engine core, workers), so ``LLM(model=folder)`` and
``vllm serve folder`` load Terra checkpoints with no user code. Registration is lazy, by string: vLLM
imports :mod:`terra.vllm.llama_action` only when it builds such a model.
"""

from __future__ import annotations

ARCHITECTURES = ("LlamaActionForCausalLM", "LlamaActionV2ForCausalLM")
MODEL_CLASS = "terra.vllm.llama_action:TerraForCausalLM"


def register() -> None:
    """Register the config type with Transformers and both architectures with vLLM's model registry."""
    import terra.models  # noqa: F401  (registers llama_action with the Auto classes)
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, MODEL_CLASS)
