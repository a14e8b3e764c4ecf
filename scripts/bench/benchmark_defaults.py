#!/usr/bin/env python
"""Each path at its defaults and at other blocks, in one run: passes a frame, seconds, frames a second and real time,
as rows of benchmarks/decoding.md's tables ("The defaults against the best", "Sessions on one GPU").

The paths, each run as its app runs it, with the app's own settings and the overrides after the options (Hydra's,
e.g. ``backend=vllm device=cuda``):

* ``generate``: ``terra-generate``'s run (terra/apps/generate.py) of one sample of ``--frames`` frames, the default
  manoeuvre; its seconds a frame are the sidecar's ``generate_s`` over the frames (the model loaded, nothing written
  yet);
* ``alpasim``: scripts/bench/benchmark_alpasim.py with each count of ``--sessions`` AlpaSim sessions at once, one after
  another on one server built as ``terra-alpasim`` builds it at its defaults (room for ``alpasim.max_sessions``, more
  if a count asks for more), ``--chunks`` chunks of 8 frames after a first of 5; its seconds are an 8-frame chunk's
  (p50, and p90), its frames a second all sessions' together.

Real time is 10 frames a second (an 8-frame chunk is 0.8 s of a drive): ``x real time`` is a session's 0.8 s over its
chunk's p50, and ``terra-generate``'s frames a second over 10. Beside the seconds, the process's CPU seconds (every
thread) for the same unit: on a CPU shared with other work the wall time says little, the CPU time what the run cost.
Who waits over each row (bench/lib/occupancy.py): the GPU's busy share (NVML every 50 ms: mean, p10-p90; "–" without
NVML), and the CPU seconds over wall seconds of vLLM's engine-core process ("–" where it has none) and of this process,
the client (every thread: for ``alpasim``, the server's and its clients').
The run starts with the card (or the CPU), the versions and the commit (``git`` in the checkout; ``--commit`` names it
where the tree is a copy without git).

For each path, ``--draft-tokens`` lists the settings: ``auto`` is the defaults (the block ``decoding=auto`` picks,
terra/generation/decoding.py), a number sets ``sampling.draft_tokens``; a block the defaults already ran is not run
again. One markdown row per run, then each path's defaults against its fastest run. Examples::

    OMP_NUM_THREADS=1 python scripts/bench/benchmark_defaults.py --frames 16 --chunks 2 --by cpu_s --sessions 1,16 \\
        --draft-tokens auto,16,48,64,144 backend=hf device=cpu                           # the CPU rows
    python scripts/bench/benchmark_defaults.py --frames 64 --chunks 4 --sessions 1,16,64 --draft-tokens auto \\
        backend=vllm device=cuda --out defaults_gpu.json                                 # one GPU's rows (~5 min)
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (CHECKOUT, DRAFT_TOKENS, Parser, check_output, compose_config,  # noqa: E402
                           exit_2_on_input_error, in_range, listed, one_of)
from bench.lib.occupancy import OCCUPANCY, Occupancy, occupancy_cells  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402

PATHS = ("generate", "alpasim")
REAL_TIME_FPS = 10.0  # Terra's frames are 100 ms apart
CHUNK = 8  # frames of an AlpaSim chunk after the first (benchmark_alpasim.py's)
HEADER = ("| path | sessions | setting | block | passes a frame | seconds | p90 | frames/s | x real time | CPU seconds "
          "| of | GPU busy % (p10-p90) | engine-core CPU | client CPU |")


def draft_setting(text: str) -> str:
    """An argparse ``type``: ``auto`` or a ``sampling.draft_tokens`` in its range."""
    return text if text == "auto" else str(DRAFT_TOKENS(text))


draft_setting.__name__ = "draft_tokens"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--paths", type=listed(one_of(*PATHS)), default=list(PATHS),
                        help=f"comma list of {', '.join(PATHS)}")
    parser.add_argument("--sessions", type=listed(in_range(int, 1, 1024)), default=[1, 16, 64],
                        help="alpasim: comma list of sessions at once, each count a row (one server for all)")
    parser.add_argument("--draft-tokens", type=listed(draft_setting), default=["auto", "32", "144"],
                        help="comma list of settings: auto (the defaults) or a sampling.draft_tokens")
    parser.add_argument("--frames", type=in_range(int, 1, 3000), default=64, help="generate: frames of its one sample")
    parser.add_argument("--chunks", type=in_range(int, 1, 1000), default=8,
                        help="alpasim: 8-frame chunks a session, after one of 5")
    parser.add_argument("--by", choices=("seconds", "cpu_s"), default="seconds",
                        help="what the defaults are compared by: the wall seconds (a machine to itself) or the CPU "
                             "seconds (a CPU shared with other work)")
    parser.add_argument("--commit", help="the code's commit, where the checkout has no git (default: git's)")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    parser.add_argument("overrides", nargs="*", help="the apps' settings, e.g. backend=vllm device=cuda")
    args = parser.parse_args(argv)
    if args.out is not None:
        with parser.one_line_errors():
            check_output(args.out, "--out")
    return args


def run_generate(overrides: list[str], frames: int) -> dict:
    """terra-generate's run of one sample: its block, passes a frame, seconds a frame (the sidecar's) and the
    process's CPU seconds a frame while it generated."""
    from terra.apps.generate import generate_spec, run
    from terra.pipeline import WorldModelPipeline

    generate, cpu, occupancy = WorldModelPipeline.generate, [], []

    def timed(self, *args, **kwargs):
        start, busy = time.process_time(), Occupancy(str(self.device))
        try:
            with busy:
                return generate(self, *args, **kwargs)
        finally:
            cpu.append(time.process_time() - start)
            occupancy.append(busy.figures)

    with tempfile.TemporaryDirectory() as folder:
        cfg = compose_config("generate", [*overrides, f"num_frames={frames}", "num_samples=1", "output.formats=[gif]"])
        WorldModelPipeline.generate = timed
        try:
            run(generate_spec(cfg), Path(folder) / "out")
        finally:
            WorldModelPipeline.generate = generate
        sidecar = json.loads((Path(folder) / "out" / "rollout.json").read_text())
    decoding = sidecar["rollouts"][0]["decoding"]
    seconds = sidecar["timings_s"]["s_per_frame"]
    return {"path": "generate", "sessions": None, "block": decoding["draft_tokens"], "decoding": decoding["decoding"],
            "passes_per_frame": decoding["passes_per_frame"], "seconds": seconds, "p90": None,
            "frames_per_s": 1.0 / seconds, "realtime_x": 1.0 / seconds / REAL_TIME_FPS, "cpu_s": sum(cpu) / frames,
            "of": "s a frame", **occupancy[-1]}


