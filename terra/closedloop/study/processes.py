"""A ``terra-drive`` command as shards in processes of this machine, then its report."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from terra.core.device import usable_cores
from terra.core.errors import TerraInputError

POLL_S = 2.0  # how often the shards' manifests are counted
SHARED_MEMORY = 0.9  # the card's share the K engines split (vLLM's default for one)
GIB = 1 << 30
SHARD_SETTINGS = ("shard_index", "num_shards", "shard_worlds", "shard_processes")  # the shards' to set


@dataclass(frozen=True)
class ShardProcesses:
    """Shard processes per group on this machine and each engine's KV cache (GiB; None: vLLM's own sizing)."""

    engine: int = 0
    scene: int = 0
    kv_cache_gib: float | None = None
    all: int = 0  # shards of every world (one of them: the study in this process)

    @property
    def groups(self) -> dict[str, int]:
        """``shard_worlds`` -> its shards (a group of none left out)."""
        counts = (("engine", self.engine), ("scene", self.scene), ("all", self.all if self.all > 1 else 0))
        return {name: count for name, count in counts if count}


def setting(override: str) -> str:
    """The setting an override names (``+key=value`` and ``++key=value`` alike)."""
    return override.split("=", 1)[0].lstrip("+")


def engine_share(kv_cache_gib: float | None, per_card: int) -> dict[str, float]:
    """Backend options of an engine shard sharing its card with ``per_card`` engines; none without a cache size."""
    if kv_cache_gib is None:
        return {}
    share = round(SHARED_MEMORY / per_card, 3)
    return {"kv_cache_memory_bytes": int(kv_cache_gib * GIB), "gpu_memory_utilization": share}


def shard_command(overrides: Sequence[str], shard: int, shards: int, threads: int, kv_cache_gib: float | None,
                  worlds: str = "all", per_card: int | None = None) -> list[str]:
    """The ``terra-drive`` command of shard ``shard`` of ``shards``; ``per_card``: engines sharing its card."""
    share = engine_share(kv_cache_gib, per_card or shards) if worlds != "scene" else {}
    mine = [o for o in overrides if setting(o) not in SHARD_SETTINGS and not setting(o).startswith("shard_processes.")]
    return [sys.executable, "-m", "terra.apps.drive", *mine, f"shard_index={shard}", f"num_shards={shards}",
            f"num_threads={threads}", f"shard_worlds={worlds}", "shard_processes.engine=0", "shard_processes.scene=0",
            "shard_processes.all=0", "progress=false",
            *(f"++backend.options.{key}={value}" for key, value in share.items())]


def visible_gpus() -> list[str]:
    """The CUDA cards this process may use, as ``CUDA_VISIBLE_DEVICES`` names them."""
    named = os.environ.get("CUDA_VISIBLE_DEVICES")
    if named is not None:
        return [card.strip() for card in named.split(",") if card.strip()]
    import torch  # only here: the study's settings load without it

    return [str(i) for i in range(torch.cuda.device_count())]


def engine_cards(engines: int, cards: Sequence[str]) -> list[str | None]:
    """The card each of ``engines`` shards takes, dealt in turn over ``cards`` (None for each without a card)."""
    return [cards[shard % len(cards)] if cards else None for shard in range(engines)]


def records(folder: Path) -> int:
    """Drive records the shards' manifests hold so far (every world's folder)."""
    return sum(sum(1 for _ in path.open()) for path in folder.glob("**/manifest.shard-*-of-*.jsonl"))


def shard_plan(groups: dict[str, int], beside: int = 0) -> tuple[int, list[str | None], int | None]:
    """How the shards of ``groups`` share this machine: each process's threads and each engine shard's card."""
    threads = max(1, usable_cores() // (sum(groups.values()) + beside))
    cards = engine_cards(groups.get("engine", groups.get("all", 0)), visible_gpus())
    return threads, cards, max((cards.count(card) for card in cards), default=0) + beside or None


def run_shards(overrides: Sequence[str], groups: dict[str, int], kv_cache_gib: float | None, folder: Path,
               logs: Path, total: int | None = None, beside: int = 0) -> dict[str, list[int]]:
    """Start every shard of ``groups``, count drives recorded in ``folder``, and return each group's exit codes."""
    threads, cards, per_card = shard_plan(groups, beside)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    running: dict[str, list] = {worlds: [] for worlds in groups}
    for worlds, shards in groups.items():
        for shard in range(shards):
            log = (logs / f"{worlds}-{shard}-of-{shards}.log").open("w")
            command = shard_command(overrides, shard, shards, threads, kv_cache_gib, worlds, per_card)
            card = {} if worlds == "scene" or cards[shard] is None else {"CUDA_VISIBLE_DEVICES": cards[shard]}
            process = subprocess.Popen(command, env={**env, **card}, stdout=log, stderr=subprocess.STDOUT)
            running[worlds].append((process, log))
    every = [item for group in running.values() for item in group]
    follow(folder, total, len(every), lambda: any(process.poll() is None for process, _ in every))
    for _, log in every:
        log.close()
    for worlds, group in running.items():
        for shard, (process, log) in enumerate(group):
            if process.returncode not in (0, 1):
                tail = Path(log.name).read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
                raise TerraInputError(f"shard {shard} ({worlds} worlds) ended with exit code {process.returncode}: "
                                      f"{tail[0]} (all of it: {log.name})")
    return {worlds: [process.returncode for process, _ in group] for worlds, group in running.items()}


