"""GPU check of the vLLM backend: it starts with CUDA graphs, matches the Transformers reference.

Builds a small random world model with Terra's frame layout (576 image tokens + 6 action slots, vocab 4097),
then in one process:

1. vLLM backend in fp32 with CUDA graphs (not eager) vs the Transformers backend in fp32: greedy token
   agreement over several rollouts with different actions, long enough to roll over into a second window;
2. the same in bf16 (agreement with the fp32 reference and with Transformers in bf16), plus the largest
   logit difference between bf16 and fp32 in the Transformers model on one full prompt (how far bf16 moves
   logits, which explains any disagreement);
3. the prefix-cache hit rate of every frame request.

Writes everything as JSON to ``--out``. ``--device cpu`` runs a smaller layout on vLLM's CPU engine.

    python scripts/checks/check_vllm_gpu.py --out outputs/check_vllm_gpu.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
import vllm
from transformers import AutoModelForCausalLM

from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.core.atomic import json_text, write_text
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest, RolloutState
from terra.generation.vllm_backend import VLLMBackend
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.core.device import resolve_device
from terra.models.presets import SMALL, TINY

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, exit_2_on_input_error, in_range  # noqa: E402

# Terra's frame layout on a small decoder (GPU) / a tiny one (CPU engine: 2 cores in CI).
SHAPES = {"cuda": SMALL, "cpu": TINY}


def build_model(device: str, directory: Path, seed: int = 0) -> Path:
    """Random world model (fp32 weights) saved as safetensors; position/action weights scaled so they matter."""
    torch.manual_seed(seed)
    config = LlamaActionConfig(**SHAPES[device])
    model = LlamaActionForCausalLM(config).eval()
    with torch.no_grad():
        model.pos_embedding_spatio_temporal.spatio_embeddings.weight.normal_(0, 1.0)
        model.pos_embedding_spatio_temporal.temporal_embeddings.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.5)
        model.action_projection.weight.normal_(0, 3.0)  # strong enough that different actions change frames
    model.save_pretrained(directory)
    return directory


def make_requests(layout: TokenLayout, rollouts: int, context: int, frames: int) -> list[RolloutRequest]:
    """Rollouts sharing one random context, each with its own random actions."""
    rng = np.random.default_rng(0)
    codes = rng.integers(0, layout.codebook_size, (context, layout.image_tokens))
    steps = context + frames - 1
    return [
        RolloutRequest(codes, rng.normal(0, 2, (steps, layout.action_tokens, 3)).astype(np.float32), frames, seed=i)
        for i in range(rollouts)
    ]


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
    """Share of equal tokens, and the first differing token of each rollout (None when identical)."""
    flat_a, flat_b = np.concatenate([x.ravel() for x in a]), np.concatenate([x.ravel() for x in b])
    first = [int(np.flatnonzero(x.ravel() != y.ravel())[0]) if not np.array_equal(x, y) else None for x, y in zip(a, b)]
    return {"token_agreement": float((flat_a == flat_b).mean()), "first_difference": first}


def run_vllm(path: Path, dtype: str, requests: list[RolloutRequest], device: str, args: argparse.Namespace) -> dict:
    """Generate greedily on a fresh engine; return codes, timings and per-frame prefix-cache use."""
    extra = dict(block_size=32, kv_cache_memory_bytes=256 << 20) if device == "cpu" else {}
    start = time.perf_counter()
    backend = VLLMBackend(str(path), dtype=dtype, max_num_seqs=16, gpu_memory_utilization=args.gpu_memory_utilization,
                          enforce_eager=False, **extra)
    startup = time.perf_counter() - start
    config = backend.engine.vllm_config
    engine = {
        "cudagraph_mode": str(getattr(config.compilation_config, "cudagraph_mode", "?")),
        "async_scheduling": getattr(config.scheduler_config, "async_scheduling", None),
        "block_size": config.cache_config.block_size,
        "prefix_caching": config.cache_config.enable_prefix_caching,
    }
    try:
        start = time.perf_counter()
        codes = backend.generate(requests, SamplingConfig(temperature=0), progress=False)
        seconds = time.perf_counter() - start
        stats = [asdict(s) | {"hit_rate": s.hit_rate} for s in backend.frame_stats]
    finally:
        backend.close()
    later = [s["hit_rate"] for s in stats if not s["window_start"]]
    return {
        "codes": codes,
        "engine": engine,
        "startup_s": startup,
        "generate_s": seconds,
        "frames_per_s": sum(len(c) for c in codes) / seconds,
        "frame_stats": stats,
        "min_hit_rate_growing_prompt": min(later) if later else None,
        "max_tokens_recomputed_growing_prompt": max(
            (s["prompt_tokens"] - s["cached_tokens"] for s in stats if not s["window_start"]), default=None
        ),
    }


def run_hf(path: Path, dtype: torch.dtype, requests: list[RolloutRequest], device: str) -> dict[str, Any]:
    """Generate greedily with the Transformers backend (the reference); return codes and seconds."""
    backend = model_backend(str(path), device=device, dtype=dtype)
    start = time.perf_counter()
    codes = backend.generate(requests, SamplingConfig(temperature=0), progress=False)
    seconds = time.perf_counter() - start
    del backend
    return {"codes": codes, "generate_s": seconds}


@torch.no_grad()
def bf16_logit_difference(path: Path, request: RolloutRequest, codes: np.ndarray, device: str) -> dict:
    """Teacher-forced logits of one full first window in fp32 vs bf16 (Transformers model, image codebook only)."""
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()
    layout = TokenLayout.from_config(model.config)
    state = RolloutState(request, layout)
    for frame in codes[: state.window.num_new - 1]:
        state.add_frame(frame)
    ids, conditions, positions = state.prompt()
    inputs = dict(
        input_ids=torch.tensor([ids], device=device),
        conditions=torch.from_numpy(conditions).to(device).reshape(1, -1, 3),
        position_ids=torch.from_numpy(positions).to(device)[None],
    )
    fp32 = model(**inputs).logits[0, :, : layout.codebook_size].float()
    bf16 = model.to(torch.bfloat16)(**inputs).logits[0, :, : layout.codebook_size].float()
    return {
        "positions": len(ids),
        "max_abs_logit_diff": float((fp32 - bf16).abs().max()),
        "mean_abs_logit_diff": float((fp32 - bf16).abs().mean()),
        "argmax_agreement": float((fp32.argmax(-1) == bf16.argmax(-1)).float().mean()),
    }


def print_cache_stats(stats: list[dict]) -> None:
    """One line per frame request: prompt tokens, tokens served from the prefix cache."""
    for s in stats:
        print(f"  rollout {s['rollout']} frame {s['frame']}: prompt {s['prompt_tokens']}, cached {s['cached_tokens']} "
              f"({s['hit_rate']:.1%}){' [window start]' if s['window_start'] else ''}")


def main(argv: list[str] | None = None) -> None:
    """Run the checks and write their results to ``--out``."""
    window = min(shape["num_temporal_embeddings"] for shape in SHAPES.values())
    parser = Parser("check_vllm_gpu", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write the results to")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rollouts", type=in_range(int, 1, 256), default=3)
    parser.add_argument("--context", type=in_range(int, 1, window - 1), default=2,
                        help=f"context frames (the check's models' window: {window})")
    parser.add_argument("--frames", type=in_range(int, 1, 1000), default=5,
                        help="generated frames per rollout (5 crosses a window)")
    parser.add_argument("--gpu-memory-utilization", type=in_range(float, 0, 1, above=True), default=None)
    parser.add_argument("--skip-bf16", action="store_true")
    args = parser.parse_args(argv)
    resolve_device(args.device)
    check_output(args.out, "--out")
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.3 if args.device == "cuda" else 0.1

    results: dict = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() or "cpu",
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "shape": SHAPES[args.device],
        "rollouts": args.rollouts,
        "context_frames": args.context,
        "generated_frames": args.frames,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.device, Path(tmp) / "model")
        layout = TokenLayout.from_config(LlamaActionConfig.from_pretrained(path))
        requests = make_requests(layout, args.rollouts, args.context, args.frames)

        hf32 = run_hf(path, torch.float32, requests, args.device)
        try:
            vl32 = run_vllm(path, "float32", requests, args.device, args)
            results["fp32"] = {
                "vllm_vs_hf": agreement(vl32["codes"], hf32["codes"]),
                "hf_generate_s": hf32["generate_s"],
                **{k: v for k, v in vl32.items() if k != "codes"},
            }
            print(f"fp32: vLLM vs Transformers greedy agreement {results['fp32']['vllm_vs_hf']['token_agreement']:.4%}")
            print_cache_stats(results["fp32"]["frame_stats"])
        except Exception as err:  # keep going: the bf16 half of the check is still worth having
            results["fp32"] = {"error": f"{type(err).__name__}: {err}"}
            print(f"fp32 vLLM run failed: {results['fp32']['error']}")
        if not args.skip_bf16:
            hf16 = run_hf(path, torch.bfloat16, requests, args.device)
            results["bf16"] = {
                "hf_bf16_vs_hf_fp32": agreement(hf16["codes"], hf32["codes"]),
                "hf_logits_bf16_vs_fp32": bf16_logit_difference(path, requests[0], hf32["codes"][0], args.device),
                "hf_generate_s": hf16["generate_s"],
            }
            try:
                vl16 = run_vllm(path, "bfloat16", requests, args.device, args)
                results["bf16"].update(
                    vllm_vs_hf_bf16=agreement(vl16["codes"], hf16["codes"]),
                    vllm_bf16_vs_hf_fp32=agreement(vl16["codes"], hf32["codes"]),
                    **{k: v for k, v in vl16.items() if k != "codes"},
                )
                print(f"bf16: vLLM vs Transformers(bf16) {results['bf16']['vllm_vs_hf_bf16']['token_agreement']:.4%}, "
                      f"vs fp32 reference {results['bf16']['vllm_bf16_vs_hf_fp32']['token_agreement']:.4%}")
                print_cache_stats(results["bf16"]["frame_stats"])
            except Exception as err:
                results["bf16"]["error"] = f"{type(err).__name__}: {err}"
                print(f"bf16 vLLM run failed: {results['bf16']['error']}")
            print(f"bf16 vs fp32 in Transformers: max |logit| change "
                  f"{results['bf16']['hf_logits_bf16_vs_fp32']['max_abs_logit_diff']:.4f}")

    write_text(args.out, json_text(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("check_vllm_gpu")(main)())
