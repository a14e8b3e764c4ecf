"""Forward passes per generated frame, sequential against speculative decoding, of a trained world model on held-out
clips of the synthetic world: the measure stage of scripts/recipes/train_terra_layout.sh, usable on any model +
tokenizer. The measurement is terra/evaluation/decoding.py's (its docstring says what it measures and how). It backs
MODEL_CARD.md, "A model of Terra's token layout" (forward passes per frame, sequential and speculative), and
benchmarks/decoding.md's first guesses (how often a code equals the previous frame's).

    python scripts/experiments/measure_decoding.py --world-model RUN/world_model/model \
        --tokenizer RUN/tokenizer/final --out RUN/results/decoding.json \
        [--rollouts 32 --context 3 --frames 10 --device cuda --dtype float32]
    python scripts/experiments/measure_decoding.py ... \
        --speculative "decoding=speculative,draft_tokens=16;decoding=speculative"
"""

from __future__ import annotations

import sys
from pathlib import Path

from terra.evaluation.decoding import COUNTS, DecodingSettings, measure_decoding

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (  # noqa: E402
    SEED, TEMPERATURE, Parser, check_output, device_name, exit_2_on_input_error, existing, in_range, listed)


def count(name: str):
    """The argparse type of a count of :class:`DecodingSettings` (its range, terra/evaluation/decoding.py)."""
    return in_range(int, COUNTS[name].low, COUNTS[name].high)


def parse_args(argv: list[str] | None = None) -> DecodingSettings:
    """The command line as checked :class:`DecodingSettings`, the output checked writable (a bad value: one line,
    exit 2)."""
    parser = Parser("measure_decoding", description=__doc__.split("\n\n")[0])
    model = existing("folder", "config.json")
    parser.add_argument("--world-model", type=model, required=True,
                        help="world-model folder (config.json + safetensors)")
    parser.add_argument("--tokenizer", type=model, required=True,
                        help="tokenizer folder the world model's data was encoded with")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--temperatures", type=listed(TEMPERATURE), default="0,0.9",
                        help="comma-separated; 0 is greedy")
    parser.add_argument("--speculative", default="decoding=speculative",
                        help="sampling settings of the speculative modes: key=value,... sets separated by ';'")
    parser.add_argument("--rollouts", type=count("rollouts"), default=32)
    parser.add_argument("--context", type=count("context"), default=3, help="ground-truth context frames per rollout")
    parser.add_argument("--frames", type=count("frames"), default=10, help="frames generated per rollout")
    parser.add_argument("--clip-seed", type=SEED, default=1, help="clip i: random_drive(default_rng([seed, i]))")
    parser.add_argument("--exclude-seed", type=SEED, default=0, help="terra-make-dataset seed of the training clips")
    parser.add_argument("--exclude-clips", type=count("exclude_clips"), default=0,
                        help="number of training clips whose scenes to skip")
    parser.add_argument("--seed", type=SEED, default=0, help="rollout k samples with seed + k")
    parser.add_argument("--device", type=device_name, default="auto")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    args = parser.parse_args(argv)
    with parser.one_line_errors():
        check_output(args.out, "--out", [args.world_model, args.tokenizer])
        return DecodingSettings(
            str(args.world_model), str(args.tokenizer), args.out, tuple(args.temperatures),
            tuple(text.strip() for text in args.speculative.split(";") if text.strip()), args.rollouts, args.context,
            args.frames, args.clip_seed, args.exclude_seed, args.exclude_clips, args.seed, args.device, args.dtype)


@exit_2_on_input_error("measure_decoding")
def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    measure_decoding(settings)
    print(f"wrote {settings.out}")


if __name__ == "__main__":
    sys.exit(main())
