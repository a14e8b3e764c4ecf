"""GPU check of speculative Jacobi decoding on vLLM (terra/vllm/jacobi_state.py): same codes, fewer engine steps.

For each block size (0 = sequential decoding), one engine (bf16 by default, CUDA graphs, asynchronous scheduling,
Model Runner V2) over the same rollouts:

1. single stream, one rollout after another: seconds per frame and forward passes per frame (the engine core runs
   in this process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and its scheduler's steps are counted);
2. all rollouts at once (a batch mixing prefills and blocks of several requests).

Codes of every block size are compared with sequential decoding's, greedy and at temperature 0.9 (the route
emits the very tokens sequential decoding draws, so they are identical unless the wider pass moves a near-tie of
bf16 logits: the agreement is reported, not asserted). The default model is the demo world model on drives of the
synthetic world (real next-token distributions); ``--model`` takes any Terra checkpoint folder, and
``--terra-shape`` Terra's published shape with random weights (vLLM's dummy loader: what a pass of K+1 tokens costs;
nearly every guess fails there). With either, the context codes are random. Writes JSON to ``--out``.

    python scripts/check_jacobi_vllm.py --out outputs/check_jacobi_vllm.json
    python scripts/check_jacobi_vllm.py --terra-shape --blocks 0,8,16 --temperatures 0.9 --rollouts 1 \
        --frames 3 --out outputs/check_jacobi_vllm_terra.json
    python scripts/check_jacobi_vllm.py --blocks 0,16 --rollouts 2 --frames 2 --out outputs/smoke.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the scheduler in this process, to count its steps

import numpy as np

SCRIPTS = Path(__file__).resolve().parent


def load_blocks_script():
    """scripts/measure_jacobi_blocks.py (its demo drives and default model folder)."""
    spec = importlib.util.spec_from_file_location("measure_jacobi_blocks", SCRIPTS / "measure_jacobi_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_requests(model: str, rollouts: int, frames: int) -> list:
    from transformers import AutoConfig

    import terra.models  # noqa: F401
    from terra.generation.layout import TokenLayout
    from terra.generation.rollout import RolloutRequest

    blocks = load_blocks_script()
    layout = TokenLayout.from_config(AutoConfig.from_pretrained(model))
    if Path(model).resolve() == blocks.DEMO.resolve():
        return blocks.demo_requests(layout, rollouts, frames)
    rng = np.random.default_rng(0)
    context = rng.integers(0, layout.codebook_size, (3, layout.image_tokens))
    return [RolloutRequest(context, rng.normal(0, 2, (2 + frames, layout.action_tokens, 3)).astype(np.float32),
                           frames, seed=i) for i in range(rollouts)]


class StepCounter:
    """Counts the scheduler's steps that ran the model (each is one forward pass)."""

    def __init__(self, backend) -> None:
        core = backend.engine.engine_core.engine_core  # InprocClient -> EngineCore
        scheduler = core.scheduler
        schedule = scheduler.schedule
        self.steps = 0

        def counting(*args, **kwargs):
            output = schedule(*args, **kwargs)
            self.steps += output.total_num_scheduled_tokens > 0
            return output

        scheduler.schedule = counting


def run_block(model: str, block: int, requests: list, args: argparse.Namespace) -> dict:
    from terra.config.sampling import SamplingConfig
    from terra.generation.vllm_backend import VLLMBackend

    started = time.perf_counter()
    extra = {"load_format": "dummy"} if args.terra_shape else {}
    backend = VLLMBackend(model, dtype=args.dtype, max_num_seqs=max(len(requests), 1), speculative_block=block,
                          gpu_memory_utilization=args.gpu_memory_utilization, **extra)
    result = {"block": block, "startup_s": round(time.perf_counter() - started, 1),
              "v2_runner": backend.engine.vllm_config.use_v2_model_runner,
              "async_scheduling": backend.engine.vllm_config.scheduler_config.async_scheduling,
              "cudagraph_mode": str(backend.engine.vllm_config.compilation_config.cudagraph_mode), "runs": []}
    counter = StepCounter(backend)
    try:
        for temperature in args.temperatures:
            sampling = SamplingConfig(temperature=temperature)
            backend.generate(requests[:1], sampling, progress=False)  # warm-up (first-use compilation)
            single, steps, seconds = [], [], []
            for request in requests:
                counter.steps, start = 0, time.perf_counter()
                single.append(backend.generate([request], sampling, progress=False)[0])
                seconds.append(time.perf_counter() - start)
                steps.append(counter.steps)
            start = time.perf_counter()
            batched = backend.generate(requests, sampling, progress=False)
            batch_s = time.perf_counter() - start
            frames = sum(len(c) for c in single)
            result["runs"].append({
                "temperature": temperature,
                "s_per_frame": sum(seconds) / frames,
                "passes_per_frame": sum(steps) / frames,
                "tokens_per_pass": frames * requests[0].context.shape[-1] / sum(steps) if sum(steps) else None,
                "batch_frames_per_s": frames / batch_s,
                "codes": {"single": [c.tolist() for c in single], "batched": [c.tolist() for c in batched]},
            })
            print(f"block {block:3d}  T={temperature}: {sum(seconds) / frames:.3f} s/frame, "
                  f"{sum(steps) / frames:.1f} passes/frame, batch {frames / batch_s:.2f} frames/s", flush=True)
    finally:
        backend.close()
    return result


def agreement(codes: list, reference: list) -> float:
    a, b = np.asarray(codes), np.asarray(reference)
    return float((a == b).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write the results to")
    parser.add_argument("--model", default=None, help="world model folder (default: the demo model)")
    parser.add_argument("--terra-shape", action="store_true", help="Terra's shape with random weights")
    parser.add_argument("--blocks", default="0,4,8,16,32", help="guesses per step; 0 = sequential (the reference)")
    parser.add_argument("--temperatures", default="0,0.9")
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    args = parser.parse_args()
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    blocks = [int(b) for b in args.blocks.split(",")]
    if blocks[0] != 0:
        blocks.insert(0, 0)
    model = args.model or str(load_blocks_script().DEMO)
    if args.terra_shape:
        import tempfile

        from terra.models import LlamaActionConfig
        from terra.models.presets import TERRA

        model = tempfile.mkdtemp(prefix="terra_shape_")
        LlamaActionConfig(**TERRA).save_pretrained(model)  # config.json only: vLLM draws the weights
    requests = make_requests(model, args.rollouts, args.frames)

    import torch
    import vllm

    results = [run_block(model, block, requests, args) for block in blocks]
    reference = {run["temperature"]: run["codes"]["single"] for run in results[0]["runs"]}
    for result in results:
        for run in result["runs"]:
            ref = reference[run["temperature"]]
            run["agreement_single"] = agreement(run["codes"]["single"], ref)
            run["agreement_batched"] = agreement(run["codes"]["batched"], ref)
            run["identical"] = run["agreement_single"] == 1.0 and run["agreement_batched"] == 1.0
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    report = {"vllm": vllm.__version__, "torch": torch.__version__, "device": device,
              "model": model, "dtype": args.dtype, "rollouts": args.rollouts, "frames": args.frames,
              "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report))
    for result in results:
        for run in result["runs"]:
            print(f"block {result['block']:3d}  T={run['temperature']}: {run['s_per_frame']:.3f} s/frame, "
                  f"{run['passes_per_frame']:.1f} passes/frame, agreement single {run['agreement_single']:.4f} "
                  f"batched {run['agreement_batched']:.4f}")


if __name__ == "__main__":
    main()
