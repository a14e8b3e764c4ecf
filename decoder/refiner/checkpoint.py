"""``refiner_model.pt``'s tensor names (SVD / Vista layout) ↔ the refiner's diffusers modules; reading it."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import Mapping

import torch

from terra.core.errors import TerraInputError, error_reason
from terra.decoder.refiner.config import RefinerConfig


PREFIXES = {"unet": "model.diffusion_model.", "cond_time_stack_embed": "model.diffusion_model.cond_time_stack_embed.",
            "cond_encoder": "conditioner.embedders.3.encoder.", "temporal_vae": "first_stage_model."}
CHECKED_PREFIXES = ("model.", "first_stage_model.", "conditioner.")  # other DiffusionEngine parts are not ours
WRAPPER_PREFIX = "_forward_module."  # DeepSpeed/Lightning wrapper prefix of the published file

_UNET_TOP = {"conv_in.": "input_blocks.0.0.", "time_embedding.linear_1.": "time_embed.0.",
             "time_embedding.linear_2.": "time_embed.2.", "add_embedding.linear_1.": "label_emb.0.0.",
             "add_embedding.linear_2.": "label_emb.0.2.", "conv_norm_out.": "out.0.", "conv_out.": "out.2."}
_UNET_RES = {"norm1.": "in_layers.0.", "conv1.": "in_layers.2.", "time_emb_proj.": "emb_layers.1.",
             "norm2.": "out_layers.0.", "conv2.": "out_layers.3.", "conv_shortcut.": "skip_connection."}
_UNET_RESNET = {**{f"spatial_res_block.{old}": new for old, new in _UNET_RES.items()},
                **{f"temporal_res_block.{old}": f"time_stack.{new}" for old, new in _UNET_RES.items()}}
_UNET_ATTENTION = {"temporal_transformer_blocks.": "time_stack.", "time_pos_embed.linear_1.": "time_pos_embed.0.",
                   "time_pos_embed.linear_2.": "time_pos_embed.2."}
_VAE_RESNET = {"spatial_res_block.conv_shortcut.": "nin_shortcut.", "spatial_res_block.": "", "time_mixer.": "",
               "conv_shortcut.": "nin_shortcut.", "temporal_res_block.norm1.": "time_stack.in_layers.0.",
               "temporal_res_block.conv1.": "time_stack.in_layers.2.",
               "temporal_res_block.norm2.": "time_stack.out_layers.0.",
               "temporal_res_block.conv2.": "time_stack.out_layers.3."}
_VAE_ATTN = {"group_norm.": "norm.", "to_q.": "q.", "to_k.": "k.", "to_v.": "v.", "to_out.0.": "proj_out."}
_CONV_ATTENTION = re.compile(r"mid\.attn_1\.(q|k|v|proj_out)\.weight$")


def _rename(name: str, table: Mapping[str, str]) -> str:
    for old, new in table.items():
        if name.startswith(old):
            return new + name[len(old):]
    return name


def unet_name(name: str, config: RefinerConfig) -> str:
    """A ``UNetSpatioTemporalConditionModel`` state-dict name → its VideoUNet name (without prefix)."""
    per_level = config.layers_per_block + 1  # res blocks, then a down/upsampler
    blocks = r"(down|up)_blocks\.(\d+)\.(resnets|attentions|downsamplers|upsamplers)\.(\d+)\.(.*)"
    if m := re.match(blocks, name):
        way, level, kind, j, rest = m[1], int(m[2]), m[3], int(m[4]), m[5]
        first = level * per_level  # the level's first block (after input_blocks.0, the stem)
        if kind == "downsamplers":
            return f"input_blocks.{1 + first + config.layers_per_block}.0.op.{rest[len('conv.'):]}"
        if kind == "upsamplers":
            has_attention = config.unet_attention[len(config.unet_attention) - 1 - level]
            return f"output_blocks.{first + config.layers_per_block}.{2 if has_attention else 1}.{rest}"
        block = f"input_blocks.{1 + first + j}" if way == "down" else f"output_blocks.{first + j}"
        table = _UNET_RESNET if kind == "resnets" else _UNET_ATTENTION
        return f"{block}.{0 if kind == 'resnets' else 1}.{_rename(rest, table)}"
    if m := re.match(r"mid_block\.(resnets|attentions)\.(\d+)\.(.*)", name):
        if m[1] == "attentions":
            return "middle_block.1." + _rename(m[3], _UNET_ATTENTION)
        return f"middle_block.{2 * int(m[2])}." + _rename(m[3], _UNET_RESNET)
    return _rename(name, _UNET_TOP)


def vae_name(name: str, config: RefinerConfig) -> str:
    """An ``AutoencoderKL`` / ``AutoencoderKLTemporalDecoder`` state-dict name → its LDM name (without prefix)."""
    levels = len(config.vae_channels)
    blocks = r"(encoder|decoder)\.(down|up)_blocks\.(\d+)\.(resnets|downsamplers|upsamplers)\.(\d+)\.(.*)"
    if m := re.match(blocks, name):
        part, way, i, kind, j, rest = m[1], m[2], int(m[3]), m[4], m[5], m[6]
        level = i if way == "down" else levels - 1 - i  # LDM numbers decoder levels from full resolution up
        if kind == "resnets":
            return f"{part}.{way}.{level}.block.{j}.{_rename(rest, _VAE_RESNET)}"
        return f"{part}.{way}.{level}.{'downsample' if way == 'down' else 'upsample'}.{rest}"
    if m := re.match(r"(encoder|decoder)\.mid_block\.(resnets|attentions)\.(\d+)\.(.*)", name):
        if m[2] == "attentions":
            return f"{m[1]}.mid.attn_1.{_rename(m[4], _VAE_ATTN)}"
        return f"{m[1]}.mid.block_{int(m[3]) + 1}.{_rename(m[4], _VAE_RESNET)}"
    return _rename(name, {"encoder.conv_norm_out.": "encoder.norm_out.", "decoder.conv_norm_out.": "decoder.norm_out.",
                          "decoder.time_conv_out.": "decoder.conv_out.time_mix_conv."})


def published_name(name: str, config: RefinerConfig) -> str:
    """A state-dict name of :class:`~terra.decoder.refiner.model.VideoRefiner` → its name in ``refiner_model.pt``."""
    part, rest = name.split(".", 1)
    if part == "unet":
        return PREFIXES[part] + unet_name(rest, config)
    if part == "cond_time_stack_embed":
        return PREFIXES[part] + _rename(rest, {"linear_1.": "0.", "linear_2.": "2."})
    return PREFIXES[part] + vae_name(rest, config)


def key_table(shapes: Mapping[str, torch.Size | tuple[int, ...]], config: RefinerConfig
              ) -> dict[str, tuple[str, tuple[int, ...]]]:
    """``{published name: (module name, published shape)}`` for a refiner's state-dict ``shapes``."""
    table = {}
    for name, shape in shapes.items():
        published = published_name(name, config)
        if published in table:
            raise AssertionError(f"two tensors map to {published}: {table[published][0]} and {name}")
        table[published] = (name, (*shape, 1, 1) if _CONV_ATTENTION.search(published) else tuple(shape))  # 1x1 convs
    return table


