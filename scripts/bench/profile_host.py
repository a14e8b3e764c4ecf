#!/usr/bin/env python
"""Where the host's time goes: one path under py-spy, every process and thread, waiting included, sorted by part.

``--path generate`` profiles ``terra-generate``'s one stream of ``--frames`` frames (benchmark_defaults.py's run),
``--path alpasim`` ``--sessions`` AlpaSim sessions at once of ``--chunks`` chunks (benchmark_alpasim.py's), each from
the moment it starts generating (the model loaded; for AlpaSim, the engine warmed up) to its end. Two py-spy recorders
(the dev extra) sample this process and its children ``--rate`` times a second: every thread (``--idle``), and the
busy ones (py-spy's test of a thread's state: running or ready to run; ``--gil``: the thread holding each
interpreter's GIL). A busy sample goes to the part of its innermost frame that a pattern of ``PARTS`` names; waiting
is every thread's samples less the busy ones. The table gives each part's thread-milliseconds a frame and share, for
the client (this process and its other children) and for vLLM's engine-core process with its workers. ``--raw
FOLDER`` keeps the samples there (``idle.raw``, and ``busy.raw`` or ``gil.raw``); ``--read FOLDER`` only sorts them.
Examples::

    OMP_NUM_THREADS=1 python scripts/bench/profile_host.py --path generate --frames 4 backend=hf device=cpu
    python scripts/bench/profile_host.py --path alpasim --sessions 64 --chunks 8 backend=vllm device=cuda \\
        --raw alpasim64
"""

from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, existing, exit_2_on_input_error, in_range  # noqa: E402
from bench.lib.occupancy import ENGINE_CORE  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402

WAITING = {"busy": "waiting (off the CPU: locks, queues, sockets, the GIL)", "gil": "not holding the GIL"}
# (part, pattern of a frame "function (file:line)"); a sample's innermost frame that one names decides, the first
# part in this order where one frame matches several
PARTS = (
    ("JPEG (PIL, encode_image)", r"/PIL/|encode_image|encode_jpeg|decode_jpeg"),
    ("tokenizer (decoding, encoding)", r"codes_to_frames|/tokenizer/|/decoder/frames\.py|"
                                       r"WorldModelPipeline\.(de|en)code"),
    ("gRPC", r"/grpc/|_pb2(_grpc)?\.py|/google/protobuf/"),
    ("prefix-cache hashing", r"hash_block_tokens|hash_request_tokens|block_hasher|kv_cache_utils\.py|sha256"),
    ("request building", r"frame_prompt|add_request|process_inputs|/inputs?/preprocess|input_processor"),
    ("decoding rule (draws, acceptance)", r"/generation/(speculative|sampling|guesses)\.py|"
                                          r"/vllm/jacobi_state\.py"),
    ("model execution", r"execute_model|sample_tokens|_model_forward|/torch/nn/modules/|modeling_llama|"
                        r"/worker/\w*model_runner\.py|/vllm/llama_action\.py"),
    ("executor messages (shared memory, spinning)", r"/device_communicators/shm_broadcast\.py|/v1/executor/|"
                                                    r"sched_yield"),
    ("engine step (scheduling, outputs)", r"EngineCore\w*\.(step\w*|run_busy_loop)|schedule|update_from_output|"
                                          r"process_outputs|/v1/core/sched/|/v1/engine/|"
                                          r"/generation/(session_engine|hf_backend|vllm_backend)\.py"),
    ("imports", r"_find_and_load"),
)
PATTERNS = tuple((part, re.compile(pattern)) for part, pattern in PARTS)
PROCESS = re.compile(r'process (\d+):"(.*?)"([; ])', re.S)  # py-spy's element of a process (its cmdline may span lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser("profile_host", description=__doc__.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--path", choices=("generate", "alpasim"), default="generate", help="the path profiled")
    parser.add_argument("--frames", type=in_range(int, 1, 3000), default=16, help="generate: frames of its stream")
    parser.add_argument("--sessions", type=in_range(int, 1, 1024), default=1, help="alpasim: sessions at once")
    parser.add_argument("--chunks", type=in_range(int, 1, 1000), default=2,
                        help="alpasim: 8-frame chunks a session, after one of 5")
    parser.add_argument("--rate", type=in_range(int, 1, 1000), default=100, help="py-spy's samples a second")
    parser.add_argument("--gil", action="store_true", help="only the thread holding each interpreter's GIL")
    parser.add_argument("--raw", type=Path, help="keep py-spy's raw samples in this folder")
    parser.add_argument("--read", type=existing("folder", "idle.raw"), help="only sort the samples of this folder")
    parser.add_argument("overrides", nargs="*", help="the app's settings, e.g. backend=vllm device=cuda")
    args = parser.parse_args(argv)
    if args.raw is not None:
        with parser.one_line_errors():
            check_output(args.raw, "--raw", folder=True)
    return args


