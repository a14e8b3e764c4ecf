"""vLLM plugin (entry point ``vllm.general_plugins: terra``): makes vLLM know Terra's world model."""

from __future__ import annotations

import importlib.metadata

from terra.core.errors import TerraInputError

ARCHITECTURES = ("LlamaActionForCausalLM", "LlamaActionV2ForCausalLM")
MODEL_CLASS = "terra.vllm.llama_action:TerraForCausalLM"
PLUGIN = ("terra", "terra.vllm.plugin:register")  # pyproject.toml: [project.entry-points."vllm.general_plugins"]


def check_vllm_plugin() -> None:
    """Raise unless this environment has the project's vLLM plugin entry point."""
    found = {(ep.name, ep.value) for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    if PLUGIN not in found:
        raise TerraInputError("backend=vllm needs the project installed on this node (its vLLM plugin is the entry "
                              "point vllm.general_plugins: terra): pip install 'terra-world-model[vllm,ray]' there, "
                              "or pass it with ray.runtime_env.pip")


def register() -> None:
    """Register the config type with Transformers and both architectures with vLLM's model registry."""
    import terra.models  # noqa: F401  (registers llama_action with the Auto classes)
    from vllm import ModelRegistry

    supported = set(ModelRegistry.get_supported_archs())
    for arch in ARCHITECTURES:
        if arch not in supported:
            ModelRegistry.register_model(arch, MODEL_CLASS)
