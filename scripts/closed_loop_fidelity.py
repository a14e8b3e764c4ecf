#!/usr/bin/env python
"""Fidelity of a world model as a simulator (terra/closedloop/fidelity.py): every reference policy on N synthetic
scenarios, driven on the world model's frames and on the renderer's true frames; per policy the closed-loop metrics
in both worlds, the distance between the two ego paths, and the Spearman rank correlation of the policies' time in
lane between the worlds (MODEL_CARD.md, "Closed-loop fidelity"). ``terra-drive world=both`` runs the same through
Hydra; this script needs neither Hydra nor a video writer (``--videos`` to write them), so it runs on a bare GPU
machine too. ``--out`` follows every app's output-folder rule (terra/config/output_dir.py), checked before the model
loads: apart from the checkpoints, writing over only what the toolkit wrote there::

    python scripts/closed_loop_fidelity.py --scenarios 32 --steps 20 --out runs/fidelity          # CPU: hours
    python scripts/closed_loop_fidelity.py --scenarios 32 --steps 20 --device cuda --out runs/fidelity
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import torch

from terra.closedloop.fidelity import claim_fidelity_folders, run_fidelity
from terra.closedloop.loop import drive_id, drive_specs
from terra.closedloop.policies import REFERENCE_POLICIES
from terra.closedloop.run import RunSettings
from terra.closedloop.scenarios import synthetic_id, synthetic_scenarios
from terra.closedloop.worlds import ModelWorld, TrueWorld
from terra.config.assets import DEMO
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.pipeline import WorldModelPipeline
from terra.session import SessionHost



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-model", type=Path, default=DEMO / "world_model")
    parser.add_argument("--tokenizer", type=Path, default=DEMO / "tokenizer")
    parser.add_argument("--scenarios", type=int, default=32)
    parser.add_argument("--scenario-seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--policies", default="all", help="comma-separated reference policies, or all")
    parser.add_argument("--temperature", type=float, default=1.0, help="the world model's sampling")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--max-concurrent", type=int, default=256, help="drives in the world at once")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--videos", action="store_true", help="also write a video per drive")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    names = list(REFERENCE_POLICIES) if args.policies == "all" else args.policies.split(",")
    unknown = [n for n in names if n not in REFERENCE_POLICIES]
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join(REFERENCE_POLICIES)}")
    ids = [drive_id(synthetic_id(args.scenario_seed, i), name) for i in range(args.scenarios) for name in names]
    try:
        folders = claim_fidelity_folders(args.out, ids, args.videos, setting="--out", inputs=[
            ("world model", args.world_model), ("tokenizer", args.tokenizer)])
    except TerraInputError as err:
        parser.error(str(err))
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.getLogger("carla_driver_interface").setLevel(logging.WARNING)
    started = time.perf_counter()
    pipeline = WorldModelPipeline.from_pretrained(args.world_model, args.tokenizer, backend="hf", device=args.device,
                                                  max_batch_size=args.max_concurrent)
    sampling = SamplingConfig(temperature=args.temperature)
    host = SessionHost(pipeline, sampling, max_frames=args.steps)
    size = tuple(pipeline.tokenizer.image_size)
    scenarios = synthetic_scenarios(args.scenarios, args.scenario_seed, size)
    specs = drive_specs(scenarios, {n: REFERENCE_POLICIES[n] for n in names})
    settings = RunSettings(folders.top.path, args.steps, max_concurrent=args.max_concurrent, videos=args.videos,
                           progress=sys.stderr.isatty())
    try:
        report = run_fidelity(ModelWorld(host), TrueWorld(size), specs, settings, model_settings={
            "world_model": str(args.world_model), "temperature": args.temperature}, folders=folders)
    finally:
        host.close()
        pipeline.close()
    print(report.table())
    print(f"{report.drives} drives per world in {time.perf_counter() - started:.0f} s on {pipeline.device}; "
          f"{args.out}/fidelity.md, fidelity.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
