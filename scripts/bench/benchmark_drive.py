#!/usr/bin/env python
"""Closed-loop drives (terra/closedloop/) against batch rollouts of the same frames on the same engine.

N drives (synthetic scenarios x reference policies) run at once for ``--steps`` frames through the driving loop:
each step every policy plans (timed apart: policy time is excluded from the engine's frames/s and reported
separately), then every drive's next frame goes to the engine together. The same N rollouts (the same context
codes, the actions the policies chose, the same seeds) then run as one ``backend.generate`` call and the codes
are compared (they must be equal). Target: at 64 drives the loop's engine frames/s is >= 90 % of the
batch's on one H100. Examples::

    python scripts/bench/benchmark_drive.py --drives 16 --steps 8                    # CPU: demo model, Transformers
    python scripts/bench/benchmark_drive.py --model terra --backend vllm --dtype bfloat16 --drives 64 --steps 16 \\
        --out bench/drive_h100.json                                            # GPU: Terra's shape, random

With ``--model terra`` (random weights, no tokenizer) the contexts are random codes and the policies see blank
frames at Terra's 288x512: the engine's work is Terra's, the policies' is the same arithmetic on empty images.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark_sessions import DEMO, build_model  # noqa: E402  (scripts/: the same model and backend set-up)

from bench.lib.cli import (  # noqa: E402
    TEMPERATURE, THREADS, Parser, device_name, exit_2_on_input_error, existing, in_range, listed,
    model_or, one_of)

from terra.closedloop.loop import DriveSpec, LoopTimings, run_drives  # noqa: E402
from terra.closedloop.policies.builtin import REFERENCE_POLICIES  # noqa: E402
from terra.closedloop.scenarios import synthetic_scenarios  # noqa: E402
from terra.closedloop.worlds import ModelWorld  # noqa: E402
from terra.config.output_dir import claim_output_file  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.generation.rollout import RolloutRequest, WorldModelBackend  # noqa: E402

BLANK_SIZE = (288, 512)  # Terra's frames, for policies when there is no tokenizer


class KeptWorld(ModelWorld):
    """The model world keeping each drive's context and codes when it closes (for the batch comparison); without
    a tokenizer, contexts are random codes and frames blank images."""

    def __init__(self, model, sampling: SamplingConfig, seed: int = 0) -> None:
        super().__init__(model, sampling)
        self.kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.rng = np.random.default_rng(seed)

    def open(self, scenario, seed, max_frames):
        if self.pipeline is not None:
            return super().open(scenario, seed, max_frames)
        layout = self.backend.layout
        codes = self.rng.integers(0, layout.codebook_size, (len(scenario.images), layout.image_tokens))
        return self.open_codes(codes, scenario, seed, max_frames)

    def context_frames(self, drive):
        if self.pipeline is not None:
            return super().context_frames(drive)
        return np.zeros((len(drive.context), *BLANK_SIZE, 3), dtype=np.uint8)

    def step(self, drives, actions, poses):
        if self.pipeline is not None:
            return super().step(drives, actions, poses)
        start = time.perf_counter()
        futures = [self.engine.step(drive.rollout, action, drive.sampling) for drive, action in zip(drives, actions)]
        results = []
        for future in futures:
            future.result()
            results.append(np.zeros((*BLANK_SIZE, 3), dtype=np.uint8))
        self.generate_s += time.perf_counter() - start
        return results

    def close(self, drive) -> None:
        codes = drive.codes()
        self.kept[drive.seed] = (drive.context.reshape(len(drive.context), -1), codes.reshape(len(codes), -1))
        super().close(drive)


def main(argv: list[str] | None = None) -> dict:
    parser = Parser("benchmark_drive", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=model_or("demo", "terra", "tiny"), default="demo",
                        help="demo | terra (random weights, vLLM) | tiny | a folder")
    parser.add_argument("--tokenizer", type=existing("folder", "config.json"))
    parser.add_argument("--backend", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--device", type=device_name, default="auto")
    parser.add_argument("--dtype", default="auto", choices=("auto", "bfloat16", "float16", "float32"))
    parser.add_argument("--drives", type=in_range(int, 1, 4096), default=64)
    parser.add_argument("--steps", type=in_range(int, 1, 10_000), default=16)
    parser.add_argument("--policies", type=listed(one_of(*REFERENCE_POLICIES)),
                        default="route_follower,constant_speed,lane_follower,lane_follower_noisy")
    parser.add_argument("--temperature", type=TEMPERATURE, default=1.0)
    parser.add_argument("--threads", type=THREADS)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    names = args.policies
    output = None
    if args.out:  # the output-folder rule (terra/config/output_dir.py), before the model loads
        checkpoints = [DEMO] if args.model == "demo" else [Path(p) for p in (args.model, args.tokenizer)
                                                            if p and p not in ("terra", "tiny")]
        with parser.one_line_errors():
            output = claim_output_file(args.out, "--out", inputs=[("checkpoint", checkpoints)],
                                       app="scripts/bench/benchmark_drive.py")
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("carla_driver_interface").setLevel(logging.WARNING)
    sampling = SamplingConfig(temperature=args.temperature)
    setup = argparse.Namespace(model=args.model, tokenizer=args.tokenizer, backend=args.backend, device=args.device,
                               dtype=args.dtype, sessions=[args.drives], frames=args.steps, num_context=3,
                               max_num_seqs=args.drives, requests=None, threads=args.threads)
    with tempfile.TemporaryDirectory(prefix="terra-bench-drive-") as folder:
        model = build_model(setup, Path(folder), sampling)
        backend = model if isinstance(model, WorldModelBackend) else model.backend
        try:
            size = (72, 128) if model is backend else tuple(model.tokenizer.image_size)
            scenarios = synthetic_scenarios(-(-args.drives // len(names)), 0, size)
            specs = [DriveSpec(s, n, REFERENCE_POLICIES[n], seed=i * len(names) + j)
                     for i, s in enumerate(scenarios) for j, n in enumerate(names)][: args.drives]
            warm = KeptWorld(model, sampling)
            run_drives(warm, specs[:1], 2)  # warm-up: first calls, CUDA graphs, caches
            warm.shutdown()
            world = KeptWorld(model, sampling)
            start, timings = time.perf_counter(), LoopTimings()
            drives = run_drives(world, specs, args.steps, timings=timings)
            wall = time.perf_counter() - start
            world.shutdown()
            failed = [f"{d.spec.id}: {d.error}" for d in drives if not d.ok]
            if failed:
                raise SystemExit(f"benchmark_drive: {len(failed)} drives failed, e.g. {failed[0]}")
            requests = [RolloutRequest(world.kept[d.spec.seed][0],
                                       np.concatenate([d.spec.scenario.actions, np.stack(d.actions)]), args.steps,
                                       seed=d.spec.seed) for d in drives]
            start = time.perf_counter()
            generated = backend.generate(requests, sampling, progress=False)
            batch_s = time.perf_counter() - start
        finally:
            backend.close()
    frames = args.drives * args.steps
    plans = [s for d in drives for s in d.policy_s]
    identical = all(np.array_equal(g.reshape(args.steps, -1), world.kept[d.spec.seed][1][3:])
                    for g, d in zip(generated, drives))
    record = {
        "drives": args.drives, "steps": args.steps, "model": args.model, "backend": args.backend,
        "policies": names, "loop_engine_frames_per_s": frames / world.generate_s,
        "batch_frames_per_s": frames / batch_s, "loop_vs_batch": batch_s / world.generate_s,
        "loop_wall_frames_per_s": frames / wall, "engine_s": world.generate_s, "decode_s": world.decode_s,
        "policy_phase_s": timings.policies_s, "policy_mean_s": float(np.mean(plans)),
        "policy_p90_s": float(np.percentile(plans, 90)), "batch_s": batch_s, "identical_codes": identical,
        "command": " ".join(sys.argv),
    }
    print(json_text(record, indent=2))
    if output is not None:
        output.record()
        write_text(args.out, json_text(record, indent=2) + "\n")
    return record


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_drive")(main)())
