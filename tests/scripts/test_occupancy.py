"""Who waits over a benchmark's row (scripts/bench/lib/occupancy.py): shares read from the processes' CPU time."""

from __future__ import annotations

import subprocess
import sys
import time

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
    """A child process titled as vLLM's engine core, running the code it is given; ended after the test."""
    children = []

    def start(code: str) -> psutil.Process:
        child = subprocess.Popen([sys.executable, "-c", code, "VLLM::EngineCore"], stdin=subprocess.PIPE)
        children.append(child)
        return psutil.Process(child.pid)

    yield start
    for child in children:
        child.kill()
        child.wait()


def wait_for(done, deadline_s: float = 60.0) -> None:
    end = time.monotonic() + deadline_s
    while not done():
        assert time.monotonic() < end, "the state never came"
        time.sleep(0.01)  # polls


def test_a_busy_engine_core_and_an_idle_client(engine_core):
    core = engine_core(BUSY)
    wait_for(lambda: cpu_seconds(core) > 0.05)  # started
    with Occupancy("cpu") as occupancy:
        start = cpu_seconds(core)
        wait_for(lambda: cpu_seconds(core) - start > 0.5)
    figures = occupancy.figures
    assert figures["engine_core_cpu"] > 0.25 and figures["client_cpu"] < 0.1, figures
    assert figures["gpu_busy_pct"] is None and occupancy_cells(figures).startswith("– | ")


def test_an_idle_engine_core_and_a_busy_client(engine_core):
    core = engine_core(IDLE)
    with Occupancy("cpu") as occupancy:
        start = time.process_time()
        while time.process_time() - start < 0.5:
            pass
    figures = occupancy.figures
    assert figures["engine_core_cpu"] < 0.1 and figures["client_cpu"] > 0.25, figures
    assert core.is_running()


def test_no_engine_core_of_its_own_is_not_measured():
    with Occupancy("cpu") as occupancy:
        sum(range(100_000))
    assert occupancy.figures["engine_core_cpu"] is None
    assert occupancy_cells(occupancy.figures).startswith("– | – | ")
