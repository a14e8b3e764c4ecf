"""How much of the GPU a run may take: the ``memory`` setting and the plan that fits vLLM's settings to it.

Under a cap, :func:`plan_memory` picks the least lossy engine settings that fit (``CANDIDATES``). Loads without torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from terra.config.checks import check_choice, check_whole_number
from terra.contract.layout import TokenLayout
from terra.core.errors import TerraInputError, past

GIB = 1 << 30
PRESETS = {"16GiB": 16 * GIB, "24GiB": 24 * GIB}  # the caps of the named presets, smallest first
MEMORY = ("full", "auto", *PRESETS)
CARD_SLACK = 0.95  # a preset runs on a card of 95 % of its size or more
REFINER_PLACES = ("off", "after", "shared")  # no refiner; it runs once the engine is closed; beside the engine
# Estimates of what a run takes besides weights and KV cache:
MAX_CARD = 1 << 50  # a card's memory: a PiB is beyond any GPU
MAX_SHARE = 0.9  # the most of a card the engine takes (vLLM's default): room for fragmentation and other work
SHARE_STEP = 0.001  # the engine's share of the card is planned in thousandths, rounded down
ENGINE_OVERHEAD = int(1.5 * GIB)  # the engine process's CUDA context, activation peak and CUDA graphs
# The app's own process: CUDA context, vLLM's client, the tokenizer's weights and its decoder's peak.
MAIN_PROCESS = int(2.5 * GIB)
DECODE_PIXELS = 288 * 512  # pixels the tokenizer encodes or decodes at once under a plan: one frame of Terra's
# Under memory=full the rest of the card holds four Terra frames at once beside the app.
FULL_DECODE_PIXELS = 4 * DECODE_PIXELS
REFINER_PEAK = int(11.5 * GIB)  # Terra's video refiner, one 47-frame sample
# FP8 weights: vLLM's online per-output-channel scales with dynamic per-token activations, the first
# BF16_LAYERS decoder layers kept bf16 (quantization_config "ignore").
FP8_WEIGHTS = "fp8_per_channel"
BF16_LAYERS = 2
# Engine settings tried in order, least lossy first: (quantization, kv_cache_dtype)
CANDIDATES = ((None, "auto"), (FP8_WEIGHTS, "auto"), (None, "fp8"), (FP8_WEIGHTS, "fp8"))
# Bytes of one value in a model dtype vLLM takes: a KV cache not in FP8 holds the model's dtype.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}


def fp8_weights_config(layers: int) -> dict[str, list[str]]:
    """vLLM's ``quantization_config`` for ``FP8_WEIGHTS`` keeping the first ``BF16_LAYERS`` of ``layers`` in bf16."""
    kept = "|".join(str(i) for i in range(min(BF16_LAYERS, layers)))
    return {"ignore": [rf"re:model\.layers\.({kept})\..*"]}


def tokenizer_pixels(memory: str = "full") -> int:
    """Pixels the tokenizer encodes or decodes at once beside an engine fitted to ``memory``."""
    return FULL_DECODE_PIXELS if memory == "full" else DECODE_PIXELS


def check_memory(value: Any) -> str:
    return check_choice(value, "memory", MEMORY)


@dataclass(frozen=True)
class ModelShape:
    """What a world model's size on the GPU depends on, read from its config (a ``LlamaActionConfig``)."""

    linear_params: int  # weights of the decoder's linear layers (what vLLM's online FP8 quantizes)
    other_params: int  # embeddings, head, norms, position tables, action and route projections (stay bf16)
    layers: int
    kv_heads: int
    head_dim: int
    window_tokens: int  # positions of one full window (the longest sequence the engine holds)

    @classmethod
    def from_config(cls, config: Any) -> "ModelShape":
        """The shape of a ``LlamaActionConfig`` (or any object with its attributes)."""
        return cls.of(config, TokenLayout.from_config(config))

    @classmethod
    def of(cls, config: Any, layout: TokenLayout) -> "ModelShape":
        """The shape of a ``LlamaActionConfig`` whose token layout is ``layout``."""
        h, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        per_layer = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2 + 3 * h * ffn
        tables = config.num_spatio_embeddings + config.num_temporal_embeddings
        width = getattr(config, "action_mlp_hidden_size", h)
        action = ((config.action_dim + 1) * h if getattr(config, "action_projection_type", "linear") == "linear"
                  else (config.action_dim + 1) * width + (width + 1) * width + (width + 1) * h)
        route = 4 * h + layout.route_tokens * h if layout.route_model else 0  # route_projection, "no route" rows
        head = 0 if getattr(config, "tie_word_embeddings", False) else config.vocab_size * h
        other = config.vocab_size * h + head + tables * h + action + route + (2 * layers + 1) * h
        return cls(per_layer * layers, other, layers, kv_heads, head_dim, layout.window_positions)

    def weight_bytes(self, quantization: str | None, bf16_layers: int = 0) -> int:
        """Bytes of the weights on the GPU: bf16, or FP8 linear layers (but the first ``bf16_layers``)."""
        fp8 = 0 if quantization is None else self.linear_params * (self.layers - min(bf16_layers, self.layers)) \
            // self.layers
        return (self.linear_params - fp8) * 2 + fp8 + self.other_params * 2

    def kv_bytes_per_token(self, kv_cache_dtype: str, dtype: str = "bfloat16") -> int:
        """Bytes of KV cache per token: keys and values of every layer in FP8 or the model's ``dtype``."""
        item = 1 if _fp8(kv_cache_dtype) else DTYPE_BYTES[dtype]
        return 2 * self.layers * self.kv_heads * self.head_dim * item

    def stream_bytes(self, kv_cache_dtype: str) -> int:
        """KV cache of one rollout holding a full window."""
        return self.window_tokens * self.kv_bytes_per_token(kv_cache_dtype)


