"""Several verifying passes per engine step: speculative Jacobi decoding without a host round trip per pass."""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
from vllm.v1.worker.gpu.model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from terra.vllm import compat


class ReplayedGraphs(ModelCudaGraphManager):
    """vLLM's CUDA graph manager, remembering the full graph the current step replayed (None: none)."""

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
        """Rebuild the step's attention metadata into the buffers its graph reads, as a fresh step would."""
        block_tables, slot_mappings = self.prepare_attn(input_batch)
        self.model_state.prepare_attn(input_batch, replayed.cg_mode, block_tables, slot_mappings, self.attn_groups,
                                      self.kv_cache_config)


class JacobiWorker(Worker):
    """vLLM's GPU worker with :class:`JacobiModelRunner` in place of Model Runner V2's runner."""

    def _make_model_runner(self) -> Any:  # where vLLM 0.3x builds the runner
        if self.use_v2_model_runner:
            return JacobiModelRunner(self.vllm_config, self.device)
        return super()._make_model_runner()

    def init_device(self) -> None:
        super().init_device()
        if self.use_v2_model_runner and not isinstance(self.model_runner, JacobiModelRunner):  # 0.26 builds inline
            self.model_runner = JacobiModelRunner(self.vllm_config, self.device)
