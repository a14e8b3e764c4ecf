"""Terra's world model for vLLM: vLLM's Llama decoder plus the action and spatio-temporal embeddings."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers import BatchFeature
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.inputs import mm_input
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.interfaces import SupportsMultiModal
from vllm.model_executor.models.llama import LlamaDecoderLayer, LlamaModel
from vllm.model_executor.models.utils import AutoWeightsLoader, WeightsMapper, maybe_prefix
from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.multimodal.inputs import MultiModalFieldConfig, MultiModalKwargsItems, PlaceholderRange
from vllm.multimodal.parse import ModalityDataItems, MultiModalDataParser
from vllm.multimodal.processing import (
    BaseDummyInputsBuilder,
    BaseMultiModalProcessor,
    BaseProcessingInfo,
    PromptReplacement,
)
from vllm.sequence import IntermediateTensors

from terra.contract.layout import TokenLayout
from terra.models.modeling_llama_action import (
    SpatioTemporalEmbedding,
    build_action_projection,
    build_route_slots,
    embed_slots,
)
from terra.vllm import compat

MODALITY = "actions"


# ---------------------------------------------------------------- the "actions" modality


class ActionItems(ModalityDataItems[torch.Tensor, torch.Tensor]):
    """The slot items of one prompt, ``[n_frames, slots, action_dim]``, passed to the model as is."""

    def __init__(self, data: torch.Tensor) -> None:
        super().__init__(data, MODALITY)

    def get_count(self) -> int:
        return len(self.data)

    def get(self, index: int) -> torch.Tensor:
        return self.data[index]

    def get_processor_data(self) -> Mapping[str, object]:
        return {}

    def get_passthrough_data(self) -> Mapping[str, object]:
        return {MODALITY: self.data}


class ActionDataParser(MultiModalDataParser):
    """Adds the ``"actions"`` modality: an array ``[n, A + K, D]`` (or one ``[A + K, D]`` item, or a list of them)."""

    def __init__(self, slot_tokens: int, action_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.item_shape = (slot_tokens, action_dim)

    def _get_subparsers(self) -> Mapping[str, Any]:
        return {**super()._get_subparsers(), MODALITY: self._parse_actions}

    def _parse_actions(self, data: object) -> ActionItems | None:
        if data is None or isinstance(data, (list, tuple)) and not data:
            return None
        tensor = torch.as_tensor(np.asarray(data, dtype=np.float32))
        if tensor.ndim == 2:
            tensor = tensor[None]
        if tensor.ndim != 3 or tuple(tensor.shape[1:]) != self.item_shape:
            raise ValueError(
                f"'actions' items must have shape {self.item_shape} (one per frame), got {tuple(tensor.shape)}"
            )
        return ActionItems(tensor.float().contiguous()) if len(tensor) else None


class ActionProcessingInfo(BaseProcessingInfo):
    """Layout facts the processor needs, read from the world model's config."""

    def slot_tokens(self) -> int:
        """Slots of a frame: its action slots, then its route slots."""
        return TokenLayout.from_config(self.get_hf_config()).slot_tokens

    def get_data_parser(self) -> MultiModalDataParser:
        return ActionDataParser(self.slot_tokens(), self.get_hf_config().action_dim)

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {MODALITY: None}

    def get_mm_max_tokens_per_item(self, seq_len: int, mm_counts: Mapping[str, int]) -> Mapping[str, int]:
        return {MODALITY: self.slot_tokens()}


class ActionDummyInputsBuilder(BaseDummyInputsBuilder[ActionProcessingInfo]):
    """Profiling inputs sized from the config: zero slot values, one item per requested frame."""

    def get_dummy_text(self, mm_counts: Mapping[str, int]) -> str:
        return ""

    def get_dummy_mm_data(self, seq_len: int, mm_counts: Mapping[str, int], mm_options: Any = None) -> dict:
        config = self.info.get_hf_config()
        count = mm_counts.get(MODALITY, 0)
        return {MODALITY: np.zeros((count, self.info.slot_tokens(), config.action_dim), dtype=np.float32)}


