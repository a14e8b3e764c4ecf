"""Who waits over a benchmark's row (scripts/bench/lib/occupancy.py): shares read from the processes' CPU time."""

from __future__ import annotations

import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from tests.conftest import SCRIPTS

if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))

from bench.lib.occupancy import Occupancy, cpu_seconds, occupancy_cells  # noqa: E402

BUSY = "import sys\nwhile True: pass"
IDLE = "import sys\nsys.stdin.read()"


@pytest.fixture
def engine_core():
    """A child process titled as vLLM's engine core, running the code it is given; ended, its children too, after
    the test."""
    children = []

    def start(code: str) -> psutil.Process:
        child = subprocess.Popen([sys.executable, "-c", code, "VLLM::EngineCore"], stdin=subprocess.PIPE)
        children.append(child)
        return psutil.Process(child.pid)

    yield start
    for child in children:
        for worker in psutil.Process(child.pid).children(recursive=True):
            worker.kill()
        child.kill()
        child.wait()


def wait_for(done, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, "the state never came"
        time.sleep(0.01)  # polls


def test_a_busy_engine_core_and_an_idle_client(engine_core):
    """The shares are CPU seconds over wall seconds: the busy engine core's 0.5 CPU seconds are found again, whatever
    share of a loaded CPU it got; the client, waiting, used next to none."""
    core = engine_core(BUSY)
    wait_for(lambda: cpu_seconds(core) > 0.05)  # started
    begin = time.perf_counter()
    with Occupancy("cpu") as occupancy:
        start = cpu_seconds(core)
        wait_for(lambda: cpu_seconds(core) - start > 0.5)
    wall, figures = time.perf_counter() - begin, occupancy.figures
    assert 0.45 < figures["engine_core_cpu"] * wall < 0.8 and figures["client_cpu"] * wall < 0.1, (figures, wall)
    assert figures["gpu_busy_pct"] is None and occupancy_cells(figures).startswith("– | ")


def test_the_engine_core_counts_its_workers(engine_core):
    """vLLM's multiprocess executor runs the model in a child of the engine core: its CPU seconds are the engine's."""
    core = engine_core(f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {BUSY!r}])")
    wait_for(lambda: core.children() and cpu_seconds(core.children()[0]) > 0.05)  # the worker started
    worker = core.children()[0]
    begin = time.perf_counter()
    with Occupancy("cpu") as occupancy:
        start = cpu_seconds(worker)
        wait_for(lambda: cpu_seconds(worker) - start > 0.5)
    wall = time.perf_counter() - begin
    assert 0.45 < occupancy.figures["engine_core_cpu"] * wall < 0.8, (occupancy.figures, wall)


def test_an_idle_engine_core_and_a_busy_client(engine_core):
    core = engine_core(IDLE)
    begin = time.perf_counter()
    with Occupancy("cpu") as occupancy:
        start = time.process_time()
        while time.process_time() - start < 0.5:
            pass
    wall, figures = time.perf_counter() - begin, occupancy.figures
    assert figures["engine_core_cpu"] * wall < 0.05 and 0.45 < figures["client_cpu"] * wall < 0.8, (figures, wall)
    assert core.is_running()


def test_no_engine_core_of_its_own_is_not_measured():
    with Occupancy("cpu") as occupancy:
        sum(range(100_000))
    assert occupancy.figures["engine_core_cpu"] is None
    assert occupancy_cells(occupancy.figures).startswith("– | – | ")


class FakeNvml:
    """NVML's calls the busy share reads, on a card that is busy while ``busy`` is set; it counts its readings."""

    def __init__(self) -> None:
        self.busy, self.readings = False, {0: 0, 100: 0}

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu = 100 if self.busy else 0
        self.readings[gpu] += 1
        return SimpleNamespace(gpu=gpu)


def test_the_gpu_busy_share_is_read_from_nvml_on_cuda_only(monkeypatch):
    from bench.lib.environment import GpuBusyMonitor

    nvml = FakeNvml()
    monkeypatch.setattr(GpuBusyMonitor, "_nvml", staticmethod(lambda: nvml))
    with Occupancy("cuda:0", period_s=0.005) as occupancy:
        nvml.busy = True
        wait_for(lambda: nvml.readings[100] >= 5)
        nvml.busy = False
        wait_for(lambda: nvml.readings[0] >= 5)
    figures = occupancy.figures
    assert 0 < figures["gpu_busy_pct"] < 100 and (figures["gpu_busy_p10_pct"], figures["gpu_busy_p90_pct"]) == (0, 100)
    assert occupancy_cells(figures).startswith(f"{figures['gpu_busy_pct']:.0f} (0-100) | ")
    with Occupancy("cpu", period_s=0.005) as occupancy:  # the control: the same card, a run on the CPU
        nvml.busy = True
    assert occupancy.figures["gpu_busy_pct"] is None
