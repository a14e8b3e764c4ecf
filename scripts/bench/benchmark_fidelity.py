"""Measure terra/fidelity/ on true renders: the odometry's error at known motions, and the per-frame CPU cost of the
odometry, the lane reading, the temporal lag and PSNR / SSIM at 144x256.

    python scripts/bench/benchmark_fidelity.py [--pairs 200] [--domains day,left_hand,night] [--seed 1]
        [--measure-night] [--out f.json]

Accuracy: pairs of renders of the synthetic world (a random scene, a pose in the ego lane +- 0.8 m and +- 0.05 rad,
then the same pose moved by a known motion: 0-3 m forward, yaw +- 0.05 rad, the sideways motion of that arc);
per domain, the median, mean and 90th percentile of the error of each component, the gain of the recovered on the
true motion (through the origin) and how many pairs were refused. Cost: CPU time (the measurements are
single-threaded numpy; CPU time is the better figure on a machine shared with other work) per frame pair.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from terra.core.atomic import json_text, write_text
from terra.fidelity.agreement import lane_agreement, temporal_lag
from terra.fidelity.odometry import MIN_SKY_LUMINANCE, estimate_motion, se2
from terra.metrics import psnr, ssim
from terra.sim.renderer import render
from terra.sim.scene import DOMAINS, Scene

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import SEED, Parser, check_output, exit_2_on_input_error, in_range, listed, one_of  # noqa: E402

HEIGHT, WIDTH = 144, 256


def motion_pairs(count: int, seed: int, domain: str = "day", max_dx: float = 3.0):
    """``count`` (before, after, motion) triples of true renders of random scenes of ``domain``."""
    rng = np.random.default_rng([seed, DOMAINS.index(domain)])
    for _ in range(count):
        scene = Scene.generate(int(rng.integers(10_000)), domain=domain)
        pose = scene.lane_pose(rng.uniform(20, 500), scene.ego_lane_offset_m + rng.uniform(-0.8, 0.8))
        pose[2] += rng.uniform(-0.05, 0.05)
        dx, dyaw = rng.uniform(0.0, max_dx), rng.uniform(-0.05, 0.05)
        motion = np.array([dx, dx * np.tan(dyaw / 2), dyaw])
        moved = se2(*pose) @ se2(*motion)
        after = render(scene, np.array([moved[0, 2], moved[1, 2], pose[2] + dyaw]), HEIGHT, WIDTH)
        yield render(scene, pose, HEIGHT, WIDTH), after, motion


def accuracy(pairs: int, seed: int, domain: str, min_sky_luminance: float = MIN_SKY_LUMINANCE) -> dict:
    """The odometry's errors over ``pairs`` pairs of ``domain``, and its CPU milliseconds per pair (errors only of
    the pairs it did not refuse)."""
    truth, found, refused, cpu = [], [], 0, 0.0
    for before, after, motion in motion_pairs(pairs, seed, domain):
        start = time.process_time()
        result = estimate_motion(before, after, min_sky_luminance=min_sky_luminance)
        cpu += time.process_time() - start
        if result is None:
            refused += 1
            continue
        truth.append(motion)
        found.append(result.as_array())
    truth, found = np.array(truth).reshape(-1, 3), np.array(found).reshape(-1, 3)
    error = found - truth
    row = {"pairs": pairs, "refused": refused, "cpu_ms_per_pair": 1e3 * cpu / pairs}
    if not len(truth):
        return row
    for k, name in enumerate(("dx", "dy", "dyaw")):
        row[name] = {"median_abs": float(np.median(np.abs(error[:, k]))), "mean": float(error[:, k].mean()),
                     "p90_abs": float(np.quantile(np.abs(error[:, k]), 0.9))}
        if name != "dy":
            row[name]["gain"] = float(np.sum(truth[:, k] * found[:, k]) / np.sum(truth[:, k] ** 2))
    return row


def costs(frames: int, seed: int) -> dict:
    """CPU milliseconds per frame of each measurement along a drive of ``frames`` frames."""
    scene = Scene.generate(seed)
    poses = scene.lane_pose(np.linspace(50.0, 50.0 + 1.2 * frames, frames + 1))
    video = np.stack([render(scene, pose, HEIGHT, WIDTH) for pose in poses])
    world, truth = video[1:], video[1:].copy()
    estimate_motion(video[0], video[1])  # builds the cached grids
    lane_agreement(world[:1], truth[:1])  # loads the lane detector (and torch with it)
    ssim(world[:1], truth[:1])  # loads scikit-image
    timed = {}
    for name, run in (("odometry", lambda: [estimate_motion(a, b) for a, b in zip(video[:-1], video[1:])]),
                      ("lane_agreement", lambda: lane_agreement(world, truth)),
                      ("temporal_lag", lambda: temporal_lag(world, truth)),
                      ("psnr_ssim", lambda: (psnr(world, truth), ssim(world, truth)))):
        start = time.process_time()
        run()
        timed[name] = 1e3 * (time.process_time() - start) / frames
    return timed


def main(argv: list[str] | None = None) -> None:
    parser = Parser("benchmark_fidelity", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=in_range(int, 1, 100_000), default=200, help="frame pairs per domain")
    parser.add_argument("--domains", type=listed(one_of(*DOMAINS)), default="day,left_hand,night",
                        help="comma-separated scene domains")
    parser.add_argument("--frames", type=in_range(int, 23, 10_000), default=100,
                        help="frames of the drive the costs are timed on (23: the temporal lag's shortest drive)")
    parser.add_argument("--seed", type=SEED, default=1)
    parser.add_argument("--measure-night", action="store_true",
                        help="measure night pairs too instead of refusing them (shows why they are refused)")
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    domains = args.domains
    if args.out:
        check_output(args.out, "--out")
    sky = 0.0 if args.measure_night else MIN_SKY_LUMINANCE
    result = {"accuracy": {d: accuracy(args.pairs, args.seed, d, sky) for d in domains},
              "cpu_ms_per_frame": costs(args.frames, args.seed)}
    for domain, row in result["accuracy"].items():
        if "dx" not in row:
            print(f"{domain}: {row['pairs']} pairs, all refused")
            continue
        parts = [f"{name} median |err| {row[name]['median_abs']:.4f} mean {row[name]['mean']:+.4f} "
                 f"p90 {row[name]['p90_abs']:.4f}" + (f" gain {row[name]['gain']:.4f}" if "gain" in row[name] else "")
                 for name in ("dx", "dy", "dyaw")]
        print(f"{domain}: {row['pairs']} pairs, {row['refused']} refused, {row['cpu_ms_per_pair']:.1f} ms CPU/pair; "
              + "; ".join(parts))
    print("CPU ms per frame: " + ", ".join(f"{k} {v:.1f}" for k, v in result["cpu_ms_per_frame"].items()))
    if args.out:
        write_text(args.out, json_text(result, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_fidelity")(main)())