DOWNLOAD_HINT = ("video_refiner/refiner_model.pt of the Hugging Face repo turing-motors/Terra "
                 "(`hf download turing-motors/Terra video_refiner/refiner_model.pt --local-dir Terra`)")


def check_file(path: str | os.PathLike) -> Path:
    """``path`` when it is a non-empty whole zip archive as ``torch.save`` writes (nothing loaded); else one line."""
    file = Path(path).expanduser()
    if file.is_dir():
        candidate = file / "refiner_model.pt"
        if not candidate.is_file():
            raise TerraInputError(f"refiner folder {file} has no refiner_model.pt; pass the file, {DOWNLOAD_HINT}")
        file = candidate
    if not file.is_file():
        raise TerraInputError(f"refiner weights {file} not found; download {DOWNLOAD_HINT}, or point refiner.path "
                              "at it")
    if file.stat().st_size == 0:
        raise TerraInputError(f"refiner weights {file} are empty; download {DOWNLOAD_HINT} again")
    if not zipfile.is_zipfile(file):
        raise TerraInputError(f"refiner weights {file} are not a whole PyTorch checkpoint (no zip archive: truncated, "
                              f"or another kind of file); download {DOWNLOAD_HINT} again")
    return file


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a published refiner file, ``_forward_module.`` stripped (mmap'd, on the CPU)."""
    file = check_file(path)
    try:
        data = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated zip, foreign pickle, ... : torch raises many types
        raise TerraInputError(f"refiner weights {file} cannot be read ({error_reason(err)}); the file is truncated, "
                              f"corrupt or not a PyTorch checkpoint: download {DOWNLOAD_HINT} again") from None
    if not isinstance(data, dict) or not isinstance(data.get("module"), dict):
        keys = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
        raise TerraInputError(f"{file} is not Terra's video refiner: it holds {keys}, not a {{'module': state_dict}} "
                              f"checkpoint; download {DOWNLOAD_HINT}")
    return {k.removeprefix(WRAPPER_PREFIX): v for k, v in data["module"].items()}


def match_tensors(state_dict: Mapping[str, torch.Tensor], table: Mapping[str, tuple[str, tuple[int, ...]]],
                  source: str) -> dict[str, torch.Tensor]:
    """``state_dict``'s tensors under module names; missing, unknown or misshapen tensors raise one line."""
    ours = {k: v for k, v in state_dict.items() if k.startswith(CHECKED_PREFIXES)}
    missing = sorted(set(table) - set(ours))
    unexpected = sorted(set(ours) - set(table))
    if len(missing) == len(table):
        raise TerraInputError(f"{source} is not Terra's video refiner: none of its {len(state_dict)} tensors is one "
                              f"of the refiner's {len(table)} (e.g. it has {sorted(state_dict)[:2]}); download "
                              f"{DOWNLOAD_HINT}")
    if missing or unexpected:
        raise TerraInputError(f"{source} does not match the refiner's architecture: {len(missing)} tensors missing "
                              f"(e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]}); it is "
                              "another model or the refiner preset is wrong (refiner.preset=terra for Terra's file)")
    bad = [k for k, (_, shape) in table.items() if tuple(ours[k].shape) != shape]
    if bad:
        k = bad[0]
        raise TerraInputError(f"{source}: {len(bad)} tensors have other shapes than the refiner's architecture (e.g. "
                              f"{k}: {list(ours[k].shape)}, expected {list(table[k][1])}); check refiner.preset")
    return {name: ours[published] for published, (name, _) in table.items()}
