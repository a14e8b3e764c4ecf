"""The benchmark's configurations ("parts"): which backend each one builds and which measurements it runs."""

from __future__ import annotations

from dataclasses import dataclass

from terra.config.sampling import SamplingConfig

SAMPLING = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)  # temperature 1 over the full image codebook
GREEDY = SamplingConfig(temperature=0.0)


@dataclass(frozen=True)
class Part:
    """One configuration: which backend, its engine settings and which measurements run on it."""

    backend: str  # "hf", "terra" (our vLLM backend), "plain" (vLLM's LlamaForCausalLM) or "e2e" (--e2e-backend)
    description: str
    single: bool = False  # single stream: --context frames -> --single-frames (--hf-frames for hf)
    batch_sizes: str = ""  # "" | "batch" (--batch-sizes) | "compare" (--compare-batch-sizes)
    greedy: bool = False  # one greedy rollout, kept for the FP8 agreement
    enforce_eager: bool = False
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None  # overrides --gpu-memory-utilization on a GPU
    profile: bool = False  # per-step CPU/GPU breakdown of a single-stream frame; runs vLLM's engine core in-process
    boundary: bool = False  # where a batched run's time goes (frame boundaries included); engine core in-process

    @property
    def in_process(self) -> bool:
        """Its engine core runs in the measuring process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), to be timed."""
        return self.profile or self.boundary


PARTS: dict[str, Part] = {
    "hf": Part("hf", "Transformers, KV-cached frame loop", single=True),
    "vllm": Part("terra", "vLLM, CUDA graphs + prefix cache", single=True),
    "eager": Part("terra", "vLLM, enforce_eager + prefix cache", single=True, enforce_eager=True),
    "plain": Part("plain", "vLLM plain Llama (no actions/pos-emb)", single=True, batch_sizes="compare"),
    "batched": Part("terra", "vLLM, CUDA graphs, bf16 KV", batch_sizes="batch", greedy=True),
    "fp8": Part("terra", "vLLM, CUDA graphs, FP8 KV", batch_sizes="compare", greedy=True, kv_cache_dtype="fp8"),
    "profile": Part("terra", "vLLM, engine core in-process, profiled", single=True, profile=True),
    "boundary": Part("terra", "vLLM, engine core in-process, a batched run's time split", boundary=True),
    # The tokenizer shares the GPU with the engine; one rollout's KV cache needs well under 1 GB.
    "e2e": Part("e2e", "pipeline: encode + generate + decode + MP4", gpu_memory_utilization=0.5),
}
