"""A benchmark row measures the vLLM engine cores its own run starts, not those another test of the worker left."""

import sys
from pathlib import Path

import psutil
import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:  # scripts/: the benchmarks' shared code is its package bench.lib
    sys.path.append(str(SCRIPTS))


@pytest.fixture(autouse=True)
def other_tests_engines_unseen(monkeypatch):
    """Engine cores running before the test (a session's vLLM engine) are left out of its rows."""
    from bench.lib import occupancy

    before = {process.pid for process in occupancy.engine_cores(psutil.Process())}
    if before:
        found = occupancy.engine_cores
        monkeypatch.setattr(occupancy, "engine_cores",
                            lambda client: [p for p in found(client) if p.pid not in before])
