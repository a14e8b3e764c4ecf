"""Time the synthetic world's renderer: milliseconds per frame at 288x512 and 144x256 on one CPU core.

    python scripts/bench/benchmark_renderer.py [--frames 50] [--seed 0]

Renders a drive along the road of a fixed scene (after one warm-up frame per size, which builds the cached
camera geometry) and prints wall-clock and CPU time per frame; on a machine shared with other work the CPU
time is the better measure of the renderer itself (it is single-threaded numpy).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from terra.sim import Scene, render

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import SEED, Parser, exit_2_on_input_error, in_range  # noqa: E402

SIZES = ((288, 512), (144, 256))


def benchmark(frames: int, seed: int) -> dict[tuple[int, int], np.ndarray]:
    """Per-frame (wall, CPU) render times ``[frames, 2]`` in seconds for each size, along the ego lane."""
    scene = Scene.generate(seed)
    poses = scene.lane_pose(np.linspace(20.0, scene.length_m - 200.0, frames))
    times = {}
    for size in SIZES:
        render(scene, poses[0], *size)
        elapsed = []
        for pose in poses:
            wall, cpu = time.perf_counter(), time.process_time()
            render(scene, pose, *size)
            elapsed.append((time.perf_counter() - wall, time.process_time() - cpu))
        times[size] = np.array(elapsed)
    return times


@exit_2_on_input_error("benchmark_renderer")
def main(argv: list[str] | None = None) -> None:
    """Print wall-clock and CPU milliseconds per frame for each size."""
    parser = Parser("benchmark_renderer", description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=in_range(int, 1, 100_000), default=50, help="frames per size")
    parser.add_argument("--seed", type=SEED, default=0, help="scene seed")
    args = parser.parse_args(argv)
    for (height, width), t in benchmark(args.frames, args.seed).items():
        wall, cpu = 1e3 * t[:, 0], 1e3 * t[:, 1]
        print(f"{height}x{width}: {wall.mean():.1f} ms/frame wall (median {np.median(wall):.1f}), "
              f"{cpu.mean():.1f} ms/frame CPU (median {np.median(cpu):.1f}), {len(t)} frames")


if __name__ == "__main__":
    sys.exit(main())
