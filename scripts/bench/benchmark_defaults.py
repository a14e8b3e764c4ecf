#!/usr/bin/env python
"""Each path at its defaults and at other blocks: passes a frame and seconds, as rows of benchmarks/decoding.md's
table "The defaults against the best".

The paths, each run as its app runs it, with the app's own settings and the overrides after the options (Hydra's,
e.g. ``backend=vllm device=cuda``):

* ``generate``: ``terra-generate``'s run (terra/apps/generate.py) of one sample of ``--frames`` frames, the default
  manoeuvre; its seconds a frame are the sidecar's ``generate_s`` over the frames (the model loaded, nothing written
  yet);
* ``alpasim1`` and ``alpasim16``: scripts/bench/benchmark_alpasim.py with one and 16 AlpaSim sessions at once (the
  server sized as ``terra-alpasim`` sizes it), ``--chunks`` chunks of 8 frames after a first of 5; its seconds are an
  8-frame chunk's (p50).

Beside the seconds, the process's CPU seconds (every thread) for the same unit: on a CPU shared with other work the
wall time says little, the CPU time what the run cost.

For each path, ``--draft-tokens`` lists the settings: ``auto`` is the defaults (the block ``decoding=auto`` picks,
terra/generation/decoding.py), a number sets ``sampling.draft_tokens``; a block the defaults already ran is not run
again. One markdown row per run, then each path's defaults against its fastest run. Examples::

    OMP_NUM_THREADS=1 python scripts/bench/benchmark_defaults.py --frames 16 --chunks 2 --by cpu_s \\
        --draft-tokens auto,16,48,64,144 backend=hf device=cpu                           # the CPU rows
    python scripts/bench/benchmark_defaults.py --frames 64 --chunks 8 --draft-tokens auto,32 \\
        backend=vllm device=cuda --out defaults_gpu.json                                 # the GPU rows (~8 min)
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import exit_2_on_input_error  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402

PATHS = ("generate", "alpasim1", "alpasim16")
HEADER = "| path | setting | block | passes a frame | seconds | CPU seconds | of |"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", default=",".join(PATHS), help=f"comma list of {', '.join(PATHS)}")
    parser.add_argument("--draft-tokens", default="auto,32,144",
                        help="comma list of settings: auto (the defaults) or a sampling.draft_tokens")
    parser.add_argument("--frames", type=int, default=64, help="generate: frames of its one sample")
    parser.add_argument("--chunks", type=int, default=8, help="alpasim: 8-frame chunks a session, after one of 5")
    parser.add_argument("--by", choices=("seconds", "cpu_s"), default="seconds",
                        help="what the defaults are compared by: the wall seconds (a machine to itself) or the CPU "
                             "seconds (a CPU shared with other work)")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    parser.add_argument("overrides", nargs="*", help="the apps' settings, e.g. backend=vllm device=cuda")
    args = parser.parse_args(argv)
    args.paths = [p for p in args.paths.split(",") if p]
    args.draft_tokens = [d.strip() for d in args.draft_tokens.split(",") if d.strip()]
    if set(args.paths) - set(PATHS) or not args.paths:
        parser.error(f"--paths takes a comma list of {', '.join(PATHS)} (got {','.join(args.paths)!r})")
    if any(d != "auto" and not (d.isdigit() and int(d) >= 1) for d in args.draft_tokens) or not args.draft_tokens:
        parser.error(f"--draft-tokens takes a comma list of auto and whole numbers (got {args.draft_tokens!r})")
    if args.frames < 1 or args.chunks < 1:
        parser.error("--frames and --chunks must be at least 1")
    return args


def run_generate(overrides: list[str], frames: int) -> dict:
    """terra-generate's run of one sample: its block, passes a frame, seconds a frame (the sidecar's) and the
    process's CPU seconds a frame while it generated."""
    from hydra import compose, initialize_config_dir

    from terra.apps.generate import generate_spec, run
    from terra.apps.runner import CONF_DIR
    from terra.pipeline import WorldModelPipeline

    generate, cpu = WorldModelPipeline.generate, []

    def timed(self, *args, **kwargs):
        start = time.process_time()
        try:
            return generate(self, *args, **kwargs)
        finally:
            cpu.append(time.process_time() - start)

    with tempfile.TemporaryDirectory() as folder:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("generate", [*overrides, f"num_frames={frames}", "num_samples=1", "output.formats=[gif]"])
        WorldModelPipeline.generate = timed
        try:
            run(generate_spec(cfg), Path(folder) / "out")
        finally:
            WorldModelPipeline.generate = generate
        sidecar = json.loads((Path(folder) / "out" / "rollout.json").read_text())
    decoding = sidecar["rollouts"][0]["decoding"]
    return {"block": decoding["draft_tokens"], "decoding": decoding["decoding"],
            "passes_per_frame": decoding["passes_per_frame"], "seconds": sidecar["timings_s"]["s_per_frame"],
            "cpu_s": sum(cpu) / frames, "of": "s a frame"}


def run_alpasim(overrides: list[str], sessions: int, chunks: int) -> dict:
    """scripts/bench/benchmark_alpasim.py's record for ``sessions`` at once: block, passes a frame, seconds a chunk."""
    from benchmark_alpasim import main as alpasim

    [record] = alpasim(["--sessions", str(sessions), "--chunks", str(chunks), *overrides])
    return {"block": record["draft_tokens"] if record["decoding"] == "speculative" else None,
            "decoding": record["decoding"], "passes_per_frame": round(record["passes_per_frame"], 3),
            "seconds": record["chunk_p50_s"], "cpu_s": 8 * record["cpu_s_per_frame"],
            "of": "s an 8-frame chunk (p50)"}


def row(record: dict) -> str:
    block = "sequential" if record["decoding"] == "sequential" else str(record["block"])
    return (f"| {record['path']} | {record['setting']} | {block} | {record['passes_per_frame']:.2f} | "
            f"{record['seconds']:.3f} | {record['cpu_s']:.3f} | {record['of']} |")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if any(o.startswith(("sampling.draft_tokens", "num_frames", "alpasim.max_sessions")) for o in args.overrides):
        raise TerraInputError("benchmark_defaults sets sampling.draft_tokens, num_frames and alpasim.max_sessions "
                              "itself: give --draft-tokens, --frames, --paths instead")
    records: list[dict] = []
    print(HEADER)
    print("|---|---|---:|---:|---:|---:|---|")
    for path in args.paths:
        ran: set = set()
        for setting in args.draft_tokens:
            if setting != "auto" and int(setting) in ran:
                continue  # the defaults ran this block already
            overrides = [*args.overrides, f"sampling.draft_tokens={setting}"]
            if path == "generate":
                record = run_generate(overrides, args.frames)
            else:
                record = run_alpasim(overrides, 1 if path == "alpasim1" else 16, args.chunks)
            ran.add(record["block"])
            records.append({"path": path, "setting": "defaults" if setting == "auto" else
                            f"sampling.draft_tokens={setting}", **record})
            print(row(records[-1]), flush=True)
    for path in args.paths:
        mine = [r for r in records if r["path"] == path]
        best = min(mine, key=lambda r: r[args.by])
        default = next((r for r in mine if r["setting"] == "defaults"), None)
        if default is not None:
            print(f"{path}: the defaults ({default['block']}) take {default[args.by] / best[args.by]:.2f}x the "
                  f"fastest run's {args.by} ({best['setting']})", flush=True)
    if args.out:
        write_text(args.out, json_text({"command": " ".join(sys.argv), "machine": platform.node(),
                                        "overrides": args.overrides, "records": records}))
    return records


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_defaults")(main)())