def read_samples(text: str) -> Counter:
    """py-spy's raw samples (``process ...;frame;...;frame count`` a stack) → counts by (role, stack), the role
    ``engine core`` in vLLM's engine-core process and its children (the model's workers), else ``client``; a stack
    root first."""
    samples: Counter = Counter()
    position = 0
    while position < len(text):
        role, separator = "client", ";"
        while text.startswith("process ", position):
            process = PROCESS.match(text, position)
            role = "engine core" if role == "engine core" or ENGINE_CORE in process.group(2) else "client"
            separator, position = process.group(3), process.end()
        end = text.find("\n", position)
        end = len(text) if end < 0 else end
        line, position = text[position:end], end + 1
        if not line.strip():
            continue
        frames, _, count = ("", "", line) if separator == " " else line.rpartition(" ")
        samples[role, tuple(frames.split(";")) if frames else ()] += int(count)
    return samples


def part_of(stack: tuple[str, ...]) -> str:
    """The part of a busy stack: the part its innermost frame that a pattern names, else "other"."""
    for frame in reversed(stack):
        for part, pattern in PATTERNS:
            if pattern.search(frame):
                return part
    return "other"


def host_parts(every: Counter, busy: Counter, mode: str) -> dict[str, Counter]:
    """Samples by role and part: the busy samples' parts, and waiting (every thread's samples less the busy ones)."""
    parts: dict[str, Counter] = {"client": Counter(), "engine core": Counter()}
    for (role, stack), count in busy.items():
        parts[role][part_of(stack)] += count
    for role, counts in parts.items():
        waiting = sum(n for (r, _), n in every.items() if r == role) - sum(counts.values())
        counts[WAITING[mode]] = max(waiting, 0)
    return parts


def table(parts: dict[str, Counter], rate: int, frames: int | None, mode: str) -> list[str]:
    """Markdown rows: each part's thread-milliseconds a frame (samples without ``frames``) and share, by role."""
    unit = "thread-ms a frame" if frames else "samples"
    lines = [f"| part | client, {unit} | client % | engine core, {unit} | engine core % |", "|---|---:|---:|---:|---:|"]
    totals = {role: sum(counts.values()) for role, counts in parts.items()}
    for part in [name for name, _ in PARTS] + ["other", WAITING[mode], "all"]:
        cells = []
        for role, counts in parts.items():
            count = totals[role] if part == "all" else counts[part]
            amount = f"{1000 * count / rate / frames:.1f}" if frames else str(count)
            cells += [amount, f"{100 * count / totals[role]:.0f}" if totals[role] else "–"]
        lines.append(f"| {part} | {' | '.join(cells)} |")
    return lines


