"""Processes and threads sized by the cores this process may use (its affinity, its cgroup's CPU quota), not the
host's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from terra.core.device import cgroup_cpu_quota

SIZES = """
import json
from terra.closedloop.study.processes import shard_plan
from terra.config.backend import check_num_threads
from terra.core.device import usable_cores
print(json.dumps({"cores": usable_cores(), "shard_threads": shard_plan({"scene": 1})[0],
                  "auto_threads": check_num_threads("auto")}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two cores to restrict a process to one")
def test_a_process_given_one_core_sizes_its_shards_and_threads_by_it():
    core = min(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, "-c", SIZES], capture_output=True, text=True, timeout=120,
                          preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"cores": 1, "shard_threads": 1, "auto_threads": 1}


@pytest.mark.parametrize("files, quota", [
    ({"cpu.max": "150000 100000\n"}, 1.5), ({"cpu.max": "max 100000\n"}, None),
    ({"cpu/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 2.0),
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None), ({}, None)])
def test_a_cgroup_quota_is_read_in_either_version(tmp_path, files, quota):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    assert cgroup_cpu_quota(tmp_path) == quota
