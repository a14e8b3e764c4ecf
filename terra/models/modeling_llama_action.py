"""Terra's world model for Transformers: a Llama decoder over interleaved image tokens and action slots.

Parameter names match Terra's checkpoints: the Llama backbone (``model.*``, ``lm_head``) plus
``pos_embedding_spatio_temporal.{spatio,temporal}_embeddings`` and ``action_projection`` (v1: one
``Linear(action_dim, hidden)``; v2: ``Sequential(Linear, ReLU, Linear, ReLU, Linear)``).

Two ways to call :meth:`LlamaActionForCausalLM.forward`:

* training style, as Terra's code does: ``input_ids`` holds only image tokens ``[B, T*P]`` and ``actions``
  ``[B, T*A, 3]``; the model interleaves them into ``[B, T*(P+A)]`` and returns logits for every position.
* interleaved (incremental decoding): ``input_ids`` already holds ``action_token_id`` at the action slots,
  ``actions`` ``[B, n, 3]`` fills those slots in order, and ``position_ids`` gives the window positions.

Every position ``p`` gets ``spatio[p % S] + temporal[p // S]`` added to its input embedding; RoPE uses the
same ``p``.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import nn
from transformers import LlamaForCausalLM
from transformers.modeling_outputs import CausalLMOutputWithPast

from terra.models.configuration_llama_action import LlamaActionConfig


class SpatioTemporalEmbedding(nn.Module):
    """Learned factorised position embedding: one row per position in a frame, one per frame in a window."""

    def __init__(self, num_spatio_embeddings: int, num_temporal_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_spatio_embeddings = num_spatio_embeddings
        self.spatio_embeddings = nn.Embedding(num_spatio_embeddings, embedding_dim)
        self.temporal_embeddings = nn.Embedding(num_temporal_embeddings, embedding_dim)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        spatio = self.spatio_embeddings(positions % self.num_spatio_embeddings)
        return spatio + self.temporal_embeddings(positions // self.num_spatio_embeddings)


def build_action_projection(config: LlamaActionConfig) -> nn.Module:
    """v1: ``Linear(action_dim, hidden)``; v2: ``Linear-ReLU-Linear-ReLU-Linear``."""
    if config.action_projection_type == "linear":
        return nn.Linear(config.action_dim, config.hidden_size)
    width = config.action_mlp_hidden_size
    return nn.Sequential(
        nn.Linear(config.action_dim, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, config.hidden_size),
    )


class LlamaActionForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` whose inputs interleave image tokens with projected actions."""

    config_class = LlamaActionConfig

    def __init__(self, config: LlamaActionConfig) -> None:
        super().__init__(config)
        self.pos_embedding_spatio_temporal = SpatioTemporalEmbedding(
            config.num_spatio_embeddings, config.num_temporal_embeddings, config.hidden_size
        )
        self.action_projection = build_action_projection(config)
        self.post_init()

    @classmethod
    def from_pretrained(cls, *args, config: LlamaActionConfig | None = None, **kwargs):
        """As Transformers' ``from_pretrained``; the Auto classes (which pass ``config``) get the class that
        the checkpoint's ``architectures`` names, so a Terra v2 folder loads as :class:`LlamaActionV2ForCausalLM`."""
        return super(LlamaActionForCausalLM, _class_for(cls, config)).from_pretrained(*args, config=config, **kwargs)

    @classmethod
    def _from_config(cls, config: LlamaActionConfig, **kwargs):
        return super(LlamaActionForCausalLM, _class_for(cls, config))._from_config(config, **kwargs)

    def interleave(self, image_ids: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-style inputs → interleaved ids ``[B, T*(P+A)]`` (placeholders at action slots), actions.

        ``image_ids`` is ``[B, T*P]``; ``actions`` is ``[B, T*A, 3]`` (or ``[B, T, A, 3]``).
        """
        cfg = self.config
        frames = image_ids.shape[1] // cfg.num_image_patches
        if image_ids.shape[1] != frames * cfg.num_image_patches:
            raise ValueError(f"input_ids length {image_ids.shape[1]} is not a multiple of {cfg.num_image_patches}")
        actions = actions.reshape(actions.shape[0], -1, cfg.action_dim)
        if actions.shape[1] != frames * cfg.num_action_tokens:
            raise ValueError(
                f"{frames} frames need {frames * cfg.num_action_tokens} action slots, got {actions.shape[1]}"
            )
        slots = torch.full(
            (image_ids.shape[0], frames, cfg.num_action_tokens), cfg.action_token_id,
            dtype=image_ids.dtype, device=image_ids.device,
        )
        images = rearrange(image_ids, "b (t p) -> b t p", t=frames)
        return rearrange(torch.cat([images, slots], dim=2), "b t s -> b (t s)"), actions

    def embed(self, input_ids: torch.Tensor, actions: torch.Tensor | None, position_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings: token embedding, or projected action at placeholder ids; plus the position table."""
        is_action = input_ids == self.config.action_token_id
        embeds = self.model.embed_tokens(input_ids)  # placeholders embed as their (unused) vocab row
        if self.config.zero_embed_code_0:
            embeds = embeds.masked_fill((input_ids == 0).unsqueeze(-1), 0.0)
        num_slots = int(is_action.sum())
        if num_slots:
            if actions is None or actions.shape[0] * actions.shape[1] != num_slots:
                got = 0 if actions is None else actions.shape[0] * actions.shape[1]
                raise ValueError(f"input_ids hold {num_slots} action slots but {got} actions were given")
            projected = self.action_projection(actions.to(embeds.dtype)).to(embeds.dtype).reshape(-1, embeds.shape[-1])
            embeds = embeds.masked_scatter(is_action.unsqueeze(-1), projected)
        return embeds + self.pos_embedding_spatio_temporal(position_ids).to(embeds.dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        actions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits over the interleaved sequence; see the module docstring for the two input styles."""
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids (image tokens, or interleaved ids) or inputs_embeds")
            training_style = actions is not None and not bool((input_ids == self.config.action_token_id).any())
            if training_style:
                input_ids, actions = self.interleave(input_ids, actions)
            if position_ids is None:
                past = 0 if past_key_values is None else past_key_values.get_seq_length()
                position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
                position_ids = position_ids.unsqueeze(0).expand(input_ids.shape[0], -1)
            inputs_embeds = self.embed(input_ids, actions, position_ids)
        return super().forward(
            input_ids=None,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **kwargs,
        )


class LlamaActionV2ForCausalLM(LlamaActionForCausalLM):
    """Terra v2's class name; the MLP action projection comes from ``action_projection_type: mlp``."""


def _class_for(cls: type, config: LlamaActionConfig | None) -> type:
    """The v2 class for a config whose ``architectures`` names it, when ``cls`` is the generic v1 class."""
    if cls is LlamaActionForCausalLM and "LlamaActionV2ForCausalLM" in (getattr(config, "architectures", None) or []):
        return LlamaActionV2ForCausalLM
    return cls


__all__ = ["LlamaActionForCausalLM", "LlamaActionV2ForCausalLM", "SpatioTemporalEmbedding"]