def run_alpasim(overrides: list[str], sessions: list[int], chunks: int) -> list[dict]:
    """scripts/bench/benchmark_alpasim.py's records for each count of ``sessions`` at once, on one server with the
    room ``terra-alpasim`` makes at its defaults (``alpasim.max_sessions``), or more where a count asks for more:
    block, passes a frame, seconds a chunk (p50, p90), frames a second, real time."""
    from bench.benchmark_alpasim import main as alpasim

    from terra.alpasim.settings import AlpasimSettings

    room = max(AlpasimSettings.max_sessions, *sessions)
    records = alpasim(["--sessions", ",".join(map(str, sessions)), "--chunks", str(chunks),
                       "--engine-rollouts", str(room), *overrides])
    return [{"path": "alpasim", "sessions": record["sessions"], "engine_rollouts": room,
             "block": record["draft_tokens"] if record["decoding"] == "speculative" else None,
             "decoding": record["decoding"], "passes_per_frame": round(record["passes_per_frame"], 3),
             "seconds": record["chunk_p50_s"], "p90": record["chunk_p90_s"], "frames_per_s": record["frames_per_s"],
             "realtime_x": record["realtime_x"], "cpu_s": CHUNK * record["cpu_s_per_frame"],
             "of": "s an 8-frame chunk (p50)", **{key: record[key] for key in OCCUPANCY}} for record in records]


