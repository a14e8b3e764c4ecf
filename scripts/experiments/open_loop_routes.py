"""Open-loop frame quality of route models told their route and told none (MODEL_CARD.md, "Evaluation").

For each model: 12 held-out clips of the synthetic world (the quality scenes of terra-evaluate: scene seeds from
10,000,000; six manoeuvres twice, 30 km/h), 3 true context frames, 10 generated greedily, PSNR of each step against
the true frames (terra/evaluation/measure.py), once with each clip's route and once with none. A model that redraws
the road from its route at a window's first new frame scores lower with it when the context is true.

    python scripts/experiments/open_loop_routes.py terra/assets/demo/world_model /path/to/other_route_model
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import torch

from terra.config.sampling import SamplingConfig
from terra.evaluation.measure import evaluate_quality
from terra.generation.backends import model_backend
from terra.pipeline import WorldModelPipeline
from terra.sim.clips import make_clip
from terra.sim.scene import Scene
from terra.tokenizer import load_tokenizer

MANOEUVRES = ("straight", "curve_left", "curve_right", "accelerate", "decelerate", "lane_change_left")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="route models' folders")
    parser.add_argument("--tokenizer", default="terra/assets/demo/tokenizer")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clips = [make_clip(Scene.generate(10_000_000 + i), name, 13, 144, 256, speed_kmh=30.0, start_s=40.0)
             for i, name in enumerate(MANOEUVRES * 2)]
    blind = [replace(clip, routes=None) for clip in clips]  # a clip without routes is told none (clip_routes)
    tokenizer = load_tokenizer(args.tokenizer)
    print(f"{'model':40} {'told':9} {'steps 1-4 (dB)':28} mean")
    for folder in args.models:
        pipeline = WorldModelPipeline(tokenizer, model_backend(folder))
        for name, told in (("its route", clips), ("no route", blind)):
            psnr = evaluate_quality(pipeline, told, 3, SamplingConfig(temperature=0.0), 0, False)["psnr"]
            steps = " / ".join(f"{v:.2f}" for v in psnr["mean"][:4])
            print(f"{folder:40} {name:9} {steps:28} {psnr['overall']:.2f}")


if __name__ == "__main__":
    main()
