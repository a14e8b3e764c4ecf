"""World-model shapes shared by tests, benchmarks and GPU checks: keyword arguments of ``LlamaActionConfig``."""

from __future__ import annotations

from typing import Any

TERRA: dict[str, Any] = dict(
    vocab_size=262145,
    hidden_size=2048,
    intermediate_size=5632,
    num_hidden_layers=22,
    num_attention_heads=32,
    num_key_value_heads=4,
    rms_norm_eps=1e-6,
    num_image_patches=576,
    num_action_tokens=6,
    num_spatio_embeddings=582,
    num_temporal_embeddings=25,
    max_position_embeddings=14550,
    architectures=["LlamaActionForCausalLM"],
)

SMALL: dict[str, Any] = dict(
    vocab_size=4097,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_image_patches=576,
    num_action_tokens=6,
    num_spatio_embeddings=582,
    num_temporal_embeddings=6,
    max_position_embeddings=582 * 6,
    architectures=["LlamaActionForCausalLM"],
)

# 8x8 = 64 image tokens + 6 action slots per frame, 6 frames per window (so rollover is cheap to reach),
# codebook 512 + 1 special id.
TINY: dict[str, Any] = dict(
    vocab_size=513,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    num_image_patches=64,
    num_action_tokens=6,
    num_spatio_embeddings=70,
    num_temporal_embeddings=6,
    max_position_embeddings=420,
    architectures=["LlamaActionForCausalLM"],
)

# 64x64 images, 8x downsampling -> 8x8 codes, 2^9 = 512 codes: the tokenizer that fits TINY.
TINY_TOKENIZER: dict[str, Any] = {
    "encoder_decoder_config": {"ch": 32, "ch_mult": [1, 1, 2, 2], "num_res_blocks": 1, "z_channels": 9,
                               "resolution": 64, "attn_resolutions": []},
    "image_size": [64, 64],
}


def with_window(preset: dict[str, Any], frames: int) -> dict[str, Any]:
    """``preset`` with windows of ``frames`` frames (temporal embeddings and position table sized to match)."""
    return {**preset, "num_temporal_embeddings": frames,
            "max_position_embeddings": frames * preset["num_spatio_embeddings"]}