def follow(folder: Path, total: int | None, shards: int, running: Callable[[], bool]) -> None:
    """Count the drives ``shards`` shards record in ``folder`` as they come, while ``running()``."""
    started = last = time.monotonic()
    terminal = sys.stderr.isatty()
    with tqdm(total=total, unit="drive", desc=f"{shards} shards", dynamic_ncols=True, disable=not terminal) as bar:
        while running():
            time.sleep(POLL_S)
            bar.update(records(folder) - bar.n)
            if not terminal and time.monotonic() - last >= 60:
                last = time.monotonic()
                print(f"terra-drive: {records(folder)} of {total or '?'} drives recorded by {shards} shards in "
                      f"{last - started:.0f} s", file=sys.stderr, flush=True)
        bar.update(records(folder) - bar.n)


def drive_in_shards(overrides: Sequence[str], processes: ShardProcesses, folder: Path,
                    total: int | None = None, beside: int = 0) -> tuple[list[str], int]:
    """The study's drives made by ``processes``' shards; the lines to print and the worst shard's exit code (0 or 1)."""
    logs = Path(tempfile.mkdtemp(prefix="terra-drive-shards-"))
    started = time.perf_counter()
    codes = run_shards(overrides, processes.groups, processes.kv_cache_gib, folder, logs, total, beside)
    every = [code for group in codes.values() for code in group]
    line = (f"terra-drive: {len(every)} shard processes ({', '.join(f'{n} {w}' for w, n in processes.groups.items())}"
            f") ended in {time.perf_counter() - started:.1f} s (exit codes {codes}; their output: {logs})")
    return [line], max(every)


PROG = "python -m terra.closedloop.study.processes"


def output_dir(overrides: Sequence[str]) -> Path:
    """The command's ``output_dir`` (every shard and the report must share it)."""
    given = [o.split("=", 1)[1] for o in overrides if setting(o) == "output_dir"]
    if not given or given[-1] in ("", "null"):
        sys.exit(f"{PROG}: give the run an output_dir=FOLDER: every shard writes its drives there")
    return Path(given[-1]).expanduser()


def main() -> None:
    """Run a ``terra-drive`` command as shards of this machine, then once more unsharded to write the manifest."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, required=True,
                        help="shards, each a terra-drive process (with --scene-processes: of the engine's worlds)")
    parser.add_argument("--scene-processes", type=int, default=0,
                        help="world=both: shards of the worlds that need no GPU, beside the engine's (0: none)")
    parser.add_argument("--kv-cache-gib", type=float, help="vLLM: each shard's engine's KV cache (GiB)")
    parser.add_argument("overrides", nargs="+", help="terra-drive's settings (after --)")
    args = parser.parse_args()
    if args.processes < 1 or args.scene_processes < 0 or any(setting(o) in SHARD_SETTINGS for o in args.overrides):
        parser.error("--processes is at least 1, --scene-processes at least 0, and the shards' settings "
                     f"({', '.join(SHARD_SETTINGS)}) are this command's to set")
    folder = output_dir(args.overrides)  # given, before any shard starts
    groups = {"engine": args.processes, "scene": args.scene_processes} if args.scene_processes else \
        {"all": args.processes}
    logs = Path(tempfile.mkdtemp(prefix="terra-drive-shards-"))
    print(f"{PROG}: the shards' output goes to {logs}", flush=True)
    started = time.perf_counter()
    try:
        codes = run_shards(args.overrides, groups, args.kv_cache_gib, folder, logs)
    except TerraInputError as err:
        sys.exit(f"{PROG}: {err}")
    every = [code for group in codes.values() for code in group]
    print(f"{PROG}: {len(every)} shards ended in {time.perf_counter() - started:.1f} s (exit codes {codes}); "
          "the report:", flush=True)
    cache = ([] if args.kv_cache_gib is None
             else [f"++backend.options.kv_cache_memory_bytes={int(args.kv_cache_gib * GIB)}"])
    report = subprocess.run([sys.executable, "-m", "terra.apps.drive", *args.overrides, "progress=false", *cache])
    sys.exit(max([report.returncode, *every]))


if __name__ == "__main__":
    main()
