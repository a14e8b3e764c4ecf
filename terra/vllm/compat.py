"""The only place that knows how vLLM releases differ (0.26 on the GPU machine, 0.32 in CI, later ones)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import sys
from typing import Any

import vllm
from vllm.engine.arg_utils import EngineArgs

from terra.core.errors import TerraInputError

VLLM_VERSION: str = vllm.__version__


def mm_hashes(inputs: Any, model_id: str, mm_config: Any) -> dict[str, list[str]]:
    """Content hashes of a processor call's multimodal items (prefix caching keys blocks by them)."""
    params = inspect.signature(inputs.get_mm_hashes).parameters
    if len(params) >= 2:  # 0.3x: (model_id, hash_algorithm)
        return inputs.get_mm_hashes(model_id, mm_config.mm_hasher_algorithm)
    return inputs.get_mm_hashes(model_id)  # 0.26


def prompt_token_ids(prompt: str | list[int]) -> list[int]:
    """The processor's prompt as ids: 0.26 hands the dummy (profiling) prompt over as text, always ``""``."""
    if isinstance(prompt, str):
        if prompt:
            raise ValueError("the Terra world model takes token-id prompts only (it has no text tokenizer)")
        return []
    return list(prompt)


def supported_engine_kwargs(**optional: Any) -> dict[str, Any]:
    """Keep the optional engine arguments this vLLM release knows (others are silently left out)."""
    known = {f.name for f in dataclasses.fields(EngineArgs)}
    return {k: v for k, v in optional.items() if k in known}


ENGINE_EXIT_S = 60.0  # how long vLLM's engine processes may take to exit on shutdown before vLLM kills them


def set_worker_environment() -> None:
    """Make vLLM spawn (not fork) its engine processes and give them time to exit on their own at shutdown, unless
    the user chose otherwise."""
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(int(ENGINE_EXIT_S / 2)))


def shutdown_engine(engine: Any) -> None:
    """Shut an engine's processes down, waiting up to :data:`ENGINE_EXIT_S` where vLLM allows."""
    if "timeout" in inspect.signature(engine.shutdown).parameters:
        engine.shutdown(timeout=ENGINE_EXIT_S)
    else:
        engine.shutdown()


def has_streaming_input() -> bool:
    """True when this vLLM release takes streaming-input requests."""
    try:
        from vllm.engine.protocol import StreamingInput  # noqa: F401
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:
        return False
    return hasattr(AsyncLLM, "_add_streaming_input_request")


def request_path(requests: str) -> str:
    """The request path ``backend.options.requests`` stands for on this release."""
    if requests == "per_frame":
        return requests
    if has_streaming_input():
        return "streaming"
    if requests == "streaming":
        raise TerraInputError(f"backend.options.requests=streaming needs vLLM's streaming-input requests, which "
                              f"vLLM {VLLM_VERSION} lacks; use requests=per_frame (or auto)")
    return "per_frame"


def reseed_streaming_updates() -> None:
    """Make the V1 model runner reseed a streaming request's sampler from each input chunk's parameters."""
    runner = sys.modules.get("vllm.v1.worker.gpu_model_runner")
    cls = getattr(runner, "GPUModelRunner", None)
    update = getattr(cls, "_update_streaming_request", None)
    if update is None or getattr(update, "terra_reseeds", False):
        return
    import torch
    from vllm.sampling_params import SamplingType

    def reseeding_update(self, req_id, new_req_data):
        state = update(self, req_id, new_req_data)
        params = state.sampling_params
        state.generator = None
        if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
            state.generator = torch.Generator(device=self.device)
            state.generator.manual_seed(params.seed)
        return state

    reseeding_update.terra_reseeds = True
    cls._update_streaming_request = reseeding_update


