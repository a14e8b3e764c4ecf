#!/usr/bin/env python
"""One ``terra-drive`` command run as ``--processes`` shards at once on this machine, then its manifest or report.

    python scripts/drive_shards.py --processes 4 --scene-processes 8 --kv-cache-gib 2 -- world=both \
        policies=[all_pixel] num_scenarios=50 num_seeds=3 num_control_scenarios=4 num_control_seeds=1 \
        backend=vllm device=cuda videos=false output_dir=runs/fid

A fidelity study's work beside the world model's engine is the CPU's: the policies' plans, the true renders and the
measurements of every frame (benchmarks/drives.md, "Closed-loop drives"), about 25-35 ms a frame, which one process (and
its writer process, ``writer_processes``) runs on a core or two. Here shard ``i`` of ``K`` is
``terra-drive <overrides> shard_index=i num_shards=K progress=false`` in a process of its own (conf/drive.yaml:
drive ``k`` to shard ``k % K``), with ``num_threads`` and ``OMP_NUM_THREADS`` this machine's cores over the
processes; its output goes to ``<kind>-<i>-of-<K>.log`` in a new folder of the system's temporary folder (printed;
nothing is written into ``output_dir`` but by terra-drive). With ``--kv-cache-gib`` each shard's vLLM engine takes
that much KV cache and ``0.9 / K`` of the card (``backend.options.kv_cache_memory_bytes`` and
``gpu_memory_utilization``): the K engines share the GPU and start together (with the KV cache given, vLLM skips
the memory profiling that fails while another process's memory moves).

With ``--scene-processes M`` (``world=both``) the study's worlds are split by what they need: the ``K`` shards drive
the worlds the world model draws (``shard_worlds=engine``: the model, zero_actions, straight) and ``M`` more,
started with them, every other world (``shard_worlds=scene``: the truth and the scene controls), which need no GPU:
they drive on the cores the engines' shards leave while the model's drives are made, not after them.

Once every shard has ended, the same command without the shard settings writes the manifest (``world=both``: the
fidelity report) from the shards' drives, driving none again and opening no world whose drives are all recorded (no
engine starts), or making those a shard left. A shard refused at its settings (exit 2) stops the run before the
report; one whose drives failed (exit 1) does not.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm.auto import tqdm

from terra.core.progress import shows_bars

POLL_S = 2.0  # how often the shards' manifests are counted for the bar
SHARED_MEMORY = 0.9  # the card's share the K engines split (vLLM's default for one)
GIB = 1 << 30


def terra_drive() -> list[str]:
    """The ``terra-drive`` console script of this interpreter's environment."""
    script = Path(sys.executable).with_name("terra-drive")
    return [str(script)] if script.exists() else [sys.executable, "-m", "terra.apps.drive"]


def kv_cache(kv_cache_gib: float | None) -> list[str]:
    """The override that gives an engine its KV cache (none without ``--kv-cache-gib``)."""
    return [] if kv_cache_gib is None else [f"++backend.options.kv_cache_memory_bytes={int(kv_cache_gib * GIB)}"]


def shard_command(overrides: list[str], shard: int, shards: int, threads: int, kv_cache_gib: float | None,
                  worlds: str = "all") -> list[str]:
    """The ``terra-drive`` command of shard ``shard`` of ``shards`` driving the study's ``worlds``
    (``shard_worlds``; ``scene``: no engine to size)."""
    engine = worlds != "scene" and kv_cache_gib is not None
    share = [f"++backend.options.gpu_memory_utilization={SHARED_MEMORY / shards:.3f}"] if engine else []
    return [*terra_drive(), *overrides, f"shard_index={shard}", f"num_shards={shards}", f"num_threads={threads}",
            f"shard_worlds={worlds}", "progress=false", *(kv_cache(kv_cache_gib) if engine else []), *share]


def setting(override: str) -> str:
    """The setting an override names (``+key=value`` and ``++key=value`` alike)."""
    return override.split("=", 1)[0].lstrip("+")


