"""Speed of ACT-Bench scoring (terra/scoring/): videos scored per second, decoding included, as JSON.

The inputs are synthetic and ACT-Bench-shaped: ``--videos`` MP4s of ``--frames`` frames (3 context + 44
generated, as ``terra-rollout output.naming=actbench num_frames=44`` writes them) at 288x512, named
``NUSCENES_ACTION_<id>.mp4``, ``--distinct`` of them encoded and the rest hard links to those (decoding costs the
same); one ACT-Bench row per video (a label of the nine classes, a 50-point reference trajectory, per-frame
``instruction_trajs``); and the ACT-Estimator at full size with random weights (speed does not depend on the
values). The run is :func:`terra.scoring.run.score`, exactly as ``terra-score`` runs it.

    python scripts/bench/benchmark_scoring.py --out scoring.json                     # 2,286 videos: ACT-Bench on a GPU
    python scripts/bench/benchmark_scoring.py --batch-size 32 --num-workers 16 --out scoring_b32.json
    python scripts/bench/benchmark_scoring.py --videos 8 --preset tiny --device cpu --num-workers 0   # a CPU smoke run
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout without installing
SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, device_name, exit_2_on_input_error, in_range  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.core.device import usable_cores  # noqa: E402
from terra.scoring.estimator import EstimatorConfig, VideoActionEstimator  # noqa: E402
from terra.scoring.run import score  # noqa: E402
from terra.scoring.settings import ScoringSettings  # noqa: E402

PRESETS = {"full": EstimatorConfig(),  # the published ACT-Estimator
           "tiny": EstimatorConfig(input_shape=(3, 44, 32, 32), d_model=16, num_heads=2, feature_map_size=2)}
LABELS = ("curving_to_left/r20m", "curving_to_right/r20m", "straight_constant_speed/30kmph",
          "straight_constant_speed/10kmph", "straight_accelerating/2mps2", "straight_decelerating/2mps2",
          "starting/2mps2", "stopping/2mps2", "stopped/0kmph")  # one per class (terra/scoring/labels.py)


def write_estimator(folder: Path, config: EstimatorConfig, seed: int = 0) -> Path:
    """A random-weight estimator of ``config`` as ``config.json`` + ``model.safetensors`` in ``folder``."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    state = VideoActionEstimator(config).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json_text(asdict(config)) + "\n")
    return folder


