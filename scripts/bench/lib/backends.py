"""The backend each part measures: Transformers, Terra on vLLM or the plain-Llama baseline, with its engine settings."""

from __future__ import annotations

import argparse

import torch

from bench.lib.models import DUMMY_WEIGHTS, model_dirs, read_config
from bench.lib.parts import Part
from bench.lib.plain_llama import PlainLlamaBackend
from terra.generation.backends import model_backend
from terra.generation.rollout import WorldModelBackend
from terra.generation.vllm_backend import VLLMBackend
from terra.generation.vllm_streaming import StreamingVLLMBackend
from terra.models.modeling_llama_action import LlamaActionForCausalLM


def memory_share(part: Part, args: argparse.Namespace) -> float:
    """vLLM's ``gpu_memory_utilization`` for a part: its own on a GPU when it sets one, else the command line's."""
    if args.device.startswith("cuda") and part.gpu_memory_utilization is not None:
        return part.gpu_memory_utilization
    return args.gpu_memory_utilization


def engine_settings(part: Part, args: argparse.Namespace) -> dict:
    """The vLLM engine arguments of a part: the command line's dtype and sizes, the part's own settings, and
    ``--engine-arg`` over those (e.g. ``kv_cache_dtype=fp8`` for a part that runs a bf16 KV cache by default)."""
    own = dict(enforce_eager=part.enforce_eager, enable_prefix_caching=True, kv_cache_dtype=part.kv_cache_dtype)
    return dict(dtype=args.dtype, max_num_seqs=args.max_num_seqs, gpu_memory_utilization=memory_share(part, args),
                **{**own, **args.engine_kwargs})


def build_backend(part: Part, args: argparse.Namespace) -> WorldModelBackend:
    """The backend of one part, with random weights unless ``--model``."""
    terra_dir, plain_dir = model_dirs(args)
    kind = {"vllm": "terra", "hf": "hf"}[args.e2e_backend] if part.backend == "e2e" else part.backend
    if kind == "hf":
        dtype = getattr(torch, args.dtype)
        if args.model:
            return model_backend(args.model, device=args.device, dtype=dtype)
        torch.manual_seed(0)
        with torch.device(args.device):  # random init straight on the GPU: no 8 GB fp32 copy on the host
            model = LlamaActionForCausalLM._from_config(read_config(args), dtype=dtype)
        return model_backend(model, device=args.device, dtype=dtype)
    engine = engine_settings(part, args)
    if kind == "plain":  # always random weights: speed does not depend on their values
        return PlainLlamaBackend(str(plain_dir), read_config(args), **DUMMY_WEIGHTS, **engine)
    terra = StreamingVLLMBackend if args.requests == "streaming" else VLLMBackend  # --requests
    return terra(str(terra_dir), **({} if args.model else DUMMY_WEIGHTS), **engine)
