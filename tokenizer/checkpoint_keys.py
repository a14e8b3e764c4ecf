"""State-dict key names of published tokenizer checkpoints and our own, mapped in one place.

Our modules use LlamaGen's VQ-16 names (see :mod:`tokenizer.modules`), so LlamaGen checkpoints need no
renaming, only the removal of training statistics. Terra's LFQ tokenizer is configured like taming's VQGAN
(``ch, ch_mult, num_res_blocks, attn_resolutions, resolution, z_channels, ...``), so its weights most likely
carry taming's names (``encoder.down.{i}.block.{j}``, ``encoder.mid.block_1``, ``decoder.up.{i}`` with
``up[0]`` the finest level). Those exact names are not published: if a real checkpoint differs, adjust
:data:`TAMING_RULES` (and :data:`IGNORED_KEYS`) here and nowhere else.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

# Wrappers that prefix every key: DistributedDataParallel and torch.compile.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")

# Keys that hold training-time statistics, not weights: dropped before a strict load.
IGNORED_KEYS = (
    re.compile(r"^quantize\.codebook_used$"),  # LlamaGen's codebook-usage ring buffer
)

# (their template, our template, level reversed): ``{part}`` is encoder|decoder, ``{level}`` a resolution
# level. Decoder levels are reversed because taming indexes ``up`` from the finest level and LlamaGen's
# ``conv_blocks`` from the coarsest.
TAMING_RULES: tuple[tuple[str, str, bool], ...] = (
    ("encoder.down.{level}.block.", "encoder.conv_blocks.{level}.res.", False),
    ("encoder.down.{level}.attn.", "encoder.conv_blocks.{level}.attn.", False),
    ("encoder.down.{level}.downsample.", "encoder.conv_blocks.{level}.downsample.", False),
    ("decoder.up.{level}.block.", "decoder.conv_blocks.{level}.res.", True),
    ("decoder.up.{level}.attn.", "decoder.conv_blocks.{level}.attn.", True),
    ("decoder.up.{level}.upsample.", "decoder.conv_blocks.{level}.upsample.", True),
    ("{part}.mid.block_1.", "{part}.mid.0.", False),
    ("{part}.mid.attn_1.", "{part}.mid.1.", False),
    ("{part}.mid.block_2.", "{part}.mid.2.", False),
)


def _pattern(template: str) -> re.Pattern:
    regex = re.escape(template).replace(r"\{level\}", r"(?P<level>\d+)").replace(r"\{part\}", r"(?P<part>encoder|decoder)")
    return re.compile("^" + regex)


def _rename(key: str, rules: list[tuple[re.Pattern, str, bool]], num_levels: int) -> str:
    for pattern, target, reverse in rules:
        match = pattern.match(key)
        if match:
            fields = match.groupdict()
            if "level" in fields and reverse:
                fields["level"] = str(num_levels - 1 - int(fields["level"]))
            return target.format(**fields) + key[match.end():]
    return key


def _clean(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes and drop training statistics."""
    out = {}
    for key, value in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix):]
        if not any(p.match(key) for p in IGNORED_KEYS):
            out[key] = value
    return out


def uses_taming_names(state_dict: Mapping[str, torch.Tensor]) -> bool:
    """True if the keys follow taming's layout (``encoder.down.*`` / ``decoder.up.*``)."""
    return any(re.match(r"^(module\.|_orig_mod\.)*(encoder\.down\.|decoder\.up\.)", k) for k in state_dict)


def to_ours(state_dict: Mapping[str, torch.Tensor], num_levels: int) -> dict[str, torch.Tensor]:
    """Any supported checkpoint layout (ours, LlamaGen, taming/Terra) → our key names."""
    state_dict = _clean(state_dict)
    if not uses_taming_names(state_dict):
        return state_dict
    rules = [(_pattern(theirs), ours, rev) for theirs, ours, rev in TAMING_RULES]
    return {_rename(k, rules, num_levels): v for k, v in state_dict.items()}


def to_taming(state_dict: Mapping[str, torch.Tensor], num_levels: int) -> dict[str, torch.Tensor]:
    """Our key names → taming's (Terra's presumed layout), the inverse of :func:`to_ours`."""
    rules = [(_pattern(ours), theirs, rev) for theirs, ours, rev in TAMING_RULES]
    return {_rename(k, rules, num_levels): v for k, v in state_dict.items()}
