"""One ``terra-drive`` command run as ``--processes`` shards at once on this machine, then its manifest or report.

    python scripts/drive_shards.py --processes 4 --scene-processes 8 --kv-cache-gib 2 -- world=both \
        policies=[all_pixel] num_scenarios=50 num_seeds=3 num_control_scenarios=4 num_control_seeds=1 \
        backend=vllm device=cuda videos=false output_dir=runs/fid

The shards are terra/closedloop/study/processes.py's, which ``terra-drive study=gpu`` runs itself
(``shard_processes``): shard ``i`` of ``K`` is ``terra-drive <overrides> shard_index=i num_shards=K progress=false``
in a process of its own, with ``num_threads`` and ``OMP_NUM_THREADS`` this machine's cores over the processes, its
output in a new folder of the system's temporary folder (printed). This script shards any command, a run in one
world too. With ``--kv-cache-gib`` each shard's vLLM engine takes that much KV cache and ``0.9 / K`` of the card.
With ``--scene-processes M`` (``world=both``) the ``K`` shards drive the worlds the world model draws
(``shard_worlds=engine``) and ``M`` more, started with them, every other world (``shard_worlds=scene``).

Once every shard has ended, the same command without the shard settings writes the manifest (``world=both``: the
fidelity report) from the shards' drives, driving none again. A shard refused at its settings (exit 2) stops the
run before the report; one whose drives failed (exit 1) does not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from terra.closedloop.study.processes import kv_cache, run_shards, setting


def output_dir(overrides: list[str]) -> Path:
    """The run's ``output_dir`` (every shard and the report must share it)."""
    given = [o.split("=", 1)[1] for o in overrides if setting(o) == "output_dir"]
    if not given or given[-1] in ("", "null"):
        sys.exit("drive_shards: give the run an output_dir=FOLDER: every shard writes its drives there")
    return Path(given[-1]).expanduser()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, required=True,
                        help="shards, each a terra-drive process (with --scene-processes: of the engine's worlds)")
    parser.add_argument("--scene-processes", type=int, default=0,
                        help="world=both: shards of the worlds that need no GPU, beside the engine's (0: none)")
    parser.add_argument("--kv-cache-gib", type=float, help="vLLM: each shard's engine's KV cache (GiB)")
    parser.add_argument("overrides", nargs="+", help="terra-drive's settings (after --)")
    args = parser.parse_args()
    ours = ("shard_index", "num_shards", "shard_worlds", "shard_processes")
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
    report = subprocess.run([sys.executable, "-m", "terra.apps.drive", *args.overrides, "progress=false",
                             *kv_cache(args.kv_cache_gib)])
    sys.exit(max([report.returncode, *every]))


if __name__ == "__main__":
    main()
