#!/usr/bin/env python
"""Speculative decoding's guess sources (``sampling.guesses``, and the experiments of
scripts/bench/lib/first_guesses.py): passes per frame each.

The same rollouts decoded once sequentially and once speculatively per source, temperature and block
(``sampling.draft_tokens``; ``frame`` is the whole frame) on the Transformers backend in float32, one rollout at a
time: one rollout per manoeuvre of the synthetic world (3 built-in context frames, seed = its index) and a
closed-loop drive (a lane-following policy reacting to the model's own frames for ``--drive-seconds``; its actions
are then replayed as a rollout, which gives the drive's frames: a session equals a batch rollout with the same
actions and seed). Every speculative rollout's codes must equal the sequential ones (the run fails otherwise).
Prints a table of passes per frame (source x rollout), the share of first guesses that were the frame's codes, the
CPU milliseconds a frame spent making guesses (one
core) and the CPU seconds a frame the whole decode took (one thread). Sources: ``previous``, ``transitions`` and
``lookahead`` (``sampling.guesses``), ``warp`` (the previous frame moved by the
ego motion, an experiment); ``--oracle-shares`` adds a ceiling for any source of first guesses: a frame's guesses
are its own sequential codes at that share of positions (drawn at random) and the previous frame's codes elsewhere.
Examples::

    python scripts/bench/benchmark_guesses.py                                   # demo model, the full table
    python scripts/bench/benchmark_guesses.py --model RUN/world_model --tokenizer RUN/tokenizer --out guesses.json
    python scripts/bench/benchmark_guesses.py --frames 2 --drive-seconds 0 --temperatures 0.9 --draft-tokens frame
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import transformers

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (  # noqa: E402
    DRAFT_TOKENS, TEMPERATURE, THREADS, Parser, check_output, exit_2_on_input_error, existing, in_range, listed,
    one_of, word_or)
from bench.lib.first_guesses import first_guesses, oracle, warped  # noqa: E402
from terra.closedloop.loop import DriveSpec, run_drives  # noqa: E402
from terra.closedloop.policies.builtin import REFERENCE_POLICIES  # noqa: E402
from terra.closedloop.scenarios import synthetic_scenarios  # noqa: E402
from terra.closedloop.worlds import ModelWorld  # noqa: E402
from terra.config.assets import DEMO  # noqa: E402
from terra.config.sampling import GUESSES, SamplingConfig  # noqa: E402
from terra.contract.actions import FRAME_RATE_HZ  # noqa: E402
from terra.inputs.trajectory import MANOEUVRES as ALL_MANOEUVRES  # noqa: E402
from terra.core.atomic import write_text  # noqa: E402
from terra.generation import guesses, speculative  # noqa: E402
from terra.generation.rollout import RolloutRequest, RolloutState  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.sim import builtin_context  # noqa: E402

MANOEUVRES = ("straight", "curve_left", "curve_right", "lane_change_left", "lane_change_right", "decelerate",
              "stop")  # decelerate and stop: braking
DRIVE_POLICY = "lane_follower"
NUM_CONTEXT = 3
SOURCES = (*GUESSES, "warp")  # sampling.guesses' and the experiment's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    model = existing("folder", "config.json")
    parser = Parser("benchmark_guesses", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=model, default=DEMO / "world_model", help="world-model folder (demo)")
    parser.add_argument("--tokenizer", type=model, default=DEMO / "tokenizer", help="its tokenizer folder (demo)")
    parser.add_argument("--sources", type=listed(one_of(*SOURCES)), default=",".join(SOURCES),
                        help=f"comma-separated, of {', '.join(SOURCES)}")
    parser.add_argument("--temperatures", type=listed(TEMPERATURE), default="0.9,1.0")
    parser.add_argument("--draft-tokens", type=listed(word_or("frame", DRAFT_TOKENS)), default="frame,32",
                        help="comma-separated counts; frame: the whole frame")
    parser.add_argument("--manoeuvres", type=listed(one_of(*ALL_MANOEUVRES)), default=",".join(MANOEUVRES))
    parser.add_argument("--frames", type=in_range(int, 1, 1000), default=8, help="frames generated per manoeuvre "
                        "rollout")
    parser.add_argument("--drive-seconds", type=in_range(float, 0, 3600), default=20.0,
                        help="closed-loop drive length; 0: none")
    parser.add_argument("--oracle-shares", type=listed(in_range(float, 0, 1), empty=True), default="",
                        help="comma-separated shares of true first guesses, e.g. 0.9")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch CPU threads")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    args = parser.parse_args(argv)
    args.draft_tokens = [0 if k == "frame" else k for k in args.draft_tokens]
    if args.out:
        check_output(args.out, "--out", [args.model, args.tokenizer])
    return args


def manoeuvre_rollouts(pipeline: WorldModelPipeline, names: list[str], frames: int) -> dict[str, RolloutRequest]:
    """One rollout per manoeuvre from a built-in scene, seed = its index."""
    out = {}
    for i, name in enumerate(names):
        images, actions = builtin_context(name, NUM_CONTEXT + frames, pipeline.image_size, i, {})
        out[name] = RolloutRequest(pipeline.encode(images[:NUM_CONTEXT]), actions, frames, seed=i)
    return out


class KeptContext(ModelWorld):
    """The model world keeping each drive's context codes (to replay the drive as a rollout) and the forward passes
    each of its frames took in the session when it closes."""

    def __init__(self, pipeline: WorldModelPipeline, sampling: SamplingConfig) -> None:
        super().__init__(pipeline, sampling)
        self.context: dict[int, np.ndarray] = {}
        self.passes: dict[int, list[int]] = {}

    def close(self, drive) -> None:
        self.context[drive.seed] = drive.context.reshape(len(drive.context), -1)
        self.passes[drive.seed] = list(drive.rollout.state.passes)
        super().close(drive)


def closed_loop_rollout(pipeline: WorldModelPipeline, sampling: SamplingConfig, seconds: float,
                        seed: int = 100) -> tuple[RolloutRequest, float]:
    """A lane-following drive of ``seconds`` on the model's frames (synthetic scenario 0), as the rollout that
    replays it (its context codes, the actions the policy chose, its seed), and the passes a frame it took live (a
    session learns each action after the frame: ``lookahead`` guesses under the last one)."""
    steps = round(seconds * FRAME_RATE_HZ)
    [scenario] = synthetic_scenarios(1, 0, pipeline.image_size, NUM_CONTEXT)
    world = KeptContext(pipeline, sampling)
    try:
        [drive] = run_drives(world, [DriveSpec(scenario, DRIVE_POLICY, REFERENCE_POLICIES[DRIVE_POLICY], seed)],
                             steps)
    finally:
        world.shutdown()
    if not drive.ok:
        raise SystemExit(f"benchmark_guesses: the closed-loop drive failed: {drive.error}")
    actions = np.concatenate([scenario.actions, np.stack(drive.actions)])
    return (RolloutRequest(world.context[seed], actions, len(drive.actions), seed=seed),
            float(np.mean(world.passes[seed])))


class GuessClock:
    """CPU seconds spent making guesses (the transitions' memory, the lookahead's draws past the frame: not their
    noise, which the next frame takes over instead of drawing it; an experiment's first guesses), counted on the
    calling thread's CPU clock: what they cost one core, however busy the machine is."""

    def __init__(self) -> None:
        self.seconds = 0.0

    @contextmanager
    def running(self) -> Iterator["GuessClock"]:
        patched = [(guesses.Transitions, "record"), (guesses.Transitions, "recall"),
                   (speculative.SpeculativeFrame, "ahead_drafts"), (speculative, "_draw_ahead"),
                   (speculative.SpeculativeFrame, "handover")]
        originals = [getattr(owner, name) for owner, name in patched]
        for (owner, name), original in zip(patched, originals):
            setattr(owner, name, self.timed(original))
        try:
            yield self
        finally:
            for (owner, name), original in zip(patched, originals):
                setattr(owner, name, original)

    def timed(self, function):
        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start
        return timed


@contextmanager
def first_guesses_seen() -> Iterator[list[tuple[RolloutState, int, np.ndarray]]]:
    """Every speculative frame the Transformers backend starts: its rollout, index and first guesses ``[P]``."""
    seen, original = [], speculative.SpeculativeRows.add

    def add(rows: speculative.SpeculativeRows, state: RolloutState, sampling: SamplingConfig) -> None:
        original(rows, state, sampling)
        seen.append((state, state.next_frame, rows._frames[-1].frame.later.cpu().numpy()))

    speculative.SpeculativeRows.add = add
    try:
        yield seen
    finally:
        speculative.SpeculativeRows.add = original


def guessing(source: str, clock: GuessClock, truth: dict[int, np.ndarray]):
    """The context a source's rollouts run in: the clock, and an experiment's first guesses."""
    if source.startswith("oracle_"):
        return first_guesses(oracle(truth, float(source[len("oracle_"):])))
    if source == "warp":
        return first_guesses(clock.timed(warped))
    return clock.running()


def run(pipeline: WorldModelPipeline, request: RolloutRequest, sampling: SamplingConfig) -> tuple[np.ndarray, list]:
    [state] = pipeline.backend.run_rollouts([request], sampling, progress=False)
    return state.generated(), state.passes


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    pipeline = WorldModelPipeline.from_pretrained(args.model, args.tokenizer, backend="hf", device="cpu",
                                                  dtype="float32")
    image_tokens = pipeline.backend.layout.image_tokens
    base = manoeuvre_rollouts(pipeline, args.manoeuvres, args.frames)
    records, live = [], []
    for temperature in args.temperatures:
        rollouts = dict(base)
        if args.drive_seconds > 0:
            drive_sampling = pipeline.backend.as_run(SamplingConfig(  # the default guesses, as the backend runs them
                temperature=temperature, decoding="speculative", draft_tokens=image_tokens))
            name = f"closed_loop_{args.drive_seconds:g}s"
            rollouts[name], passes = closed_loop_rollout(pipeline, drive_sampling, args.drive_seconds)
            live.append({"temperature": temperature, "draft_tokens": image_tokens, "source": drive_sampling.guesses,
                         "passes_per_frame": round(passes, 2)})
            print(f"T={temperature:g} block={image_tokens} {drive_sampling.guesses}: the {name} drive took "
                  f"{passes:.2f} passes a frame live (its replay: the rows below)", flush=True)
        sequential = SamplingConfig(temperature=temperature, decoding="sequential")
        truth = {name: run(pipeline, request, sequential)[0] for name, request in rollouts.items()}
        truth_of = {id(rollouts[name]): codes for name, codes in truth.items()}
        for draft_tokens in args.draft_tokens:
            block = draft_tokens or image_tokens
            for source in args.sources + [f"oracle_{share:g}" for share in args.oracle_shares]:
                experiment = source not in GUESSES
                sampling = sequential.replace(decoding="speculative", draft_tokens=block,
                                              guesses="previous" if experiment else source)
                record = {"temperature": temperature, "draft_tokens": block, "source": source, "rollouts": {},
                          "frames": {}}
                clock, frames, total, cpu = GuessClock(), 0, 0, 0.0
                with guessing(source, clock, truth_of), first_guesses_seen() as seen:
                    for name, request in rollouts.items():
                        started = time.thread_time()
                        codes, passes = run(pipeline, request, sampling)
                        cpu += time.thread_time() - started
                        if not np.array_equal(codes, truth[name]):
                            raise SystemExit(f"benchmark_guesses: {source} at T={temperature:g}, block {block}: "
                                             f"the codes of {name} differ from sequential decoding's")
                        record["rollouts"][name] = round(float(np.mean(passes)), 2)
                        record["frames"][name] = len(passes)
                        frames, total = frames + len(passes), total + sum(passes)
                record["mean"] = round(float(np.mean(list(record["rollouts"].values()))), 2)
                record["per_frame"] = round(total / frames, 2)
                record["cpu_s_per_frame"] = round(cpu / frames, 4)  # the whole decode, this thread
                record["first_guesses_right"] = round(float(np.mean([np.mean(first == state.frames[frame])
                                                                     for state, frame, first in seen])), 3)
                record["guess_ms_per_frame"] = (None if source.startswith("oracle_")
                                                else round(1000 * clock.seconds / frames, 3))
                record["codes_equal_sequential"] = True
                records.append(record)
                print(format_record(record), flush=True)
    result = {"command": " ".join(sys.argv), "model": str(args.model), "image_tokens": image_tokens,
              "frames_per_rollout": args.frames, "drive_seconds": args.drive_seconds, "threads": args.threads,
              "torch": torch.__version__, "transformers": transformers.__version__, "records": records,
              "live_drives": live}
    print(table(records))
    if args.out:
        write_text(args.out, json.dumps(result, indent=2) + "\n")
    return result


def format_record(record: dict) -> str:
    rollouts = " ".join(f"{name}={value:g}" for name, value in record["rollouts"].items())
    return (f"T={record['temperature']:g} block={record['draft_tokens']} {record['source']:<11} "
            f"mean {record['mean']:5.2f} passes/frame ({record['per_frame']:.2f} over all frames), "
            f"first guesses right {record['first_guesses_right']:.1%}, "
            f"guesses {milliseconds(record)} ms/frame, decoding {record['cpu_s_per_frame']:.3f} CPU s/frame; "
            f"{rollouts}")


def table(records: list[dict]) -> str:
    """Markdown: a row per temperature, block and source; a column per rollout, their mean, the mean over all
    frames."""
    names = list(records[0]["rollouts"]) if records else []
    lines = ["| temperature | block | source | " + " | ".join(names)
             + " | mean | all frames | first guesses right | guesses ms/frame | CPU s/frame |",
             "|---:|---:|---|" + "---:|" * (len(names) + 5)]
    for r in records:
        cells = " | ".join(f"{r['rollouts'][n]:.2f}" for n in names)
        lines.append(f"| {r['temperature']:g} | {r['draft_tokens']} | {r['source']} | {cells} | {r['mean']:.2f} | "
                     f"{r['per_frame']:.2f} | {r['first_guesses_right']:.1%} | {milliseconds(r)} | "
                     f"{r['cpu_s_per_frame']:.3f} |")
    return "\n".join(lines)


def milliseconds(record: dict) -> str:
    return "–" if record["guess_ms_per_frame"] is None else f"{record['guess_ms_per_frame']:.3f}"


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_guesses")(main)())
