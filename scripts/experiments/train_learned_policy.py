#!/usr/bin/env python
"""Train the learned policy (terra/closedloop/policies/learned.py) by behaviour cloning on the synthetic world's true
frames (terra/closedloop/policies/learned.py) and write its weights; print its held-out error against the expert. The
shipped weights (terra/assets/learned_driver/model.safetensors) came from the defaults, on a 2-core CPU::

    python scripts/experiments/train_learned_policy.py

It backs benchmarks/drives.md, "Pixel policies in the true world" (the shipped weights' held-out error).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from terra.closedloop.policies.learned import draw_samples, path_errors, save_net, train
from terra.config.assets import LEARNED_DRIVER

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import SEED, THREADS, Parser, check_output, exit_2_on_input_error, in_range  # noqa: E402

MAX_FRAMES = 100_000  # frames of one set, each kept as the net's input (18 kB: 1.8 GB in all)


def main(argv: list[str] | None = None) -> dict:
    parser = Parser("train_learned_policy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--train", type=in_range(int, 1, MAX_FRAMES), default=6000, help="training frames")
    parser.add_argument("--held-out", type=in_range(int, 1, MAX_FRAMES), default=600,
                        help="held-out frames (other scenes)")
    parser.add_argument("--epochs", type=in_range(int, 1, 10_000), default=30)
    parser.add_argument("--size", type=in_range(int, 16, 1024), nargs=2, default=(144, 256),
                        help="frame rows and columns rendered")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--threads", type=THREADS, default=1,
                        help="torch threads (one is fastest on a shared 2-core CPU)")
    parser.add_argument("--out", type=Path, default=LEARNED_DRIVER)
    args = parser.parse_args(argv)
    check_output(args.out, "--out")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    training = draw_samples(args.train, args.seed, args.size)
    held_out = draw_samples(args.held_out, args.seed + 1, args.size)
    rendered = time.perf_counter() - start
    net = train(training, args.epochs, seed=args.seed)
    record = {"held_out_mae_m": path_errors(net, held_out), "train_mae_m": path_errors(net, training),
              "render_s": round(rendered, 1), "train_s": round(time.perf_counter() - start - rendered, 1),
              "command": " ".join(["python", *sys.argv])}
    save_net(net, args.out, {"training": json.dumps(record)})
    print(json.dumps(record, indent=2))
    return record


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("train_learned_policy")(main)())
