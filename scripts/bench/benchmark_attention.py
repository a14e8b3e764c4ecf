#!/usr/bin/env python
"""Decode attention of Terra's world model over vLLM's paged KV cache, by page size: the kernel that bounds a batch.

A batched ACT-Bench run keeps hundreds of rollouts in one engine; each decode step reads every rollout's window
so far from the KV cache, once per layer. This times that read alone with vLLM's FlashAttention-3 kernel (the one
its FLASH_ATTN backend calls): ``--rollouts`` sequences of one query token each, their cached lengths spread
evenly over a window (3 context frames to 25 frames of Terra's 582 positions, as rollouts at every point of their
window), Terra's heads (32 query, 4 KV, 64 wide), pages in shuffled order (a long-running cache), for every page
size in ``--page-sizes``, KV dtype in ``--kv-dtypes`` and FA3 split setting in ``--splits`` (0: FA3's own
heuristic; n: at most n, vLLM's cap of 32 under full CUDA graphs). Reports the time of one layer, the time of
Terra's 22 layers, and the bytes of KV read per second (HBM3 on an H100: 3.35 TB/s peak)::

    python scripts/bench/benchmark_attention.py --rollouts 412 --out bench_attention.json

Needs a GPU of compute capability 9.0 (FA3) and vLLM with its ``vllm_flash_attn`` extension.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

import torch

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(ROOT / "scripts"))

from bench.lib.cli import Parser, check_output, exit_2_on_input_error, in_range, listed, one_of  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.models.presets import TERRA  # noqa: E402

FRAME_POSITIONS = TERRA["num_spatio_embeddings"]  # 576 image + 6 action positions
WINDOW_FRAMES = TERRA["num_temporal_embeddings"]  # 25 frames
CONTEXT_FRAMES = 3
HEADS, KV_HEADS = TERRA["num_attention_heads"], TERRA["num_key_value_heads"]
HEAD_DIM = TERRA["hidden_size"] // HEADS
LAYERS = TERRA["num_hidden_layers"]


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = Parser("benchmark_attention", description=__doc__.split("\n\n")[0])
    p.add_argument("--rollouts", type=in_range(int, 1, 1024), default=412,
                   help="sequences decoded in one step (1024: 61 GB of bf16 KV cache)")
    p.add_argument("--page-sizes", type=listed(in_range(int, 16, 1024)), default="16,32,64,128,256",
                   help="KV cache page sizes (multiples of 16)")
    p.add_argument("--kv-dtypes", type=listed(one_of("fp8", "bfloat16")), default="fp8,bfloat16",
                   help="KV cache dtypes: fp8 (e4m3), bfloat16")
    p.add_argument("--splits", type=listed(in_range(int, 0, 1024)), default="0,32",
                   help="FA3 split caps (0 = its heuristic; vLLM caps at 32 under CUDA graphs)")
    p.add_argument("--iters", type=in_range(int, 1, 100_000), default=50, help="timed calls per setting")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    if any(s % 16 for s in args.page_sizes):
        p.error(f"argument --page-sizes: takes multiples of 16 (got {args.page_sizes}); FA3 pages are")
    if args.out:
        check_output(args.out, "--out")
    return args


def cached_lengths(rollouts: int) -> torch.Tensor:
    """Cached tokens of each rollout: evenly spread from a window's 3 context frames to its full 25 frames."""
    low, high = CONTEXT_FRAMES * FRAME_POSITIONS, WINDOW_FRAMES * FRAME_POSITIONS - 1
    return torch.linspace(low, high, rollouts).round().to(torch.int32)


def time_setting(lengths: torch.Tensor, page: int, kv_dtype: str, splits: int, iters: int) -> dict[str, Any]:
    """One layer's decode attention over ``lengths`` cached tokens per sequence: seconds a call, bytes read."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func, get_scheduler_metadata

    device = torch.device("cuda")
    n = len(lengths)
    pages_per_seq = (lengths + page - 1) // page
    num_pages = int(pages_per_seq.sum())
    dtype = torch.float8_e4m3fn if kv_dtype == "fp8" else torch.bfloat16
    key = torch.randn(num_pages, page, KV_HEADS, HEAD_DIM, device=device).to(dtype)
    value = torch.randn(num_pages, page, KV_HEADS, HEAD_DIM, device=device).to(dtype)
    order = torch.randperm(num_pages, generator=torch.Generator().manual_seed(0)).to(torch.int32)
    table = torch.zeros(n, int(pages_per_seq.max()), dtype=torch.int32)
    start = 0
    for i, count in enumerate(pages_per_seq.tolist()):
        table[i, :count] = order[start:start + count]
        start += count
    query = torch.randn(n, HEADS, HEAD_DIM, device=device).to(dtype)
    out = torch.empty(n, HEADS, HEAD_DIM, device=device, dtype=torch.bfloat16)
    scale = torch.ones(n, KV_HEADS, device=device) if kv_dtype == "fp8" else None
    cu_seqlens_q = torch.arange(n + 1, dtype=torch.int32, device=device)
    seqused_k = lengths.to(device)
    # As vLLM's FLASH_ATTN backend: the split plan computed ahead, ``splits`` its upper bound (0 = none)
    plan = get_scheduler_metadata(batch_size=n, max_seqlen_q=1, max_seqlen_k=int(lengths.max()), num_heads_q=HEADS,
                                  num_heads_kv=KV_HEADS, headdim=HEAD_DIM, cache_seqlens=seqused_k, qkv_dtype=dtype,
                                  cu_seqlens_q=cu_seqlens_q, page_size=page, causal=True, num_splits=splits)
    kwargs = dict(q=query, k=key, v=value, out=out, max_seqlen_q=1, cu_seqlens_q=cu_seqlens_q, seqused_k=seqused_k,
                  max_seqlen_k=int(lengths.max()), softmax_scale=HEAD_DIM ** -0.5, causal=True,
                  block_table=table.to(device), scheduler_metadata=plan, num_splits=splits, fa_version=3,
                  q_descale=scale, k_descale=scale, v_descale=scale)
    for _ in range(3):
        flash_attn_varlen_func(**kwargs)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(iters):
        flash_attn_varlen_func(**kwargs)
    end.record()
    torch.cuda.synchronize()
    seconds = begin.elapsed_time(end) / 1e3 / iters
    read = int(lengths.sum()) * KV_HEADS * HEAD_DIM * 2 * key.element_size()
    return {"page_size": page, "kv_dtype": kv_dtype, "num_splits": splits, "rollouts": n,
            "mean_cached_tokens": float(lengths.float().mean()), "layer_ms": 1e3 * seconds,
            "model_ms": 1e3 * seconds * LAYERS, "kv_read_tb_per_s": read / seconds / 1e12}


@exit_2_on_input_error("benchmark_attention")
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        raise TerraInputError("this benchmark needs a GPU of compute capability 9.0 (FA3: H100, H200)")
    lengths = cached_lengths(args.rollouts)
    rows = []
    print(f"{'page':>5} {'kv':>9} {'splits':>6} {'layer ms':>9} {'22 layers ms':>13} {'KV read TB/s':>13}")
    for kv_dtype in args.kv_dtypes:
        for splits in args.splits:
            for page in args.page_sizes:
                row = time_setting(lengths, page, kv_dtype, splits, args.iters)
                rows.append(row)
                print(f"{page:>5} {kv_dtype:>9} {splits:>6} {row['layer_ms']:>9.3f} {row['model_ms']:>13.2f} "
                      f"{row['kv_read_tb_per_s']:>13.2f}", flush=True)
                torch.cuda.empty_cache()
    if args.out:
        write_text(args.out, json_text({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
