"""Open-loop frame quality of route models told their route and told none (MODEL_CARD.md, "Evaluation").

For each model: 12 held-out clips of the synthetic world (the quality scenes of terra-evaluate: scene seeds from
10,000,000; six manoeuvres twice, 30 km/h), 3 true context frames, 10 generated greedily, PSNR of each step against
the true frames (terra/evaluation/measure.py), once with each clip's route and once with none. A model that redraws
the road from its route at a window's first new frame scores lower with it when the context is true.

    python scripts/experiments/open_loop_routes.py terra/assets/demo/world_model /path/to/other_route_model
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from terra.config.assets import demo_checkpoints
from terra.core.errors import TerraInputError

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import THREADS, Parser, exit_2_on_input_error, existing, model_layout  # noqa: E402

MANOEUVRES = ("straight", "curve_left", "curve_right", "accelerate", "decelerate", "lane_change_left")


def check_route_model(folder: Path) -> None:
    """Refuse, in one line, a model without route slots: told a route or none, it reads the same frames."""
    if not model_layout(folder).route_model:
        raise TerraInputError(f"{folder} has no route slots (num_route_tokens 0): it cannot be told a route; give "
                              "route models only")


@exit_2_on_input_error("open_loop_routes")
def main(argv: list[str] | None = None) -> None:
    parser = Parser("open_loop_routes", description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", type=existing("folder", "config.json"), help="route models' folders")
    parser.add_argument("--tokenizer", type=existing("folder", "config.json"), default=demo_checkpoints()[1],
                        help="the tokenizer's folder (default: the demo tokenizer)")
    parser.add_argument("--threads", type=THREADS, default=2, help="CPU threads torch uses")
    args = parser.parse_args(argv)
    for folder in args.models:
        check_route_model(folder)

    import torch

    from terra.config.sampling import SamplingConfig
    from terra.evaluation.measure import evaluate_quality
    from terra.generation.backends import model_backend
    from terra.pipeline import WorldModelPipeline
    from terra.sim.clips import make_clip
    from terra.sim.scene import Scene
    from terra.tokenizer import load_tokenizer

    torch.set_num_threads(args.threads)
    clips = [make_clip(Scene.generate(10_000_000 + i), name, 13, 144, 256, speed_kmh=30.0, start_s=40.0)
             for i, name in enumerate(MANOEUVRES * 2)]
    blind = [replace(clip, routes=None) for clip in clips]  # a clip without routes is told none (clip_routes)
    tokenizer = load_tokenizer(str(args.tokenizer))
    print(f"{'model':40} {'told':9} {'steps 1-4 (dB)':28} mean")
    for folder in args.models:
        pipeline = WorldModelPipeline(tokenizer, model_backend(str(folder)))
        for name, told in (("its route", clips), ("no route", blind)):
            psnr = evaluate_quality(pipeline, told, 3, SamplingConfig(temperature=0.0), 0, False)["psnr"]
            steps = " / ".join(f"{v:.2f}" for v in psnr["mean"][:4])
            print(f"{str(folder):40} {name:9} {steps:28} {psnr['overall']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
