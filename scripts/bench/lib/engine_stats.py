"""What the vLLM engine did during a measurement: time in its calls, prefix-cache reuse."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from terra.generation.vllm_backend import FrameStat


class CallTimer:
    """Wraps one method of an object (e.g. the engine's ``step``) and adds up calls and seconds spent in it."""

    def __init__(self, obj: Any, name: str) -> None:
        self.wrapped: Callable = getattr(obj, name)
        self.calls = 0
        self.seconds = 0.0
        setattr(obj, name, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.wrapped(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def reset(self) -> None:
        """Start counting from zero (one measurement's calls only)."""
        self.calls, self.seconds = 0, 0.0


def prefix_summary(stats: list[FrameStat], block_size: int, action_tokens: int) -> dict:
    """Prompt tokens computed vs served from cache over the frame requests after each window's first."""
    later = [s for s in stats if not s.window_start]
    if not later:
        return {"frame_requests": len(stats), "later_requests": 0}
    computed = [s.computed_tokens for s in later]
    return {
        "frame_requests": len(stats),
        "later_requests": len(later),
        "computed_tokens_max": int(max(computed)),
        "computed_tokens_mean": float(np.mean(computed)),
        "hit_rate_mean": float(np.mean([s.hit_rate for s in later])),
        "target_computed_max": block_size + action_tokens,
    }
