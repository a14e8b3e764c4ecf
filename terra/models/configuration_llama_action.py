"""Configuration of Terra's world model: a Llama config with the action / spatio-temporal keys."""

from __future__ import annotations

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig

from terra.contract.actions import NUM_ACTION_TOKENS
from terra.contract.routes import ROUTE_POINT_VALUES

ACTION_PROJECTION_TYPES = ("linear", "mlp")


@strict
class LlamaActionConfig(LlamaConfig):
    """Llama decoder config plus Terra's frame layout and action projection."""

    model_type = "llama_action"

    # Defaults are Terra's published shape (about 2.0 B parameters).
    vocab_size: int = 262145
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_hidden_layers: int = 22
    num_attention_heads: int = 32
    num_key_value_heads: int | None = 4
    max_position_embeddings: int = 14550
    rms_norm_eps: float = 1e-6
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    num_spatio_embeddings: int = 582
    num_temporal_embeddings: int = 25
    num_image_patches: int = 576
    num_action_tokens: int = NUM_ACTION_TOKENS
    action_dim: int = 3
    codebook_size: int | None = None
    action_token_id: int | None = None
    action_projection_type: str | None = None
    action_mlp_hidden_size: int | None = None
    zero_embed_code_0: bool = False
    num_route_tokens: int = 0

    def __post_init__(self, **kwargs):
        # Terra's own code reads the slot count as `num_action_embeddings`; accept it as an alias in files.
        if "num_action_embeddings" in kwargs:
            self.num_action_tokens = int(kwargs.pop("num_action_embeddings"))
        if self.codebook_size is None:
            self.codebook_size = self.vocab_size - 1
        if self.action_token_id is None:
            self.action_token_id = self.codebook_size
        if self.action_projection_type is None:
            v2 = "LlamaActionV2ForCausalLM" in (self.architectures or [])
            self.action_projection_type = "mlp" if v2 else "linear"
        if self.action_mlp_hidden_size is None:
            self.action_mlp_hidden_size = self.hidden_size
        if self.rope_parameters is None and "rope_theta" not in kwargs:
            kwargs["rope_theta"] = 10000.0
        super().__post_init__(**kwargs)

    @property
    def num_action_embeddings(self) -> int:
        """Action slots per frame, under the name Terra's code uses."""
        return self.num_action_tokens

    def validate_architecture(self):
        """Check the frame layout on top of Llama's own checks."""
        sizes = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "max_position_embeddings", "num_spatio_embeddings",
                 "num_temporal_embeddings", "num_image_patches", "num_action_tokens", "action_dim",
                 "action_mlp_hidden_size")
        values = {key: getattr(self, key, None) for key in sizes}
        bad = [f"{key}={value}" for key, value in values.items() if value is not None and value < 1]
        if bad:  # a table or layer of negative or zero size cannot be built
            raise ValueError(f"sizes must be positive: {', '.join(bad)}")
        super().validate_architecture()
        if self.num_route_tokens < 0:
            raise ValueError(f"num_route_tokens must be 0 or more, got {self.num_route_tokens}")
        slots = self.num_action_tokens + self.num_route_tokens
        if self.num_spatio_embeddings != self.num_image_patches + slots:
            raise ValueError(
                f"num_spatio_embeddings ({self.num_spatio_embeddings}) must equal num_image_patches "
                f"({self.num_image_patches}) + num_action_tokens ({self.num_action_tokens}) + num_route_tokens "
                f"({self.num_route_tokens})"
            )
        if self.num_route_tokens and self.action_dim != ROUTE_POINT_VALUES:
            raise ValueError(f"a model with route slots needs action_dim {ROUTE_POINT_VALUES} (a slot holds three "
                             f"values, [y, x, time] or [y, x, s]), got {self.action_dim}")
        if not 0 < self.codebook_size <= self.action_token_id < self.vocab_size:
            raise ValueError(
                f"need 0 < codebook_size ({self.codebook_size}) <= action_token_id ({self.action_token_id}) "
                f"< vocab_size ({self.vocab_size}): the action placeholder must be a non-image id in the vocab"
            )
        if self.action_projection_type not in ACTION_PROJECTION_TYPES:
            raise ValueError(
                f"action_projection_type must be one of {ACTION_PROJECTION_TYPES}, got {self.action_projection_type!r}"
            )
        if self.max_position_embeddings < self.num_spatio_embeddings * self.num_temporal_embeddings:
            raise ValueError(
                f"max_position_embeddings ({self.max_position_embeddings}) is smaller than a window "
                f"({self.num_temporal_embeddings} frames x {self.num_spatio_embeddings} positions)"
            )