def find_slots(token_ids: Sequence[int], slot_token_id: int, slot_tokens: int) -> list[int]:
    """Offsets of each frame's ``slot_tokens`` consecutive placeholder ids in a prompt."""
    ids = np.asarray(token_ids, dtype=np.int64)
    is_slot = np.concatenate([[False], ids == slot_token_id, [False]])
    edges = np.flatnonzero(np.diff(is_slot.astype(np.int8)))
    offsets: list[int] = []
    for start, end in zip(edges[::2], edges[1::2]):
        if (end - start) % slot_tokens:
            raise ValueError(
                f"a run of {end - start} slot placeholders at position {start} is not a whole number of "
                f"frames ({slot_tokens} slots each)"
            )
        offsets.extend(range(int(start), int(end), slot_tokens))
    return offsets


class ActionMultiModalProcessor(BaseMultiModalProcessor[ActionProcessingInfo]):
    """Pairs the i-th slots item with the i-th group of placeholder slots; needs no text tokenizer."""

    requires_tokenizer = False

    def _get_mm_fields_config(self, hf_inputs: BatchFeature, hf_processor_mm_kwargs: Mapping[str, object], **kwargs):
        return {MODALITY: MultiModalFieldConfig.batched(MODALITY)}

    def _get_prompt_updates(self, mm_items, hf_processor_mm_kwargs, out_mm_kwargs) -> Sequence[PromptReplacement]:
        """Each item stands for one frame's slots (the base class requires this; :meth:`apply` finds them)."""
        slots = [self.info.get_hf_config().action_token_id] * self.info.slot_tokens()
        return [PromptReplacement(modality=MODALITY, target=slots, replacement=slots)]

    def apply(self, inputs: Any, timing_ctx: Any, *args: Any, **kwargs: Any):
        """Token ids as given, one action item per placeholder group, content hashes for prefix caching."""
        config = self.info.get_hf_config()
        slot_id, slots = config.action_token_id, self.info.slot_tokens()
        items = inputs.mm_data_items.get(MODALITY)
        actions = items.data if items is not None else torch.zeros((0, slots, config.action_dim))
        ids = compat.prompt_token_ids(inputs.prompt)
        if not ids:
            ids = [slot_id] * (slots * len(actions))
        offsets = find_slots(ids, slot_id, slots)
        if len(offsets) > len(actions):
            raise ValueError(
                f"the prompt has {len(offsets)} frames of slots but {len(actions)} 'actions' items were given"
            )
        # items past the prompt's: the slots between the frames the request draws, a frame apart; nothing embeds
        # them here (the model's state does), they only make the generated blocks hash as a later prompt's
        placeholders = [PlaceholderRange(offset=o, length=slots) for o in offsets]
        span, image = config.num_spatio_embeddings, config.num_image_patches
        placeholders += [PlaceholderRange(offset=len(ids) + j * span + image, length=slots,
                                          is_embed=torch.zeros(slots, dtype=torch.bool))
                         for j in range(len(actions) - len(offsets))]
        data = BatchFeature({MODALITY: actions})
        mm_kwargs = MultiModalKwargsItems.from_hf_inputs(data, self._get_mm_fields_config(data, {}))
        hashes = compat.mm_hashes(inputs, self.info.model_id, self.info.ctx.get_mm_config())
        return mm_input(prompt_token_ids=ids, mm_kwargs=mm_kwargs, mm_hashes=hashes,
                        mm_placeholders={MODALITY: placeholders})


# ---------------------------------------------------------------- the model


@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": 0, "intermediate_tensors": 0, "inputs_embeds": 0}
)
class TerraLlamaModel(LlamaModel):
    """vLLM's Llama decoder with the spatio-temporal embedding added to its input, inside the compiled graph."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", layer_type: type[nn.Module] = LlamaDecoderLayer):
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=layer_type)
        config = vllm_config.model_config.hf_config
        self.pos_embedding_spatio_temporal = SpatioTemporalEmbedding(
            config.num_spatio_embeddings, config.num_temporal_embeddings, config.hidden_size
        )
        self.zero_embed_code_0 = bool(getattr(config, "zero_embed_code_0", False))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings; image code 0 embeds as zeros when ``zero_embed_code_0`` (Terra's vLLM port)."""
        embeds = super().embed_input_ids(input_ids)
        if self.zero_embed_code_0:
            embeds = torch.where((input_ids == 0).unsqueeze(-1), torch.zeros_like(embeds), embeds)
        return embeds

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None,
        inputs_embeds: torch.Tensor | None = None,
        **extra_layer_kwargs: Any,
    ):
        if get_pp_group().is_first_rank:
            if inputs_embeds is None:
                inputs_embeds = self.embed_input_ids(input_ids)
            inputs_embeds = inputs_embeds + self.pos_embedding_spatio_temporal(positions).to(inputs_embeds.dtype)
        return super().forward(None, positions, intermediate_tensors, inputs_embeds, **extra_layer_kwargs)