@dataclass(frozen=True)
class MemoryPlan:
    """The engine settings :func:`plan_memory` chose for a cap, and what they leave."""

    preset: str
    cap_bytes: int
    card_bytes: int
    quantization: str | None
    kv_cache_dtype: str
    gpu_memory_utilization: float  # the engine's share of the whole card
    max_num_seqs: int  # rollouts the KV cache holds at full window (at most what the run asked)
    refiner: str  # off | after | shared (REFINER_PLACES)
    quantization_config: dict[str, Any] | None = None  # vLLM's, for the plan's own FP8 weights (fp8_weights_config)

    def engine_options(self) -> dict[str, Any]:
        options = {"quantization": self.quantization, "kv_cache_dtype": self.kv_cache_dtype,
                   "gpu_memory_utilization": self.gpu_memory_utilization, "max_num_seqs": self.max_num_seqs}
        if self.quantization_config is not None:
            options["quantization_config"] = self.quantization_config
        return options


def check_card(card_bytes: Any) -> int:
    """``card_bytes`` as an ``int`` from 1 to :data:`MAX_CARD`; otherwise one line."""
    return check_whole_number(card_bytes, "card_bytes (the card's memory in bytes)", 1, f"card_bytes={80 * GIB}",
                              MAX_CARD)


def preset_cap(preset: str, card_bytes: int) -> int:
    """Bytes the run may use on a card of ``card_bytes``: the card for ``auto``, else ``CARD_SLACK`` of the preset."""
    preset = check_choice(preset, "memory", ("auto", *PRESETS))
    card_bytes = check_card(card_bytes)
    if preset == "auto":
        return card_bytes
    size = PRESETS[preset]
    if card_bytes < CARD_SLACK * size:
        smaller = [name for name, cap in PRESETS.items() if CARD_SLACK * cap <= card_bytes]
        fix = f"use memory={smaller[-1]} or memory=auto" if smaller else "use memory=auto"
        raise TerraInputError(f"memory={preset} needs a card of {size / GIB:.0f} GiB; this one has "
                              f"{card_bytes / GIB:.1f} GiB: {fix}")
    return min(math.ceil(CARD_SLACK * size), card_bytes)


def engine_share(room: int, card_bytes: int) -> float:
    """vLLM's ``gpu_memory_utilization`` for ``room`` bytes, rounded down to ``SHARE_STEP``."""
    steps = round(1 / SHARE_STEP)
    return room * steps // card_bytes / steps


def engine_budget(cap: int, refiner: str) -> int:
    """Bytes of the cap left to the engine process: the app's own process, and the refiner when it runs beside."""
    return cap - MAIN_PROCESS - (REFINER_PEAK if refiner == "shared" else 0)


def _fp8(kv_cache_dtype: Any) -> bool:
    return str(kv_cache_dtype).startswith("fp8")


def _candidates(requested: Mapping[str, Any]) -> list[tuple[str | None, str]]:
    """The ``CANDIDATES`` pairs the ``requested`` options allow, least lossy first."""
    allowed = []
    for quantization, kv in CANDIDATES:
        if "quantization" in requested:
            if (requested["quantization"] is None) != (quantization is None):
                continue
            quantization = requested["quantization"]
        if "kv_cache_dtype" in requested:
            if _fp8(requested["kv_cache_dtype"]) != _fp8(kv):
                continue
            kv = requested["kv_cache_dtype"]
        allowed.append((quantization, kv))
    return allowed


def _own_fp8(quantization: str | None, requested: Mapping[str, Any]) -> bool:
    """Whether ``quantization`` is the plan's own FP8 weights, not one the run set in ``backend.options``."""
    return quantization is not None and "quantization" not in requested


def _weight_bytes(shape: ModelShape, quantization: str | None, requested: Mapping[str, Any]) -> int:
    """The weights' bytes under ``quantization`` (a run's own ``quantization_config`` counted as bf16)."""
    if quantization is not None and "quantization_config" in requested:
        return shape.weight_bytes(None)
    return shape.weight_bytes(quantization, BF16_LAYERS if _own_fp8(quantization, requested) else 0)