def jacobi_unavailable() -> str | None:
    """Why this vLLM cannot decode speculatively here, in words (None: it can)."""
    from vllm.triton_utils import HAS_TRITON

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("0", "false"):
        return "VLLM_USE_V2_MODEL_RUNNER=0 is set, and only vLLM's Model Runner V2 runs it"
    if not HAS_TRITON:
        return f"vLLM {VLLM_VERSION} has no Model Runner V2 here (it needs Triton)"
    if not supported_engine_kwargs(diffusion_config={}):
        return f"vLLM {VLLM_VERSION} has no diffusion_config draft slots"
    return None


PASSES_PER_STEP = "terra_passes_per_step"  # the key of vLLM's additional_config that jacobi_runner reads
JACOBI_WORKER = "terra.vllm.jacobi_runner.JacobiWorker"


def jacobi_engine_kwargs(draft_tokens: int, passes_per_step: int = 1) -> dict[str, Any]:
    """Engine arguments for ``draft_tokens`` (>= 1) draft slots a request and ``passes_per_step`` verifying passes a
        step."""
    why = jacobi_unavailable()
    if why:
        raise TerraInputError(f"sampling.decoding=speculative: {why}; use sampling.decoding=sequential, or "
                              "backend=hf")
    kwargs: dict[str, Any] = {"diffusion_config": {"canvas_length": int(draft_tokens)}}
    if passes_per_step > 1:
        kwargs.update(worker_cls=JACOBI_WORKER, additional_config={PASSES_PER_STEP: int(passes_per_step)})
    return kwargs


def engine_passes_per_step(vllm_config: Any) -> int:
    """The verifying passes a started engine runs per full-graph decode step (1: vLLM's one)."""
    return int((vllm_config.additional_config or {}).get(PASSES_PER_STEP, 1))


def embed_inputs_again(runner: Any, input_batch: Any) -> None:
    """Recompute the step's input embeddings into the buffer the runner's CUDA graph reads."""
    if not runner.supports_mm_inputs:
        return
    state = runner.model_state
    embed = getattr(state, "prepare_inputs_embeds", None) or state.get_mm_embeddings
    embed({}, input_batch, runner.req_states)


def engine_draft_tokens(vllm_config: Any) -> int:
    """The ``draft_tokens`` a started engine schedules per request and step (0: no Jacobi drafts)."""
    return 0 if vllm_config.speculative_config is not None else int(vllm_config.num_speculative_tokens or 0)


def jacobi_graph_kwargs(draft_tokens: int, streams: int, passes_per_step: int = 1) -> dict[str, Any]:
    """Engine arguments that run a step of up to ``streams`` rollouts of ``draft_tokens + 1`` tokens as one CUDA
    graph."""
    tokens = int(streams) * (int(draft_tokens) + 1)
    # vLLM captures 8, 16, 24, ... tokens below 256 and every 16 above, and truncates a largest size between two of
    # them to the one below: 33 would become 32 and leave one rollout's step without a graph
    graphs = {"compilation_config": {"cudagraph_mode": "FULL"}, "max_cudagraph_capture_size": -(-tokens // 16) * 16}
    if int(streams) > 1 or int(passes_per_step) == 1:
        graphs.update(supported_engine_kwargs(attention_config={"flash_attn_max_num_splits_for_cuda_graph": 1}))
    return graphs


def check_jacobi_engine(vllm_config: Any) -> None:
    """Fail with one line when a started engine will not run the draft slots through the Jacobi model state."""
    if not vllm_config.use_v2_model_runner:
        raise TerraInputError("speculative decoding needs vLLM's Model Runner V2, and this engine chose the V1 "
                              "runner (see vLLM's log for why); use sampling.decoding=sequential")
    if not vllm_config.scheduler_config.async_scheduling:
        raise TerraInputError("speculative decoding needs asynchronous scheduling; remove async_scheduling=false "
                              "from the engine options or use sampling.decoding=sequential")


def num_cached_tokens(request_output: Any) -> int:
    """Prompt tokens served from the prefix cache for one finished request (0 when not reported)."""
    return int(getattr(request_output, "num_cached_tokens", None) or 0)
