"""Several verifying passes per engine step: speculative Jacobi decoding without a host round trip per pass.

A step of Model Runner V2 costs the host its scheduling, input preparation and output handling, and with
:mod:`terra.vllm.jacobi_state` every step is one verifying pass: where a pass's GPU work is shorter than the host's
part of a step (the demo model; one AlpaSim session), the GPU waits on the host (benchmarks/decoding.md,
"Several passes a step"). Here a step whose batch replays a full CUDA graph (every request decoding ``draft_tokens`` + 1
tokens: one stream, sessions, a batch between prompts) runs ``passes_per_step`` passes over the same positions
before vLLM samples it: after each pass :meth:`JacobiSampler.iterate_block` rewrites the fed guesses with the
block's next Jacobi iterate (each guess the draw of the row before it), the input embeddings and the attention
metadata are rebuilt as the step built them, and the captured graph is replayed again; the step's last pass goes
to vLLM's own sampling, which accepts and emits as before. Everything is queued on the GPU's stream with no host
sync between the passes.

Why it is exact: the positions, their Gumbel noise (keyed by the request's seed and the position), the attention
metadata and the KV slots are the step's own; each pass rewrites the KV of the block's positions from the tokens it
was fed. The step's last pass is an ordinary verifying pass over guesses that happen to be better, so the rule's
argument (terra/generation/speculative.py) holds unchanged: every emitted token is the one sequential decoding draws
there. After ``m`` passes a request's block holds at least ``m`` of sequential decoding's tokens, so a step emits
at least ``min(m, block)`` tokens, where one pass emits at least one. A step that replays no full graph, or holds a
frame's prompt, runs one pass, as vLLM would.

vLLM builds this runner through the engine's ``worker_cls`` (:class:`JacobiWorker`; terra/vllm/compat.py,
``jacobi_engine_kwargs``, sets it only for ``passes_per_step`` > 1) and reads ``passes_per_step`` from its
``additional_config`` (``compat.engine_passes_per_step``). Imported only in vLLM's worker process.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
from vllm.v1.worker.gpu.model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from terra.vllm import compat


class ReplayedGraphs(ModelCudaGraphManager):
    """vLLM's CUDA graph manager that remembers the full graph the current step replayed (None: the step ran
    without one), so that the step can replay it again."""

    replayed: Any = None

    def run_fullgraph(self, desc: Any) -> Any:
        self.replayed = desc
        return super().run_fullgraph(desc)


class JacobiModelRunner(GPUModelRunner):
    """Model Runner V2 running ``passes_per_step`` verifying passes in each full-graph decode step."""

    def __init__(self, vllm_config: Any, device: torch.device) -> None:
        super().__init__(vllm_config, device)
        self.passes_per_step = compat.engine_passes_per_step(vllm_config)

    def initialize_kv_cache(self, *args: Any, **kwargs: Any) -> Any:
        result = super().initialize_kv_cache(*args, **kwargs)
        if self.cudagraph_manager is not None:  # built here by vLLM; the same object, told to remember its replays
            self.cudagraph_manager.__class__ = ReplayedGraphs
        return result

    def execute_model(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.cudagraph_manager, ReplayedGraphs):
            self.cudagraph_manager.replayed = None
        return super().execute_model(*args, **kwargs)

    def sample(self, hidden_states: torch.Tensor, input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        replayed = getattr(self.cudagraph_manager, "replayed", None)
        # a frame's prompt in the batch would be recomputed by every pass (the same KV): such a step runs one
        if replayed is not None and input_batch.num_draft_tokens and not input_batch.is_prefilling_np.any():
            for _ in range(self.passes_per_step - 1):
                logits = self.model.compute_logits(hidden_states[input_batch.logits_indices])
                self.sampler.iterate_block(logits, input_batch)
                compat.embed_inputs_again(self, input_batch)
                self.prepare_attention_again(input_batch, replayed)
                hidden_states = self.cudagraph_manager.run_fullgraph(replayed)
        return super().sample(hidden_states, input_batch, *args, **kwargs)

    def prepare_attention_again(self, input_batch: Any, replayed: Any) -> None:
        """Rebuild the step's attention metadata into the buffers its graph reads, as ``execute_model`` built it, so
        that every replay reads what a fresh step would: FlashAttention 3's scheduler metadata carries a tile-count
        semaphore that its kernels consume. Measured on an H200: one request's graph replayed equal without it; the
        padded steps' exactness (benchmarks/decoding.md, "Several passes a step") was measured with it."""
        block_tables, slot_mappings = self.prepare_attn(input_batch)
        self.model_state.prepare_attn(input_batch, replayed.cg_mode, block_tables, slot_mappings, self.attn_groups,
                                      self.kv_cache_config)


class JacobiWorker(Worker):
    """vLLM's GPU worker with :class:`JacobiModelRunner` in place of Model Runner V2's own runner (the V1 runner is
    left alone: compat.check_jacobi_engine refuses it once the engine has started)."""

    def _make_model_runner(self) -> Any:  # where vLLM 0.3x builds the runner
        if self.use_v2_model_runner:
            return JacobiModelRunner(self.vllm_config, self.device)
        return super()._make_model_runner()

    def init_device(self) -> None:
        super().init_device()
        if self.use_v2_model_runner and not isinstance(self.model_runner, JacobiModelRunner):  # 0.26 builds inline
            self.model_runner = JacobiModelRunner(self.vllm_config, self.device)


__all__ = ["JacobiModelRunner", "JacobiWorker", "ReplayedGraphs"]
