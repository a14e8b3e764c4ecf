#!/usr/bin/env python
"""A speculative pass's host time on the Transformers backend: the CPU work of a pass without the forward.

Runs ``--rollouts`` rollouts of ``--frames`` frames (built-in context scenes, the manoeuvres in turn, seed = index)
on the demo model (or ``--model``), ``--sessions`` of them in flight at once (1: one after another, as
``terra-generate`` runs a sample; N: N started together, as N AlpaSim sessions, the backend stepping every one of
them each poll; a run has at least N rollouts), decoded as ``terra-generate`` decodes them (``sampling.decoding``
speculative, the rest of the sampling settings as given, the defaults otherwise), and measures on this thread's CPU
clock (one torch thread: every kernel runs on it) the time of the whole run and, exclusive of what they call, of
the parts a pass is made of (terra/generation/speculative.py):

* ``forward``: the model's forward pass (``model.forward``) but for its KV cache's writes;
* ``kv writes``: the KV cache's writes inside the forward pass (its layers' ``update``: the Transformers
  ``DynamicCache`` concatenates the whole cache every pass, a window's buffer writes the pass's positions);
* ``noise``: the Gumbel noise of the positions a pass scores (terra/generation/sampling.py, ``gumbel_noise``);
* ``sampling``: the draws (``sample_image_tokens``);
* ``rule``: acceptance and refill (``accepted_guesses``, ``next_guesses``);
* ``transitions``: ``sampling.guesses=transitions``' memory (terra/generation/guesses.py);
* ``cache``: cutting the KV cache back to the committed tokens, and a frame's cache taken in and out;
* ``rest``: everything else: the pass's inputs, the frame's bookkeeping, the rollout's loop.

The host time of a pass is the run's CPU time less ``forward``'s and the KV writes', over the passes (a rollout's
forward pass each); beside it, the same with the KV writes (copies the backend makes, not the model's arithmetic),
and the host time of a step (a ``poll``: one pass of every rollout in flight). One line of a markdown table per
count of sessions and setting (``--sessions``, ``--draft-tokens``, ``--guesses``), and the records as JSON with
``--out``. Examples::

    OMP_NUM_THREADS=1 python scripts/bench/benchmark_host.py                        # the defaults, 8 x 8 frames
    OMP_NUM_THREADS=1 python scripts/bench/benchmark_host.py --draft-tokens 32,144 --guesses lookahead,previous
    OMP_NUM_THREADS=1 python scripts/bench/benchmark_host.py --sessions 1,16,64 --frames 4   # sessions in flight
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (DRAFT_TOKENS, TEMPERATURE, Parser, check_output, exit_2_on_input_error,  # noqa: E402
                           existing, in_range, listed, one_of)
from terra.config.assets import DEMO  # noqa: E402
from terra.config.sampling import GUESSES, SamplingConfig  # noqa: E402
from terra.core.atomic import write_text  # noqa: E402
from transformers.cache_utils import DynamicLayer  # noqa: E402

from terra.generation import guesses, kv, speculative  # noqa: E402
from terra.generation.rollout import RolloutRequest  # noqa: E402
from terra.inputs.trajectory import MANOEUVRES  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.sim import builtin_context  # noqa: E402

# the parts, and the callables each one is made of, as (module or class, attribute name) where they are called
PARTS: dict[str, list[tuple[Any, str]]] = {
    "noise": [(speculative, "gumbel_noise")],
    "sampling": [(speculative, "sample_image_tokens")],
    "rule": [(speculative, "accepted_guesses"), (speculative, "next_guesses")],
    "transitions": [(guesses.Transitions, "record"), (guesses.Transitions, "recall")],
    "cache": [(speculative, "crop"), (speculative, "kv_cache"), (speculative, "kv_tensors")],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=existing("folder", "config.json"), default=DEMO / "world_model",
                        help="world-model folder (demo)")
    parser.add_argument("--tokenizer", type=existing("folder"), default=DEMO / "tokenizer",
                        help="its tokenizer folder (demo)")
    parser.add_argument("--rollouts", type=in_range(int, 1, 4096), default=8, help="rollouts a run (at least "
                                                                                   "--sessions)")
    parser.add_argument("--sessions", type=listed(in_range(int, 1, 1024)), default=[1],
                        help="comma list of rollouts in flight at once (1: one after another)")
    parser.add_argument("--frames", type=in_range(int, 1, 1000), default=8, help="frames generated per rollout")
    parser.add_argument("--num-context", type=in_range(int, 1, 16), default=3)
    parser.add_argument("--temperature", type=TEMPERATURE, default=SamplingConfig().temperature)
    parser.add_argument("--draft-tokens", type=listed(DRAFT_TOKENS, empty=True), default=[],
                        help="comma list of sampling.draft_tokens (none: the default)")
    parser.add_argument("--guesses", type=listed(one_of(*GUESSES), empty=True), default=[],
                        help=f"comma list of sampling.guesses ({', '.join(GUESSES)}; none: the default)")
    parser.add_argument("--out", type=Path, help="write the records as JSON here")
    args = parser.parse_args(argv)
    if args.out is not None:
        with parser.one_line_errors():
            check_output(args.out, "--out")
    return args


class PartClock:
    """Thread CPU time spent in each wrapped callable, exclusive of the wrapped callables it calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open call: [its start, the time of the wrapped calls inside]

    def wrap(self, part: str, function: Callable) -> Callable:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([time.thread_time(), 0.0])
            try:
                return function(*args, **kwargs)
            finally:
                start, inner = self._stack.pop()
                spent = time.thread_time() - start
                self.seconds[part] = self.seconds.get(part, 0.0) + spent - inner
                if self._stack:
                    self._stack[-1][1] += spent
        return timed

    @contextmanager
    def around(self, owner: Any, name: str, part: str) -> Iterator[None]:
        """``owner.name`` counted as ``part`` inside the block (restored after)."""
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        setattr(owner, name, self.wrap(part, original))
        try:
            yield
        finally:
            setattr(owner, name, original)


