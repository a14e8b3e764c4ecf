"""The vLLM backend: many rollouts on one vLLM engine, each request the frames of a window whose actions are known."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.decoding import backend_guesses
from terra.contract.layout import TokenLayout
from terra.generation.resolve import DEFAULT_ROLLOUTS
from terra.generation.rollout import FrameDone, RolloutRequest, RolloutState, WorldModelBackend
from terra.vllm import FUTURE_SLOTS


GRAPH_STREAMS = 64  # speculative decoding: the most rollouts whose decode step is captured as one full CUDA graph


def kv_capacity(blocks: int, block_size: int, window_tokens: int, max_num_seqs: int) -> int:
    """Sequences of ``window_tokens`` a KV cache holds at once without preemption, in ``[1, max_num_seqs]``."""
    return max(1, min(blocks // -(-window_tokens // block_size), max_num_seqs))


@dataclass
class _Request:
    """An engine request in flight: ``frames`` frames of ``state`` after a prompt of ``prompt_tokens``."""

    state: RolloutState
    prompt_tokens: int
    window_start: bool
    frames: int
    tokens: list[int] = field(default_factory=list)  # image codes and slot placeholders so far
    emitted: int = 0  # frames handed back
    steps: int = 0  # engine steps since the last frame handed back


@dataclass(frozen=True)
class FrameStat:
    rollout: int  # index of the request in the generate() call
    frame: int  # index of the generated frame within that rollout
    prompt_tokens: int  # prompt length submitted
    cached_tokens: int  # prompt tokens served from the prefix cache
    window_start: bool  # first frame of a window (fresh prompt, nothing to reuse but shared contexts)

    @property
    def computed_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens

    @property
    def hit_rate(self) -> float:
        """Share of the prompt served from the cache; a frame that continues its request has no prompt (1.0)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 1.0


def request_seed(state: RolloutState, position_keyed: bool) -> int:
    key = state.window_index if position_keyed else state.next_frame - state.num_context
    return int(np.random.SeedSequence([state.seed, key]).generate_state(1)[0] & 0x7FFFFFFF)


def cpu_whole_prompts(window_positions: int) -> dict[str, Any]:
    """Engine arguments that keep every prompt whole within one step, for vLLM's CPU engine."""
    from vllm.config import SchedulerConfig

    return {"enable_chunked_prefill": False,
            "max_num_batched_tokens": max(window_positions, SchedulerConfig.DEFAULT_MAX_NUM_BATCHED_TOKENS)}