def row(record: dict) -> str:
    block = "sequential" if record["decoding"] == "sequential" else str(record["block"])
    p90 = "–" if record["p90"] is None else f"{record['p90']:.3f}"
    sessions = "–" if record["sessions"] is None else str(record["sessions"])
    return (f"| {record['path']} | {sessions} | {record['setting']} | {block} | {record['passes_per_frame']:.2f} | "
            f"{record['seconds']:.3f} | {p90} | {record['frames_per_s']:.1f} | {record['realtime_x']:.2f} | "
            f"{record['cpu_s']:.3f} | {record['of']} | {occupancy_cells(record)} |")


def commit(given: str | None) -> str:
    """The code's commit: ``given``, else git's in the checkout (with "+ uncommitted changes" where the tracked files
    differ from it), else a line saying it is unknown."""
    if given:
        return given
    try:
        head = subprocess.run(["git", "-C", str(CHECKOUT), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(CHECKOUT), "status", "--porcelain", "--untracked-files=no"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git checkout here: give --commit)"
    return head + (" + uncommitted changes" if changed else "")


def card(overrides: list[str]) -> dict:
    """The device the overrides run on (the last ``device=``, else the apps' ``auto``), its card and the versions
    (bench/lib/environment.py)."""
    from bench.lib.environment import environment
    from terra.core.device import check_device, resolve_device

    asked = [o.split("=", 1)[1] for o in overrides if o.startswith("device=")]
    device = resolve_device(check_device(asked[-1] if asked else "auto"))
    return environment(device)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    if any(o.startswith(("sampling.draft_tokens", "num_frames", "alpasim.max_sessions")) for o in args.overrides):
        raise TerraInputError("benchmark_defaults sets sampling.draft_tokens, num_frames and alpasim.max_sessions "
                              "itself: give --draft-tokens, --frames, --sessions instead")
    machine, code = card(args.overrides), commit(args.commit)
    print(f"card: {machine['gpu'] or 'none'} ({machine['device']}; CPU {machine['cpu']}, {platform.node()}); "
          f"commit: {code}; {machine['date_utc']}; torch {machine['torch']}, vLLM {machine['vllm']}, "
          f"transformers {machine['transformers']}, Python {machine['python']}", flush=True)
    records: list[dict] = []
    print(HEADER)
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for path in args.paths:
        ran: set = set()
        for setting in args.draft_tokens:
            if setting != "auto" and int(setting) in ran:
                continue  # the defaults ran this block already
            overrides = [*args.overrides, f"sampling.draft_tokens={setting}"]
            rows = ([run_generate(overrides, args.frames)] if path == "generate"
                    else run_alpasim(overrides, args.sessions, args.chunks))
            ran.update(r["block"] for r in rows)
            for record in rows:
                records.append({**record, "setting": "defaults" if setting == "auto" else
                                f"sampling.draft_tokens={setting}"})
                print(row(records[-1]), flush=True)
    for path, sessions in dict.fromkeys((r["path"], r["sessions"]) for r in records):
        mine = [r for r in records if (r["path"], r["sessions"]) == (path, sessions)]
        best = min(mine, key=lambda r: r[args.by])
        default = next((r for r in mine if r["setting"] == "defaults"), None)
        if default is not None and len(mine) > 1:
            name = path if sessions is None else f"{path} x{sessions}"
            print(f"{name}: the defaults ({default['block']}) take {default[args.by] / best[args.by]:.2f}x the "
                  f"fastest run's {args.by} ({best['setting']})", flush=True)
    if args.out:
        write_text(args.out, json_text({"command": " ".join(sys.argv), "machine": machine, "commit": code,
                                        "overrides": args.overrides, "records": records}))
    return records


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_defaults")(main)())
