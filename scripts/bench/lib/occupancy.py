"""Who waits over a stretch of a run: the GPU's busy share and the CPU shares of the client and of vLLM's engine
core."""

from __future__ import annotations

import time

import numpy as np
import psutil

from bench.lib.environment import GpuBusyMonitor

ENGINE_CORE = "EngineCore"  # the title vLLM gives its engine core's process
OCCUPANCY = ("gpu_busy_pct", "gpu_busy_p10_pct", "gpu_busy_p90_pct", "engine_core_cpu", "client_cpu")  # the figures


def cpu_seconds(process: psutil.Process) -> float:
    """The process's CPU seconds so far, every thread's, its children's not."""
    times = process.cpu_times()
    return times.user + times.system


def engine_cores(client: psutil.Process) -> list[psutil.Process]:
    """The client's descendants that vLLM titled its engine core, and theirs (the model's workers)."""
    found = []
    for child in client.children(recursive=True):
        try:
            if ENGINE_CORE in child.name() or any(ENGINE_CORE in part for part in child.cmdline()):
                found += [child, *child.children(recursive=True)]
        except psutil.Error:
            continue  # ended meanwhile
    return list(dict.fromkeys(found))


class Occupancy:
    """While entered: the GPU's busy share (NVML's utilisation every ``period_s``; mean, p10 and p90 in %, None
    without NVML or off ``cuda``) and the CPU seconds over wall seconds of this process (the client, every thread)
    and of its engine-core processes with their workers (None where vLLM's engine core runs in no process of its
    own), in :attr:`figures` after the block."""

    def __init__(self, device: str, period_s: float = 0.05) -> None:
        self.gpu = GpuBusyMonitor(period_s, enabled=device.startswith("cuda"))
        self.figures: dict[str, float | None] = {}

    def __enter__(self) -> "Occupancy":
        self._client = psutil.Process()
        self._cores = {core: cpu_seconds(core) for core in engine_cores(self._client)}
        self._client_cpu = cpu_seconds(self._client)
        self.gpu.__enter__()
        self._start, self._wall = time.time(), time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        wall, end = time.perf_counter() - self._wall, time.time()
        client = cpu_seconds(self._client) - self._client_cpu
        cores = []
        for core, before in self._cores.items():
            try:
                cores.append(cpu_seconds(core) - before)
            except psutil.Error:
                continue  # ended within the block: its seconds are lost
        self.gpu.__exit__(*exc)
        busy = [u for t, u in self.gpu.trace if self._start <= t <= end]
        self.figures = {
            "gpu_busy_pct": float(np.mean(busy)) if busy else None,
            "gpu_busy_p10_pct": float(np.percentile(busy, 10)) if busy else None,
            "gpu_busy_p90_pct": float(np.percentile(busy, 90)) if busy else None,
            "engine_core_cpu": sum(cores) / wall if cores else None,
            "client_cpu": client / wall,
        }


def occupancy_texts(figures: dict[str, float | None]) -> tuple[str, str, str]:
    """GPU busy % (p10-p90), engine-core CPU and client CPU as text; "–" where not measured."""
    gpu = ("–" if figures["gpu_busy_pct"] is None else
           f"{figures['gpu_busy_pct']:.0f} ({figures['gpu_busy_p10_pct']:.0f}-{figures['gpu_busy_p90_pct']:.0f})")
    core = "–" if figures["engine_core_cpu"] is None else f"{figures['engine_core_cpu']:.2f}"
    return gpu, core, f"{figures['client_cpu']:.2f}"


def occupancy_cells(figures: dict[str, float | None]) -> str:
    """A markdown row's cells: GPU busy %, engine-core CPU, client CPU."""
    return " | ".join(occupancy_texts(figures))


def occupancy_line(figures: dict[str, float | None]) -> str:
    """The figures for a line of text."""
    gpu, core, client = occupancy_texts(figures)
    return f"GPU busy {gpu}{'' if gpu == '–' else ' %'}, engine core {core} CPU, client {client} CPU"
