"""Peak GPU memory and speed of each generation workflow at Terra's shape, uncapped and under each ``memory`` preset's
cap (16 and 24 GiB): one JSON and a printed markdown table (the generation rows of benchmarks/memory.md's memory table).

Workflows, each case (workflow x cap) in its own subprocess, alone on the card:

* ``vllm``: one vLLM engine with Terra's published shape (2.0 B, random weights: vLLM's ``load_format=dummy``) runs
  ``generate`` of one rollout (seconds per frame), then a batch of ``--batch`` rollouts (frames per second), then
  ``--sessions`` closed-loop sessions stepped from their own threads (terra/session/, frames per second). Uncapped:
  vLLM's defaults (90 % of the card, bf16). Capped: the settings :func:`terra.config.memory.plan_memory` picks for
  the preset on this card (FP8 KV / weights where needed, ``gpu_memory_utilization`` as the cap's share), the
  refiner after the engine (terra-generate's order);
* ``refine``: Terra's video refiner at full size, random bf16 weights, one 47-frame sample (scripts/
  benchmark_refiner.py), the process capped with ``torch.cuda.set_per_process_memory_fraction``;
* ``score``: the ACT-Bench estimator at full size on ``--videos`` synthetic 47-frame videos (scripts/
  benchmark_scoring.py), capped the same way;
* ``alpasim``: terra-alpasim's server (AlpaSim's ``WorldModelService``) with ``--sessions`` rollouts at once, each a
  first chunk of 5 frames then 8-frame chunks (scripts/bench/benchmark_alpasim.py's client), a world model of Terra's
  shape with random weights (written once: the server reads real ones) and a random tokenizer of Terra's shape decoding
  every frame; ``memory=`` the preset as a user sets it.

Peak memory is the card's used memory (NVML, every process: a vLLM engine runs in its own) sampled every 20 ms,
less what was in use before the case started; a case that fails under its cap (out of memory) is reported as such.

    python scripts/bench/benchmark_memory_table.py --out memory_table.json      # H100: ~3 min a vllm case

CPU smoke run (no card: peaks are not measured, the tiny refiner, estimator and models only; checks the plumbing;
the alpasim cases start vLLM's CPU engine, about a minute each on 2 cores):

    python scripts/bench/benchmark_memory_table.py --device cpu --workflows refine,score --out memory_cpu.json
    python scripts/bench/benchmark_memory_table.py --device cpu --workflows alpasim --caps uncapped,16GiB --sessions 2
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, exit_2_on_input_error, in_range, listed, one_of  # noqa: E402
from terra.config.memory import GIB, PRESETS, ModelShape, plan_memory, preset_cap  # noqa: E402
from terra.core.device import resolve_device  # noqa: E402
from terra.core.atomic import json_text, write_text  # noqa: E402

WORKFLOWS = ("vllm", "refine", "score", "alpasim")
LOG_LINE = re.compile(r"(^|\) )(INFO|DEBUG) ")  # vLLM's log lines, its engine core's "(EngineCore pid=..) INFO"
ALPASIM_CHUNKS = 2  # 8-frame chunks of each AlpaSim rollout after its first 5 frames
CAPS = ("uncapped", *PRESETS)


def card_used() -> int | None:
    """Bytes in use on GPU 0 by every process (NVML), or None without a card."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)
    except Exception:  # noqa: BLE001 - no NVML, no card: no peak
        return None


class PeakSampler:
    """The most memory in use on the card while it runs, above what was in use when it started."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.base = card_used()
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            used = card_used()
            if used is not None and self.peak is not None:
                self.peak = max(self.peak, used)

    def __enter__(self) -> "PeakSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_gib(self) -> float | None:
        return None if self.base is None else round((self.peak - self.base) / GIB, 2)


# ------------------------------------------------------------------ the workers (one case, in its own process)


def cap_process(cap: str) -> int | None:
    """Limit this process's torch allocations to what the preset plans for (terra/config/memory.py, ``preset_cap``:
    what a card of that size reports); the card's total bytes (None on a CPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    total = torch.cuda.mem_get_info()[1]
    if cap != "uncapped":
        torch.cuda.set_per_process_memory_fraction(preset_cap(cap, total) / total)
    return total


