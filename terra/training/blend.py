"""Blending a fine-tuned world model with the checkpoint it started from, in weight space."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

from omegaconf import DictConfig

from terra.config.checks import Range, check_file_size, required_path
from terra.config.output_dir import claim_output_dir
from terra.config.schema import check_schema, setting
from terra.core.errors import TerraInputError

APP = "terra-blend"  # the app whose folders blends are
# config.json keys that say how a file was written, not what the model is
BOOKKEEPING = ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "use_cache")


@dataclass
class BlendConfig:
    """terra-blend's settings."""

    base: Optional[str] = setting(None, "the checkpoint the fine-tune started from (its init=, or model=terra_v1's "
                                        "world model folder)")
    tuned: Optional[str] = setting(None, "the fine-tuned world model (a training run's model/ or best/)")
    weight: float = setting(0.8, "the fine-tune's share: 0 writes base, 1 writes tuned", Range(0, 1, 0.8))
    output_dir: Optional[str] = setting(None, "the blend's folder, replaced whole (atomically): new, empty or an "
                                              "earlier blend")
    dtype: str = setting("bfloat16", "the blend is computed in float32", choices=("bfloat16", "float32"))
    max_shard_size: Union[int, str] = setting("15MB", "weight files stay below this (a larger single tensor gets "
                                                      "its own)", check=lambda v: check_file_size(v, "max_shard_size"))


@dataclass(frozen=True)
class BlendSpec:
    base: Path
    tuned: Path
    weight: float
    output: Path
    dtype: str
    max_shard_size: int  # bytes


def blend_spec(cfg: DictConfig) -> BlendSpec:
    """The settings of ``terra-blend``, checked (one :class:`TerraInputError` line each)."""
    folders = {}
    for key, what in (("base", "the checkpoint the fine-tune started from"), ("tuned", "the fine-tuned model/")):
        folder = required_path(cfg, key, what)
        if not (folder / "config.json").is_file():
            raise TerraInputError(f"{key}={folder} has no config.json; pass a world model's folder ({what})")
        folders[key] = folder
    # the blend replaces output_dir whole: new, empty or an earlier blend, apart from the inputs
    output = claim_output_dir(required_path(cfg, "output_dir", "the blend's folder, Terra's layout"), "output_dir",
                              files=["config.json", "model.safetensors"], replaced=True,
                              inputs=[(f"{key} model's folder", folder) for key, folder in folders.items()],
                              app=APP).path
    values = check_schema(cfg, BlendConfig)
    return BlendSpec(base=folders["base"], tuned=folders["tuned"], weight=values["weight"], output=output,
                     dtype=values["dtype"], max_shard_size=values["max_shard_size"])


def blend(spec: BlendSpec) -> dict[str, Any]:
    """Write ``base + weight * (tuned - base)`` to ``spec.output``; return what was blended."""
    import torch
    from transformers import AutoModelForCausalLM

    from terra.core.atomic import atomic_dir
    from terra.models.checkpoint import read_world_model_config

    configs = {key: read_world_model_config(folder) for key, folder in (("base", spec.base), ("tuned", spec.tuned))}
    described = {key: {k: v for k, v in config.to_dict().items() if k not in BOOKKEEPING}
                 for key, config in configs.items()}
    keys = list(described["base"]) + [k for k in described["tuned"] if k not in described["base"]]
    differ = [k for k in keys if described["base"].get(k) != described["tuned"].get(k)]
    if differ:
        shown = ", ".join(f"{k} {described['base'].get(k)!r} vs {described['tuned'].get(k)!r}" for k in differ[:3])
        raise TerraInputError(
            f"base and tuned are not one architecture (config.json: {shown}{', ...' if len(differ) > 3 else ''}); "
            "blend a fine-tune only with the checkpoint it started from")
    base, tuned = (AutoModelForCausalLM.from_pretrained(folder, config=configs[key], dtype=torch.float32)
                   for key, folder in (("base", spec.base), ("tuned", spec.tuned)))
    start, blended = base.state_dict(), set()
    with torch.no_grad():
        for name, tensor in tuned.state_dict().items():
            if tensor.data_ptr() in blended:  # a tied weight: its storage is blended already
                continue
            blended.add(tensor.data_ptr())
            tensor.copy_(start[name] + spec.weight * (tensor - start[name]))
    with atomic_dir(spec.output, APP) as folder:
        tuned.to(getattr(torch, spec.dtype)).save_pretrained(folder, max_shard_size=spec.max_shard_size)
    return {"tensors": len(start), "parameters": sum(t.numel() for t in tuned.parameters())}