def output_dir(overrides: list[str]) -> Path:
    """The run's ``output_dir`` (every shard and the report must share it)."""
    given = [o.split("=", 1)[1] for o in overrides if setting(o) == "output_dir"]
    if not given or given[-1] in ("", "null"):
        sys.exit("drive_shards: give the run an output_dir=FOLDER: every shard writes its drives there")
    return Path(given[-1]).expanduser()


def records(folder: Path) -> int:
    """Drive records the shards' manifests hold so far (every world's folder)."""
    return sum(sum(1 for _ in path.open()) for path in folder.glob("**/manifest.shard-*-of-*.jsonl"))


def run_shards(overrides: list[str], groups: dict[str, int], kv_cache_gib: float | None, folder: Path,
               logs: Path) -> dict[str, list[int]]:
    """Start every shard of ``groups`` (``shard_worlds`` -> its shards: ``{"all": K}``, or ``{"engine": K, "scene":
    M}``; each shard's output in ``logs``), show the drives recorded in ``folder`` as they come, and return each
    group's exit codes."""
    threads = max(1, (os.cpu_count() or 1) // sum(groups.values()))
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    running = {worlds: [] for worlds in groups}
    for worlds, shards in groups.items():
        for shard in range(shards):
            log = (logs / f"{worlds}-{shard}-of-{shards}.log").open("w")
            command = shard_command(overrides, shard, shards, threads, kv_cache_gib, worlds)
            running[worlds].append((subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    every = [item for group in running.values() for item in group]
    with tqdm(unit="drive", desc=f"{len(every)} shards", dynamic_ncols=True, disable=not shows_bars()) as bar:
        while any(process.poll() is None for process, _ in every):
            time.sleep(POLL_S)
            bar.update(records(folder) - bar.n)
        bar.update(records(folder) - bar.n)
    for _, log in every:
        log.close()
    return {worlds: [process.returncode for process, _ in group] for worlds, group in running.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, required=True,
                        help="shards, each a terra-drive process (with --scene-processes: of the engine's worlds)")
    parser.add_argument("--scene-processes", type=int, default=0,
                        help="world=both: shards of the worlds that need no GPU, beside the engine's (0: none)")
    parser.add_argument("--kv-cache-gib", type=float, help="vLLM: each shard's engine's KV cache (GiB)")
    parser.add_argument("overrides", nargs="+", help="terra-drive's settings (after --)")
    args = parser.parse_args()
    ours = ("shard_index", "num_shards", "shard_worlds")
    if args.processes < 1 or args.scene_processes < 0 or any(setting(o) in ours for o in args.overrides):
        parser.error("--processes is at least 1, --scene-processes at least 0, and the shards' settings "
                     f"({', '.join(ours)}) are this script's to set")
    folder = output_dir(args.overrides)  # given, before any shard starts
    groups = {"engine": args.processes, "scene": args.scene_processes} if args.scene_processes else \
        {"all": args.processes}
    logs = Path(tempfile.mkdtemp(prefix="drive_shards-"))
    print(f"drive_shards: the shards' output goes to {logs}", flush=True)
    started = time.perf_counter()
    codes = run_shards(args.overrides, groups, args.kv_cache_gib, folder, logs)
    for worlds, group in codes.items():
        for shard, code in enumerate(group):
            if code not in (0, 1):
                log = logs / f"{worlds}-{shard}-of-{groups[worlds]}.log"
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                sys.exit(f"drive_shards: shard {shard} ({worlds} worlds) ended with exit code {code}: {tail[0]} "
                         f"(all of it: {log})")
    every = [code for group in codes.values() for code in group]
    print(f"drive_shards: {len(every)} shards ended in {time.perf_counter() - started:.1f} s (exit codes "
          f"{codes}); the report:", flush=True)
    report = subprocess.run([*terra_drive(), *args.overrides, "progress=false", *kv_cache(args.kv_cache_gib)])
    sys.exit(max([report.returncode, *every]))


if __name__ == "__main__":
    main()