class VLLMBackend(WorldModelBackend):
    """Terra's world model on a vLLM engine (the plugin in :mod:`terra.vllm.plugin` makes vLLM know it)."""

    name = "vLLM"

    def __init__(
        self,
        model_path: str,
        dtype: str = "auto",
        max_num_seqs: int = DEFAULT_ROLLOUTS,
        gpu_memory_utilization: float | None = None,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
        tensor_parallel_size: int = 1,
        seed: int = 0,
        config: Any = None,
        draft_tokens: int = 0,
        passes_per_step: int = 1,
        **engine_kwargs: Any,
    ) -> None:
        from transformers import AutoConfig
        from vllm.platforms import current_platform

        from terra.vllm import compat

        try:  # ``config``, when given, is the already-read LlamaActionConfig (vLLM's engine reads its own)
            config = config or AutoConfig.from_pretrained(model_path)
        except (OSError, ValueError) as err:
            raise TerraInputError(f"cannot read a world model config from {model_path!r} ({err}); "
                                  "pass a folder with Terra's config.json and safetensors") from err
        if getattr(config, "model_type", None) != "llama_action":
            raise TerraInputError(
                f"{model_path!r} holds a {getattr(config, 'model_type', '?')!r} model, not a Terra world model "
                "(model_type llama_action); pass the world model's folder"
            )
        self.layout = TokenLayout.from_config(config)
        self.draft_tokens = draft_tokens  # guesses per request and step; 0: sequential decoding
        self.passes_per_step = passes_per_step if draft_tokens else 1  # verifying passes per full-graph decode step
        self.model_path = model_path
        self.seed = seed
        self.max_num_seqs = max_num_seqs
        self.frame_stats: list[FrameStat] = []
        options = {**compat.supported_engine_kwargs(generation_config="vllm"), **engine_kwargs}
        if gpu_memory_utilization is None:
            gpu_memory_utilization = 0.1 if current_platform.is_cpu() else 0.9
        if current_platform.is_cpu():
            options = {**cpu_whole_prompts(self.layout.window_positions), **options}
        if draft_tokens:  # the draft slots; full CUDA graphs of the verifying step unless the options say
            options.update(compat.jacobi_engine_kwargs(draft_tokens, self.passes_per_step))
            graphs = compat.jacobi_graph_kwargs(draft_tokens, min(max_num_seqs, GRAPH_STREAMS), self.passes_per_step)
            options = {**graphs, **options}
        if getattr(config, "zero_embed_code_0", False):  # the engine reads config.json itself
            options["hf_overrides"] = {**options.get("hf_overrides", {}), "zero_embed_code_0": True}
        compat.set_worker_environment()
        self._cached_tokens = compat.num_cached_tokens
        self._ids = itertools.count()
        self._pending: dict[str, _Request] = {}
        self._start_engine(dict(
            model=model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=self.layout.window_positions,
            max_num_seqs=max_num_seqs,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            **self.prompt_limits(),
            **options,
        ))
        if draft_tokens:
            try:
                compat.check_jacobi_engine(self.engine.vllm_config)
            except TerraInputError:
                self.close()
                raise
        # Model Runner V2 asks the model for its sampler and state, which generate a window's known frames as one
        # request and key draws by position; the V1 runner, one request a frame, draws from a seeded generator
        self.position_keyed = bool(getattr(self.engine.vllm_config, "use_v2_model_runner", False))

    def _start_engine(self, engine_args: dict[str, Any]) -> None:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.llm_engine import LLMEngine

        args = EngineArgs(**{"disable_log_stats": True, **engine_args})
        self.engine = LLMEngine.from_engine_args(args, usage_context=UsageContext.LLM_CLASS)

    @property
    def decoding(self) -> str:
        return "speculative" if self.draft_tokens else "sequential"

    def as_run(self, sampling: SamplingConfig) -> SamplingConfig:
        """The engine's decoding, whatever ``sampling`` asks (fixed when the engine starts)."""
        sampling = sampling.replace(decoding=self.decoding, draft_tokens=self.draft_tokens or sampling.draft_tokens)
        return sampling.replace(guesses=backend_guesses("vllm", sampling.decoding, sampling.guesses))

    def prompt_limits(self) -> dict[str, Any]:
        """Engine arguments the prompts of :meth:`frame_prompt` need: room for one slots item per frame."""
        return {"limit_mm_per_prompt": {"actions": self.layout.max_frames}}

    def frame_prompt(self, state: RolloutState, frames: int = 1) -> dict[str, Any]:
        """The engine prompt of a rollout's next ``frames`` frames: the window's token ids and one ``"actions"`` item a
        frame."""
        ids, _, _ = state.prompt()
        items = state.conditions[state.window.start : state.next_frame + frames - 1]
        return {"prompt_token_ids": ids, "multi_modal_data": {"actions": np.ascontiguousarray(items, np.float32)}}

    def _sampling_params(self, sampling: SamplingConfig, state: RolloutState, delta: bool = False, frames: int = 1):
        """Parameters of ``state``'s next ``frames`` frames, seeded unless greedy."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        layout = self.layout
        extra = None
        if frames > 1:
            start = state.next_frame
            extra = {FUTURE_SLOTS: {"first": start - state.window.start,
                                    "values": state.conditions[start : start + frames - 1].tolist()}}
        return SamplingParams(
            temperature=sampling.temperature,
            top_k=sampling.top_k,  # 0 = off, as in SamplingConfig
            top_p=sampling.top_p,
            seed=None if sampling.greedy else request_seed(state, self.position_keyed),
            max_tokens=frames * layout.frame_span - layout.slot_tokens,
            ignore_eos=True,
            detokenize=False,
            extra_args=extra,
            output_kind=RequestOutputKind.DELTA if delta or frames > 1 or self.draft_tokens
            else RequestOutputKind.FINAL_ONLY,
        )

    def default_seed(self, request: RolloutRequest, index: int) -> int:
        return request.seed if request.seed is not None else self.seed + index

    def capacity(self, window_frames: int) -> int | None:
        """Rollouts of ``window_frames`` frames the KV cache holds at once (None: vLLM does not report its cache
        size)."""
        config = self.engine.vllm_config
        cache = getattr(config, "cache_config", None)
        blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
        if not blocks or not block_size:
            return None
        seqs = getattr(getattr(config, "scheduler_config", None), "max_num_seqs", None) or int(blocks)
        return kv_capacity(int(blocks), int(block_size), window_frames * self.layout.frame_span, int(seqs))

    def _request(self, state: RolloutState, sampling: SamplingConfig, frames: int) -> int:
        frames = min(frames, state.window.end - state.next_frame) if self.position_keyed else 1
        prompt = self.frame_prompt(state, frames)
        request_id = f"terra-{next(self._ids)}"
        self.engine.add_request(request_id, prompt, self._sampling_params(sampling, state, frames=frames))
        self._pending[request_id] = _Request(state, len(prompt["prompt_token_ids"]), state.window_starts, frames)
        return frames

    @property
    def num_queued(self) -> int:
        return len(self._pending)

    def _poll(self) -> list[FrameDone]:
        """One engine step; the frames it finished."""
        done = []
        span, image = self.layout.frame_span, self.layout.image_tokens
        for output in self.engine.step():
            request = self._pending.get(output.request_id)
            if request is None:
                continue
            request.tokens += output.outputs[0].token_ids
            request.steps += 1
            while len(request.tokens) >= request.emitted * span + image:
                start = request.emitted * span
                codes = np.asarray(request.tokens[start : start + image], dtype=np.int64)
                first = not request.emitted
                # speculative: the prompt's step is one pass, a decode step passes_per_step (one that shared its
                # step with another request's prompt ran one: counted high there); sequential: one a token
                passes = request.steps * self.passes_per_step - first * (self.passes_per_step - 1) \
                    if self.draft_tokens else None
                request.emitted, request.steps = request.emitted + 1, 0
                request.state.add_frame(codes, passes=passes)
                cached = self._cached_tokens(output) if first else 0
                done.append(FrameDone(request.state, codes, request.prompt_tokens if first else 0, cached,
                                      request.window_start and first))
            if request.emitted == request.frames:
                del self._pending[output.request_id]
        return done

    def _cancel(self, states: Sequence[RolloutState]) -> None:
        drop = {id(s) for s in states}
        ids = [request_id for request_id, request in self._pending.items() if id(request.state) in drop]
        if ids:
            self.engine.abort_request(ids)
        for request_id in ids:
            del self._pending[request_id]

    def record(self, done: FrameDone, rollout: int) -> None:
        self.frame_stats.append(FrameStat(rollout, done.state.num_generated - 1, done.prompt_tokens, done.cached_tokens,
                                          done.window_start))

    def close(self) -> None:
        from terra.vllm import compat

        core = getattr(getattr(self, "engine", None), "engine_core", None)
        if core is not None:
            compat.shutdown_engine(core)
        self.engine = None
