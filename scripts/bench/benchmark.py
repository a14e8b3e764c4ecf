#!/usr/bin/env python
"""Speed of Terra's world model: Transformers vs vLLM, single stream and batched, on one GPU.

Every configuration ("part") runs in a fresh subprocess, so each engine's GPU memory is gone before the next
one starts, and a part killed by a time limit loses nothing finished before it: each part writes
``OUT/<part>.json`` the moment it is done. At the end one table covers every part JSON found in ``OUT``.

Parts:

* ``hf``      Transformers backend (KV-cached frame loop, the ``generate``-with-dynamic-cache way), single stream.
* ``vllm``    Terra on our vLLM backend, CUDA graphs + prefix caching, single stream; prefix reuse per frame.
* ``eager``   the same with ``enforce_eager`` (what CUDA graphs buy).
* ``plain``   vLLM's own ``LlamaForCausalLM`` of the same shape, driven the same way, single stream and batched
              at ``--compare-batch-sizes``: the baseline for the cost of the action / position embeddings.
* ``batched`` Terra on vLLM, B concurrent rollouts for every B in ``--batch-sizes``, plus a greedy rollout.
* ``fp8``     ``batched`` with ``kv_cache_dtype="fp8"`` at ``--compare-batch-sizes``; its greedy rollout is
              compared token by token with ``batched``'s.
* ``profile`` ``vllm`` with vLLM's engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its
              single-stream speed, then where one decode step's time goes: vLLM's scheduler, model runner,
              sampler and output processing timed on the CPU, and the GPU's kernel time (torch.profiler).
* ``boundary`` the engine core in this process too: ``--compare-batch-sizes``' first count of rollouts, ``--context``
              frames, ``--batched-frames`` generated in lockstep; where the wall time goes: our request building,
              vLLM's input processing and hashing, its scheduler, model runner, sampler, output processing, waiting
              for the GPU (bench/lib/profiling.py ``boundary_split``), and NVML's GPU busy share.
* ``e2e``     one rollout of ``--context`` + ``--batched-frames`` frames through :class:`WorldModelPipeline`
              with a random Terra-sized LFQ tokenizer (or ``--tokenizer``): encode, generate, decode, MP4;
              plus the tokenizer's encode/decode frames/s at its full size (288x512 for Terra).

Weights are random unless ``--model PATH`` is given: only ``config.json`` of Terra's published shape is
written, vLLM initialises the weights itself (``load_format="dummy"``) and the Transformers model is built
directly on the GPU. Sampling is temperature 1 over the full image codebook. Examples::

    python scripts/bench/benchmark.py --parts hf,vllm --hf-frames 1 --out bench   # each line: one GPU call of
    python scripts/bench/benchmark.py --parts eager,plain --out bench              # at most 10 minutes (estimated)
    python scripts/bench/benchmark.py --parts batched --out bench
    python scripts/bench/benchmark.py --parts fp8,e2e --out bench
    python scripts/bench/benchmark.py --table --out bench                       # the table of what is in bench/
    python scripts/bench/benchmark.py --tiny --parts hf,vllm --out /tmp/bench   # CPU: tiny model, vLLM's CPU engine

The code lives in the package ``scripts/bench/`` (one module per concept, listed in its ``__init__``); this
file is the command itself: the parent process, the worker subprocesses and the summary.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Sequence

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib import PARTS, derived, load_records, parse_args, run_part, table, write_model_configs  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402


def run_worker(args: argparse.Namespace) -> None:
    """Subprocess side: run one part and write ``OUT/<part>.json`` atomically."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated part still shuts its engine down
    record = run_part(args.worker, args)
    write_text(args.out / f"{args.worker}.json", json_text(record, indent=1))


def run_parent(argv: list[str], args: argparse.Namespace) -> dict[str, str]:
    """Run each part in its own subprocess, stopped at ``--part-timeout``; return the failures.

    Workers stay in our process group, so a time limit that kills this command's group (``timeout``, a job
    runner) also ends them and the engines they started, leaving the GPU free for the next command.
    """
    write_model_configs(args)
    failures: dict[str, str] = {}
    for name in args.part_names:
        print(f"[benchmark] part {name}: {PARTS[name].description}", flush=True)
        env = dict(os.environ, **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if PARTS[name].in_process else {}))
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv, "--worker", name], env=env)
        try:
            rc = proc.wait(timeout=args.part_timeout)
        except subprocess.TimeoutExpired:
            rc = f"timed out after {args.part_timeout:g} s"
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if rc != 0:
            failures[name] = f"exit {rc}" if isinstance(rc, int) else rc
    return failures


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for bad input, 1 when a part failed)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except TerraInputError as err:
        print(f"benchmark: error: {err}", file=sys.stderr)
        return 2
    if args.worker:
        run_worker(args)
        return 0
    failures = {} if args.table else run_parent(argv, args)
    records = load_records(args.out)
    write_text(args.out / "summary.json", json_text(
        {"command": shlex.join(["scripts/bench/benchmark.py", *argv]), "failures": failures,
         "derived": derived(records)}, indent=1))
    print(table(records, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