def synthetic_frames(num_frames: int, height: int, width: int, seed: int) -> np.ndarray:
    """uint8 ``[T, H, W, 3]``: a smooth random scene drifting sideways and forwards with fine noise on it, so the
    H.264 stream is of a camera video's size and costs as much to decode."""
    rng = np.random.default_rng(seed)
    coarse = torch.from_numpy(rng.uniform(0, 255, (1, 3, height // 8 + 8, width // 8 + 8)).astype(np.float32))
    scene = torch.nn.functional.interpolate(coarse, scale_factor=8, mode="bicubic", align_corners=False)[0]
    frames = []
    for t in range(num_frames):
        view = scene[:, t % 32: t % 32 + height, t % 64: t % 64 + width].permute(1, 2, 0).numpy()
        frames.append(np.clip(view + rng.normal(0, 6, view.shape), 0, 255).astype(np.uint8))
    return np.stack(frames)


def write_mp4(path: Path, frames: np.ndarray, fps: int = 10) -> None:
    """H.264 (libx264 at its default CRF 23, yuv420p: the toolkit's and Terra's encoding, decoder/writers.py) by
    PyAV, which scoring needs anyway, so the benchmark runs where imageio-ffmpeg is not installed."""
    import av

    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        container.mux(stream.encode())


def write_videos(folder: Path, sample_ids: list[int], num_frames: int, height: int, width: int,
                 distinct: int) -> list[Path]:
    """``NUSCENES_ACTION_<id>.mp4`` per sample id: ``distinct`` encoded videos, the others hard links to them."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, sample_id in enumerate(sample_ids):
        path = folder / f"NUSCENES_ACTION_{sample_id:06d}.mp4"
        if i < distinct:
            write_mp4(path, synthetic_frames(num_frames, height, width, seed=i))
        else:
            os.link(paths[i % distinct], path)
        paths.append(path)
    return paths


def sample_row(sample_id: int, label: str, num_frames: int, rng: np.random.Generator) -> dict:
    """One ACT-Bench row: ``label``, a 50-point forward reference trajectory and ``[num_frames, 60, 3]``
    instruction trajectories."""
    steps = np.stack([rng.uniform(0.5, 1.5, 50), rng.normal(0, 0.1, 50), np.zeros(50)], axis=1)
    return {"sample_id": sample_id, "label": label, "context_frames": [f"samples/CAM_FRONT/{sample_id}_{k}.jpg"
                                                                      for k in range(3)],
            "instruction_trajs": rng.normal(0, 5, (num_frames, 60, 3)).round(4).tolist(),
            "reference_traj": np.cumsum(steps, axis=0).round(4).tolist()}


def write_samples(path: Path, sample_ids: list[int], num_frames: int, seed: int = 0) -> Path:
    """ACT-Bench's JSONL for ``sample_ids``, labels cycling over the nine classes."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for i, sample_id in enumerate(sample_ids):
            fh.write(json_text(sample_row(sample_id, LABELS[i % len(LABELS)], num_frames, rng)) + "\n")
    return path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    size = in_range(int, 16, 2160)
    parser = Parser("benchmark_scoring", description=__doc__.split("\n\n")[0])
    parser.add_argument("--videos", type=in_range(int, 1, 100_000), default=2286,
                        help="videos to score (ACT-Bench: 2,286)")
    parser.add_argument("--frames", type=in_range(int, 4, 1000), default=47,
                        help="frames per video (3 context + 44 generated)")
    parser.add_argument("--height", type=size, default=288)
    parser.add_argument("--width", type=size, default=512)
    parser.add_argument("--distinct", type=in_range(int, 1, 10_000), default=32,
                        help="videos encoded; the others are hard links")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full", help="estimator size")
    parser.add_argument("--batch-size", type=in_range(int, 1, 1024), default=16)
    parser.add_argument("--num-workers", type=in_range(int, 0, 256), default=8)
    parser.add_argument("--device", type=device_name, default="auto")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"))
    parser.add_argument("--workdir", type=Path, default=None, help="inputs go here (default: a temporary folder)")
    parser.add_argument("--out", type=Path, default=None, help="write the record as JSON here too")
    args = parser.parse_args(argv)
    if args.height % 2 or args.width % 2:
        parser.error(f"--height and --width must be even (MP4's colour planes; got {args.height}x{args.width})")
    if args.workdir is not None:
        check_output(args.workdir, "--workdir", folder=True)
    if args.out is not None:
        check_output(args.out, "--out")
    return args


def main(argv: list[str] | None = None) -> dict:
    """Make the inputs, score them once, print and return the record."""
    args = parse_args(argv)
    config = PRESETS[args.preset]
    with tempfile.TemporaryDirectory(prefix="benchmark_scoring_") as tmp:
        work = args.workdir or Path(tmp)
        ids = list(range(args.videos))
        start = time.perf_counter()
        write_videos(work / "videos", ids, args.frames, args.height, args.width, min(args.distinct, args.videos))
        settings = ScoringSettings(
            videos=work / "videos", samples=(write_samples(work / "act_bench.jsonl", ids, args.frames),),
            estimator=write_estimator(work / "estimator", config), output_dir=(work / "scores").resolve(),
            batch_size=args.batch_size, num_workers=args.num_workers, device=args.device, dtype=args.dtype)
        inputs_s = time.perf_counter() - start
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        result = score(settings)
    timings = result.timings
    record = {
        "videos": args.videos, "frames": args.frames, "size": [args.height, args.width], "preset": args.preset,
        "batch_size": args.batch_size, "num_workers": args.num_workers, "dtype": args.dtype,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "cpu",
        "cpus": usable_cores(), "torch": torch.__version__, "python": platform.python_version(),
        "inputs_s": round(inputs_s, 1), **{k: round(v, 2) for k, v in timings.items()},
        "videos_per_s": round(args.videos / timings["estimate_s"], 2),
        "videos_per_s_overall": round(args.videos / timings["total_s"], 2),
        "peak_gpu_memory_gib": (round(torch.cuda.max_memory_allocated() / 2**30, 2) if torch.cuda.is_available()
                                else None),
        "accuracy": result.metrics.accuracy,
    }
    print(json_text(record, indent=1))
    if args.out is not None:
        write_text(args.out, json_text(record, indent=1) + "\n")
    return record


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_scoring")(main)())