def requests(pipeline: WorldModelPipeline, args: argparse.Namespace, count: int) -> list[RolloutRequest]:
    """``count`` rollouts from built-in scenes, the manoeuvres in turn, seed = index."""
    out = []
    for i in range(count):
        images, actions = builtin_context(MANOEUVRES[i % len(MANOEUVRES)], args.num_context + args.frames,
                                          pipeline.image_size, i, {})
        out.append(RolloutRequest(pipeline.encode(images[: args.num_context]), actions, args.frames, seed=i))
    return out


# the KV cache's writes in a forward pass: every cache layer class's own update
KV_WRITES = [(layer, "update") for layer in (DynamicLayer, getattr(kv, "BufferLayer", None)) if layer is not None]


def timed_run(pipeline: WorldModelPipeline, reqs: list[RolloutRequest], sessions: int, sampling: SamplingConfig,
              parts: dict[str, list[tuple[Any, str]]]) -> tuple[int, int, int, float, dict[str, float]]:
    """The rollouts ``sessions`` at a time (started together) under ``sampling``, with ``parts`` and the forward
    timed: frames, passes, steps (the backend's polls), the run's CPU seconds and each part's."""
    clock, backend, steps = PartClock(), pipeline.backend, [0]
    poll = backend.poll

    def counted() -> Any:
        steps[0] += 1
        return poll()

    with ExitStack() as stack:
        stack.enter_context(clock.around(backend.model, "forward", "forward"))
        for part, places in parts.items():
            for owner, name in places:
                if name in vars(owner):
                    stack.enter_context(clock.around(owner, name, part))
        backend.poll = counted
        stack.callback(vars(backend).pop, "poll")
        start = time.thread_time()
        states = [state for first in range(0, len(reqs), sessions)
                  for state in backend.run_rollouts(reqs[first: first + sessions], sampling, progress=False)]
        total = time.thread_time() - start
    passes = sum(sum(state.passes) for state in states)
    return sum(len(state.passes) for state in states), passes, steps[0], total, clock.seconds