def vllm_worker(cap: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """generate (1 rollout, a batch) and sessions on one engine of Terra's shape under ``cap``."""
    import numpy as np

    from bench.lib.models import dummy_weights_model
    from benchmark_sessions import run_sessions
    from terra.config.sampling import SamplingConfig
    from terra.generation.backends import create_backend
    from terra.generation.rollout import RolloutRequest
    from terra.models import LlamaActionConfig
    from terra.models.presets import TERRA, TINY
    from terra.session import SessionHost

    config = LlamaActionConfig(**(TERRA if args.device == "cuda" else TINY))
    total = cap_process("uncapped")
    streams = max(args.batch, args.sessions)
    options: dict[str, Any] = {**dummy_weights_model(folder, config), "max_num_seqs": streams,
                               "enforce_eager": args.eager}
    plan = None
    if cap != "uncapped" and total is not None:
        plan = plan_memory(cap, total, ModelShape.from_config(config), "after", streams)
        options.update(plan.engine_options())
    if args.device == "cpu":
        options.update(block_size=32, kv_cache_memory_bytes=256 << 20)
    start = time.perf_counter()
    backend = create_backend("vllm", folder, args.device, "bfloat16", sampling=SamplingConfig(decoding="sequential"),
                             **options)  # the engine as measured: sequential decoding
    record: dict[str, Any] = {"settings": {k: v for k, v in options.items() if k != "load_format"},
                              "startup_s": round(time.perf_counter() - start, 1)}
    layout, greedy = backend.layout, SamplingConfig(temperature=0)
    rng = np.random.default_rng(0)
    context = rng.integers(0, layout.codebook_size, (3, layout.image_tokens))

    def requests(count: int) -> list:
        return [RolloutRequest(context, rng.normal(0, 1, (3 + args.frames, 6, 3)).astype(np.float32), args.frames,
                               seed=i) for i in range(count)]

    try:
        for name, count in (("generate_1", 1), ("generate_batch", args.batch)):
            start = time.perf_counter()
            backend.generate(requests(count), greedy, progress=False)
            seconds = time.perf_counter() - start
            record[name] = {"rollouts": count, "s_per_frame": round(seconds / args.frames / count, 4),
                            "frames_per_s": round(count * args.frames / seconds, 2)}
        host = SessionHost(backend, max_frames=args.frames, num_context=3)
        session_args = argparse.Namespace(num_context=3, frames=args.frames, decode=False, block=0)
        result = run_sessions(host, session_args, args.sessions, greedy)
        record["sessions"] = {"sessions": args.sessions, "frames_per_s": round(result["frames_per_s"], 2),
                              "latency_mean_s": result["latency_mean_s"]}
    finally:
        backend.close()
    return record


def refine_worker(cap: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """One 47-frame refinement (the tiny preset on a CPU) under ``cap``."""
    import benchmark_refiner

    cap_process(cap)
    argv = ["--frames", "47"] if args.device == "cuda" else ["--preset", "tiny", "--device", "cpu", "--frames", "5"]
    return benchmark_refiner.main([*argv, "--out", str(folder / "refine.json")])


def score_worker(cap: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """ACT-Bench scoring of ``--videos`` videos (a tiny estimator on a CPU) under ``cap``."""
    import benchmark_scoring

    cap_process(cap)
    argv = ["--videos", str(args.videos), "--distinct", str(min(args.videos, 8)), "--num-workers", "4"]
    if args.device == "cpu":
        argv += ["--preset", "tiny", "--device", "cpu", "--num-workers", "0"]
    return benchmark_scoring.main([*argv, "--workdir", str(folder), "--out", str(folder / "score.json")])


def alpasim_models(folder: Path, device: str) -> Path:
    """A world model of Terra's shape with random bf16 weights and a random LFQ tokenizer of Terra's (2^18 codes,
    288x512) under ``folder`` (tiny ones for a CPU), made once on the CPU by the driver: the server's checks read
    real weights."""
    from bench.lib.models import random_tokenizer, random_world_model
    from terra.models.presets import TERRA, TINY, TINY_TOKENIZER
    from terra.tokenizer.lfq import TERRA_CONFIG

    cuda = device == "cuda"
    random_world_model(folder / "world_model", TERRA if cuda else TINY)
    random_tokenizer(folder / "tokenizer", TERRA_CONFIG if cuda else TINY_TOKENIZER)
    return folder


def alpasim_worker(cap: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """``--sessions`` AlpaSim rollouts at once against terra-alpasim's server (scripts/bench/benchmark_alpasim.py's
    client: a first chunk of 5 frames, then ``ALPASIM_CHUNKS`` of 8) on the models of :func:`alpasim_models`, the
    tokenizer decoding and JPEG-encoding every frame in this process; ``memory=`` the preset, as a user sets it."""
    import benchmark_alpasim

    from terra.alpasim.service import WorldModelServicer, bind, start

    overrides = [f"model.world_model={args.models / 'world_model'}", "tokenizer=terra_lfq",
                 f"tokenizer.path={args.models / 'tokenizer'}", "backend=vllm", f"device={args.device}",
                 f"memory={'full' if cap == 'uncapped' else cap}",
                 f"backend.options.enforce_eager={str(args.eager).lower()}",
                 # random weights accept a speculative guess by chance: 53 to 325 passes a frame on the same H200
                 # as max_num_seqs went 64, 8, 16, 9 (benchmarks/memory.md); sequential decoding's 576 compare the caps
                 "sampling.decoding=sequential"]
    if args.device == "cpu":
        overrides += ["+backend.options.block_size=32", f"+backend.options.kv_cache_memory_bytes={256 << 20}"]
    begin = time.perf_counter()
    _, pipeline, table, options = benchmark_alpasim.build(overrides, args.sessions)
    record: dict[str, Any] = {"settings": options, "startup_s": round(time.perf_counter() - begin, 1)}
    server, port = bind(table.settings)
    start(server, WorldModelServicer(table, "terra-shaped"))
    address = f"127.0.0.1:{port}"
    try:
        frame = benchmark_alpasim.camera_frame(pipeline.image_size)
        benchmark_alpasim.warm_up(address, frame)
        record["alpasim"] = benchmark_alpasim.rollouts(address, frame, args.sessions, ALPASIM_CHUNKS,
                                                       str(pipeline.device))
    finally:
        server.stop(1).wait()
        table.shutdown()
        pipeline.close()
    return record


WORKERS = {"vllm": vllm_worker, "refine": refine_worker, "score": score_worker, "alpasim": alpasim_worker}


# ------------------------------------------------------------------ the driver


def run_case(workflow: str, cap: str, args: argparse.Namespace) -> dict[str, Any]:
    """One case in a fresh process, its peak sampled from here; the worker's record, or its error's last line."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "record.json"
        command = [sys.executable, __file__, "--worker", workflow, "--cap", cap, "--record", str(out),
                   "--device", args.device, "--frames", str(args.frames), "--batch", str(args.batch),
                   "--sessions", str(args.sessions), "--videos", str(args.videos), *(["--eager"] if args.eager else []),
                   *(["--models", str(args.models)] if args.models else [])]
        start = time.perf_counter()
        with PeakSampler() as sampler:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s,
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        case: dict[str, Any] = {"workflow": workflow, "cap": cap, "wall_s": round(time.perf_counter() - start, 1),
                                "peak_gib": sampler.peak_gib}
        if done.returncode == 0 and out.exists():
            case["record"] = json.loads(out.read_text())
        else:
            lines = [line for line in done.stderr.splitlines() if line.strip() and not LOG_LINE.search(line)]
            case["error"] = (lines[-1:] or ["(no output)"])[0][:300]
            case["stderr_tail"] = lines[-40:]  # vLLM's "Engine core initialization failed" points above itself
            case["out_of_memory"] = "out of memory" in done.stderr.lower() or "OutOfMemory" in done.stderr
    return case


def speed(case: dict[str, Any]) -> list[tuple[str, float | None, str]]:
    """``(row, value, unit)`` of the speeds a case reports (several rows for the vLLM engine's workflows)."""
    record = case.get("record") or {}
    if case["workflow"] == "vllm":
        return [("generate, 1 rollout", (record.get("generate_1") or {}).get("s_per_frame"), "s/frame"),
                ("generate, batch", (record.get("generate_batch") or {}).get("frames_per_s"), "frames/s"),
                ("sessions", (record.get("sessions") or {}).get("frames_per_s"), "frames/s")]
    if case["workflow"] == "alpasim":
        alpasim = record.get("alpasim") or {}
        return [(f"AlpaSim server, {alpasim.get('sessions', '?')} rollouts", alpasim.get("frames_per_s"), "frames/s"),
                ("AlpaSim server, 8-frame chunk p50", alpasim.get("chunk_p50_s"), "s")]
    cases = record.get("cases") or []
    if case["workflow"] == "refine":
        return [("refine, one sample", cases[-1].get("seconds") if cases else None, "s")]
    return [("score", record.get("videos_per_s"), "videos/s")]


def markdown(cases: list[dict[str, Any]]) -> str:
    """One row per workflow and cap: peak GiB, speed, speed against uncapped, settings, and whether it fits."""
    lines = ["| workflow | cap | peak GPU memory (GiB) | speed | vs uncapped | settings |", "|---|---|---|---|---|---|"]
    base = {(c["workflow"], row): value for c in cases if c["cap"] == "uncapped" for row, value, _ in speed(c)}
    for case in cases:
        settings = (case.get("record") or {}).get("settings") or {}
        shown = ", ".join(f"{k}={v}" for k, v in settings.items()
                          if k in ("quantization", "kv_cache_dtype", "gpu_memory_utilization", "max_num_seqs"))
        for row, value, unit in speed(case):
            ref = base.get((case["workflow"], row))
            faster = (ref / value if unit in ("s/frame", "s") else value / ref) if value and ref else None
            ratio = "" if faster is None else f"{faster:.2f}x"
            text = case.get("error", "failed") if value is None else f"{value:g} {unit}"
            lines.append(f"| {row} | {case['cap']} | {case['peak_gib'] if case['peak_gib'] is not None else '-'} | "
                         f"{text} | {ratio} | {shown or '-'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = Parser("benchmark_memory_table", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--workflows", type=listed(one_of(*WORKFLOWS)), default=",".join(WORKFLOWS))
    parser.add_argument("--caps", type=listed(one_of(*CAPS)), default=",".join(CAPS))
    parser.add_argument("--frames", type=in_range(int, 1, 1000), default=8, help="frames per rollout / session")
    parser.add_argument("--batch", type=in_range(int, 1, 4096), default=32, help="rollouts of the batch")
    parser.add_argument("--sessions", type=in_range(int, 1, 1024), default=8)
    parser.add_argument("--videos", type=in_range(int, 1, 10_000), default=64, help="videos scored")
    parser.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (faster start)")
    parser.add_argument("--timeout-s", type=in_range(float, 0, 86_400, above=True), default=240,
                        help="the most one case may take")
    parser.add_argument("--worker", choices=WORKFLOWS, help=argparse.SUPPRESS)
    parser.add_argument("--cap", choices=CAPS, default="uncapped", help=argparse.SUPPRESS)
    parser.add_argument("--record", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--models", type=Path, help=argparse.SUPPRESS)  # alpasim_models' folder
    args = parser.parse_args(argv)
    if not args.worker:
        resolve_device(args.device)
        if args.out:
            check_output(args.out, "--out")
    if args.worker:  # inside a case's process
        with tempfile.TemporaryDirectory() as tmp:
            record = WORKERS[args.worker](args.cap, args, Path(tmp))
        write_text(args.record, json_text(record) + "\n")
        return record
    cases = []
    workflows = args.workflows
    with tempfile.TemporaryDirectory() as tmp:
        if "alpasim" in workflows:
            args.models = alpasim_models(Path(tmp), args.device)
        for workflow in workflows:
            for cap in args.caps:
                cases.append(run_case(workflow, cap, args))
                print(f"{workflow} {cap}: peak {cases[-1]['peak_gib']} GiB, "
                      f"{cases[-1].get('error') or [(r, v) for r, v, _ in speed(cases[-1])]}", flush=True)
                if args.out:
                    write_text(args.out, json_text({"cases": cases}, indent=1) + "\n")
    table = markdown(cases)
    print(table)
    result = {"device": args.device, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cases": cases,
              "table": table}
    if args.out:
        write_text(args.out, json_text(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("benchmark_memory_table")(main)())