@MULTIMODAL_REGISTRY.register_processor(
    ActionMultiModalProcessor, info=ActionProcessingInfo, dummy_inputs=ActionDummyInputsBuilder
)
class TerraForCausalLM(nn.Module, SupportsMultiModal):
    """``LlamaActionForCausalLM`` (v1, linear action projection) and v2 (MLP), with or without route slots, for vLLM."""

    # Checkpoint names are the Transformers model's; only the position table moves into the compiled decoder.
    hf_to_vllm_mapper = WeightsMapper(
        orig_to_new_prefix={"pos_embedding_spatio_temporal.": "model.pos_embedding_spatio_temporal."}
    )

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__()
        compat.reseed_streaming_updates()  # this process runs the model: per-chunk seeds must take effect
        config = vllm_config.model_config.hf_config
        self.config = config
        self.codebook_size = config.codebook_size
        self.model = TerraLlamaModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"))
        self.action_projection = build_action_projection(config)
        self.route_projection, self.no_route_embedding = build_route_slots(config)
        self.lm_head = ParallelLMHead(
            config.vocab_size,
            config.hidden_size,
            quant_config=vllm_config.quant_config,
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        if config.tie_word_embeddings:
            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        self.logits_processor = LogitsProcessor(config.vocab_size)

    @classmethod
    def get_placeholder_str(cls, modality: str, i: int) -> str | None:
        return None  # prompts are token ids; there is no text placeholder

    def get_language_model(self) -> nn.Module:
        return self.model

    def get_model_state_cls(self) -> type:
        """Model Runner V2's per-request state for this model."""
        from terra.vllm.jacobi_state import JacobiModelState

        return JacobiModelState

    def embed_multimodal(self, **kwargs: object) -> list[torch.Tensor]:
        """One ``[slots, hidden]`` embedding per item (:func:`embed_slots`), in prompt order."""
        items = kwargs.get(MODALITY)
        if items is None:
            return []
        if isinstance(items, (list, tuple)):
            items = torch.stack(list(items))
        weight = next(self.action_projection.parameters())
        slots = torch.arange(items.shape[1], device=weight.device)
        return list(embed_slots(self, items.to(device=weight.device, dtype=weight.dtype), slots))

    def embed_input_ids(
        self,
        input_ids: torch.Tensor,
        multimodal_embeddings: Sequence[torch.Tensor] | None = None,
        *,
        is_multimodal: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Token embeddings, with the action embeddings written at the ``is_multimodal`` positions (sync-free)."""
        embeds = self.model.embed_input_ids(input_ids)
        if multimodal_embeddings is None or len(multimodal_embeddings) == 0 or is_multimodal is None:
            return embeds
        projected = torch.cat([e.reshape(-1, embeds.shape[-1]) for e in multimodal_embeddings]).to(embeds.dtype)
        mask = is_multimodal.to(embeds.device, non_blocking=True)
        row = (torch.cumsum(mask.to(torch.int64), dim=0) - 1).clamp(min=0)
        return torch.where(mask.unsqueeze(-1), projected[row], embeds)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: object,
    ):
        return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        """Logits with every non-image id (``>= codebook_size``) at ``-inf``: a static slice, graph safe."""
        logits = self.logits_processor(self.lm_head, hidden_states)
        if logits is not None:
            logits[..., self.codebook_size :] = float("-inf")
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.config.tie_word_embeddings:  # the head shares the token embedding
            weights = ((name, w) for name, w in weights if not name.startswith("lm_head."))
        return AutoWeightsLoader(self).load_weights(weights, mapper=self.hf_to_vllm_mapper)