def py_spy() -> str:
    """py-spy's program: beside this Python's, else on the PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise TerraInputError("py-spy is not installed: pip install py-spy (the dev extra has it)")
    return found


class PySpy:
    """While entered, two py-spy recorders sample this process and its children into ``folder``: every thread
    (``idle.raw``) and the busy ones (``busy.raw``; ``gil``: the GIL's holders, ``gil.raw``)."""

    def __init__(self, folder: Path, rate: int, gil: bool) -> None:
        program, self.mode = py_spy(), "gil" if gil else "busy"
        common = [program, "record", "--pid", str(os.getpid()), "--subprocesses", "--nonblocking", "--full-filenames",
                  "-f", "raw", "-r", str(rate)]
        self.commands = [[*common, "--idle", "-o", str(folder / "idle.raw")],
                         [*common, *(["--gil"] if gil else []), "-o", str(folder / f"{self.mode}.raw")]]
        self.folder, self.seconds = folder, 0.0

    def __enter__(self) -> "PySpy":
        try:  # where Yama allows a process to be traced by its ancestors only: by py-spy, its child, too
            ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1), 0, 0, 0)
        except (OSError, AttributeError):
            pass
        self.processes = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                          for command in self.commands]
        for process in self.processes:
            first = process.stdout.readline()  # "py-spy> Sampling process ..." once it samples, or its error
            if "Sampling" not in first:
                self._stop()
                raise RuntimeError(f"py-spy could not record this process: {first.strip()}")
        self.begin = time.perf_counter()
        return self

    def _stop(self) -> list[str]:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        return [process.communicate(timeout=300)[0] for process in self.processes]

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.begin
        said = self._stop()
        for process, text in zip(self.processes, said):
            if process.returncode != 0:
                raise RuntimeError(f"py-spy wrote no samples: {text.strip().splitlines()[-1:]}")


def profile_generate(overrides: list[str], frames: int, spy: PySpy) -> int:
    """terra-generate's stream of ``frames`` frames, its generation under ``spy``; the frames."""
    from bench.benchmark_defaults import run_generate

    from terra.pipeline import WorldModelPipeline

    generate = WorldModelPipeline.generate

    def profiled(self, *args, **kwargs):
        with spy:
            return generate(self, *args, **kwargs)

    WorldModelPipeline.generate = profiled
    try:
        run_generate(overrides, frames)
    finally:
        WorldModelPipeline.generate = generate
    return frames


def profile_alpasim(overrides: list[str], sessions: int, chunks: int, spy: PySpy) -> int:
    """``sessions`` AlpaSim sessions at once of ``chunks`` chunks after the first, their rollouts under ``spy``; the
    frames of all."""
    import bench.benchmark_alpasim as alpasim

    run_threads = alpasim.run_threads

    def profiled(count, work):
        with spy:
            return run_threads(count, work)

    alpasim.run_threads = profiled
    try:
        alpasim.main(["--sessions", str(sessions), "--chunks", str(chunks), *overrides])
    finally:
        alpasim.run_threads = run_threads
    return sessions * (alpasim.FIRST_CHUNK + alpasim.CHUNK * chunks)


def samples_in(folder: Path, mode: str) -> tuple[Counter, Counter]:
    """Every thread's samples and the busy ones (``mode``: ``busy`` or ``gil``) in ``folder``."""
    return read_samples((folder / "idle.raw").read_text()), read_samples((folder / f"{mode}.raw").read_text())


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    frames = None
    if args.read is not None:
        mode = "gil" if (args.read / "gil.raw").exists() else "busy"
        every, busy = samples_in(args.read, mode)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            folder = args.raw or Path(scratch)
            folder.mkdir(parents=True, exist_ok=True)
            spy = PySpy(folder, args.rate, args.gil)
            frames = (profile_generate(args.overrides, args.frames, spy) if args.path == "generate"
                      else profile_alpasim(args.overrides, args.sessions, args.chunks, spy))
            mode, (every, busy) = spy.mode, samples_in(folder, spy.mode)
        print(f"{args.path}: {frames} frames in {spy.seconds:.2f} s ({1000 * spy.seconds / frames:.1f} ms a frame), "
              f"py-spy at {args.rate} a second", flush=True)
    parts = host_parts(every, busy, mode)
    print("\n".join(table(parts, args.rate, frames, mode)), flush=True)
    return {"frames": frames, "rate": args.rate, "mode": mode, "parts": {k: dict(v) for k, v in parts.items()}}


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("profile_host")(main)())