def measure(pipeline: WorldModelPipeline, reqs: list[RolloutRequest], sessions: int, sampling: SamplingConfig) -> dict:
    """Passes, the CPU time of a pass and its host time (the run less its forward passes, with nothing else timed),
    then where the host time goes (a second run with every part timed: the split, whose own clock adds a little)."""
    frames, passes, steps, total, seconds = timed_run(pipeline, reqs, sessions, sampling, {"kv writes": KV_WRITES})
    writes = seconds.get("kv writes", 0.0)
    host = total - seconds.get("forward", 0.0) - writes
    *_, split_total, split = timed_run(pipeline, reqs, sessions, sampling, {"kv writes": KV_WRITES, **PARTS})
    parts = {part: split.get(part, 0.0) for part in ["forward", "kv writes", *PARTS]}
    parts["rest"] = split_total - sum(parts.values())
    return {"sessions": sessions, "rollouts": len(reqs), "draft_tokens": sampling.draft_tokens,
            "guesses": sampling.guesses, "temperature": sampling.temperature,
            "frames": frames, "passes": passes, "steps": steps, "passes_per_frame": round(passes / frames, 3),
            "cpu_ms_per_frame": round(1e3 * total / frames, 3), "cpu_ms_per_pass": round(1e3 * total / passes, 4),
            "host_ms_per_pass": round(1e3 * host / passes, 4),
            "host_and_kv_writes_ms_per_pass": round(1e3 * (host + writes) / passes, 4),
            "host_ms_per_step": round(1e3 * host / steps, 4),
            "parts_ms_per_pass": {part: round(1e3 * seconds / passes, 4) for part, seconds in parts.items()}}


def row(record: dict) -> str:
    """``record`` as a markdown table row (the columns of :data:`HEADER`)."""
    parts = record["parts_ms_per_pass"]
    cells = [str(record["sessions"]), str(record["draft_tokens"]), record["guesses"],
             f"{record['passes_per_frame']:.2f}", f"{record['cpu_ms_per_frame']:.1f}", f"{parts['forward']:.3f}",
             f"**{record['host_ms_per_pass']:.3f}**", f"{record['host_and_kv_writes_ms_per_pass']:.3f}",
             f"{record['host_ms_per_step']:.2f}", *(f"{parts[name]:.3f}" for name in [*PARTS, "rest"])]
    return "| " + " | ".join(cells) + " |"


HEADER = ("| sessions | block | guesses | passes a frame | CPU ms a frame | forward ms a pass | host ms a pass | "
          "host and KV writes | host ms a step | " + " | ".join(f"{name}" for name in [*PARTS, "rest"]) + " |")


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    torch.set_num_threads(1)
    pipeline = WorldModelPipeline.from_pretrained(args.model, args.tokenizer, backend="hf", device="cpu",
                                                  num_threads=1)
    reqs = requests(pipeline, args, max(args.rollouts, *args.sessions))
    default = pipeline.backend.as_run(SamplingConfig(temperature=args.temperature, decoding="speculative"))
    settings = [default.replace(**({"draft_tokens": block} if block else {}), **({"guesses": source} if source
                                                                               else {}))
                for block in args.draft_tokens or [None] for source in args.guesses or [None]]
    measure(pipeline, reqs[:1], 1, settings[0])  # warm-up: the first forward passes build torch's kernels
    print(HEADER)
    print("|" + "---|" * HEADER.count(" | ") + "---|")
    records = []
    for sessions in args.sessions:
        for sampling in settings:
            records.append(measure(pipeline, reqs[: max(args.rollouts, sessions)], sessions, sampling))
            print(row(records[-1]), flush=True)
    if args.out:
        write_text(args.out, json.dumps({"command": " ".join(sys.argv), "records": records}, indent=2) + "\n")
    return records


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_host")(main)())
