"""Where a run computes: device name, ``auto`` device and dtype, torch's CPU threads and the usable CPU cores."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from terra.core.errors import TerraInputError

DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:[0-9]{1,2})?")
CGROUP = Path("/sys/fs/cgroup")


def check_device(value: Any) -> str:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N``, checked as a name only."""
    if not isinstance(value, str) or not DEVICE_PATTERN.fullmatch(value):
        text = repr(value)
        text = text if len(text) <= 40 else f"{text[:37]}..."
        raise TerraInputError(f"device={text} is not a device; use auto, cpu, cuda or cuda:N (e.g. cuda:0)")
    return value


def resolve_device(device: str = "auto") -> str:
    """``auto`` → ``cuda`` when a GPU is visible, else ``cpu``; a GPU asked for must exist (one line otherwise)."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TerraInputError(f"device={device} was asked for but no CUDA GPU is visible; use device=cpu or auto")
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise TerraInputError(f"device={device} does not exist: {torch.cuda.device_count()} GPU(s) are visible "
                              "(cuda:0 is the first); use another index or device=auto")
    return device


def auto_dtype(device: str, dtype: str = "auto") -> str:
    """The dtype name ``auto`` stands for on a resolved ``device``: bfloat16 on a GPU, float32 on a CPU."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def set_threads(num_threads: int | None) -> None:
    """Give this process's torch ``num_threads`` CPU threads (None: leave torch's default)."""
    if num_threads is not None:
        import torch

        torch.set_num_threads(num_threads)


def usable_cores() -> int:
    """The CPU cores this process may use: its affinity, capped by its cgroup's CPU quota, at least one."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    return max(1, min(cores, math.ceil(quota)) if quota is not None else cores)


def cgroup_cpu_quota(root: Path = CGROUP) -> float | None:
    """The CPUs' worth of time a second that the cgroup under ``root`` allows (v1 or v2)."""
    try:
        if (root / "cpu.max").exists():
            quota, period = (root / "cpu.max").read_text().split()[:2]
        else:
            quota, period = ((root / "cpu" / f"cpu.cfs_{name}_us").read_text().strip() for name in ("quota", "period"))
    except (OSError, ValueError):
        return None
    if quota in ("max", "-1") or int(period) <= 0:
        return None
    return int(quota) / int(period)