def _fit(shape: ModelShape, budget: int, streams: int, requested: Mapping[str, Any]) -> tuple | None:
    """The least lossy (quantization, kv_cache_dtype, rollouts) holding ``streams`` rollouts in ``budget``; else the
    one holding the most; None if none holds one.
    """
    best = None
    for quantization, kv in _candidates(requested):
        room = budget - ENGINE_OVERHEAD - _weight_bytes(shape, quantization, requested)
        held = max(room, 0) // shape.stream_bytes(kv)
        if held >= streams:
            return quantization, kv, streams
        if held >= 1 and (best is None or held > best[2]):
            best = (quantization, kv, int(held))
    return best


def plan_memory(preset: str, card_bytes: int, shape: ModelShape, refiner: str = "off", streams: int = 64,
                requested: Mapping[str, Any] | None = None, free_bytes: int | None = None) -> MemoryPlan:
    """The vLLM settings that fit a run of at most ``streams`` rollouts under ``preset`` on a card of ``card_bytes``.

    Args:
        preset: 16GiB | 24GiB | auto.
        refiner: off | after (runs once the engine closes) | shared (beside it).
        requested: the run's ``backend.options``; those it sets are kept.
        free_bytes: the card's free memory now.
    """
    check_choice(refiner, "refiner placement", REFINER_PLACES)
    card_bytes = check_card(card_bytes)
    streams = check_whole_number(streams, "streams (rollouts at once)", 1, "streams=64")
    if free_bytes is not None:
        free_bytes = check_whole_number(free_bytes, "free_bytes (the card's free memory in bytes)", 0,
                                        f"free_bytes={40 * GIB}", card_bytes)
    requested = dict(requested or {})
    cap = preset_cap(preset, card_bytes)
    streams = max(1, min(streams, int(requested.get("max_num_seqs") or streams)))
    room = max(0, min(engine_budget(cap, refiner), int(MAX_SHARE * card_bytes)))
    share = requested.get("gpu_memory_utilization")
    if share is None:
        share = engine_share(room, card_bytes)
    elif share * card_bytes > room:
        raise TerraInputError(
            f"backend.options.gpu_memory_utilization={share:g} takes {past(share * card_bytes / GIB, room / GIB)} "
            "GiB, more than "
            f"memory={preset} leaves the engine ({room / GIB:.1f} GiB); remove it (the preset sets it) or use at "
            f"most {engine_share(room, card_bytes):g}")
    engine = int(share * card_bytes)
    fit = _fit(shape, engine, streams, requested)
    if fit is None:
        raise TerraInputError(_no_fit(preset, card_bytes, shape, refiner, requested))
    if free_bytes is not None and engine > free_bytes:
        raise TerraInputError(f"memory={preset}: the engine needs {engine / GIB:.1f} GiB but only "
                              f"{free_bytes / GIB:.1f} GiB of the card are free (other processes hold the rest); "
                              "free the card or use a smaller preset")
    quantization, kv, held = fit
    return MemoryPlan(preset, cap, card_bytes, quantization, kv, share, held, refiner,
                      fp8_weights_config(shape.layers) if _own_fp8(quantization, requested) else None)


def smallest_card(shape: ModelShape, refiner: str, requested: Mapping[str, Any]) -> int:
    """The fewest card bytes that run one rollout of ``shape`` with ``requested`` (inf when none allowed)."""
    beside = MAIN_PROCESS + (REFINER_PEAK if refiner == "shared" else 0)
    engines = [ENGINE_OVERHEAD + _weight_bytes(shape, q, requested) + shape.stream_bytes(kv)
               for q, kv in _candidates(requested)]
    return min((max(math.ceil((beside + engine) / (1 - SHARE_STEP)), math.ceil(engine / (MAX_SHARE - SHARE_STEP)))
                for engine in engines), default=math.inf)


def _no_fit(preset: str, card_bytes: int, shape: ModelShape, refiner: str, requested: Mapping[str, Any]) -> str:
    """The line saying nothing fits ``preset``, and what would."""
    asked = {key: requested[key] for key in ("quantization", "quantization_config", "kv_cache_dtype")
             if key in requested}
    what = f"the world model ({(shape.linear_params + shape.other_params) / 1e9:.2f} B parameters"
    what += ", the refiner beside it)" if refiner == "shared" else ")"
    if asked:
        what += " with " + ", ".join(f"backend.options.{k}={v}" for k, v in asked.items())
    need = smallest_card(shape, refiner, asked)
    fits = [name for name, cap in PRESETS.items() if need <= cap and CARD_SLACK * cap <= card_bytes]
    if need > card_bytes:
        fix = f"this card ({card_bytes / GIB:.1f} GiB) cannot run it: it needs about {need / GIB:.1f} GiB"
    else:
        fix = f"use memory={fits[0] if fits else 'auto'}"
    if asked:
        fix += "; or leave those options to the preset, which picks FP8 where it must"
    if refiner == "shared":
        fix += "; or decoder=tokenizer"
    return f"{what} does not fit memory={preset}; {fix}"


__all__ = ["BF16_LAYERS", "FP8_WEIGHTS", "MEMORY", "MemoryPlan", "ModelShape", "PRESETS", "check_memory",
           "fp8_weights_config", "plan_memory", "preset_cap", "smallest_card", "tokenizer_pixels"]
