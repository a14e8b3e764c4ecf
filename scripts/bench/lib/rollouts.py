"""The measured workload: rollouts with random contexts, run together and timed per frame."""

from __future__ import annotations

import time

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.generation.decoding import auto_decoding
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import PassStats, RolloutRequest, WorldModelBackend
from terra.inputs.actions import actions_for_manoeuvre
from terra.inputs.trajectory import MANOEUVRES


def make_requests(layout: TokenLayout, count: int, num_context: int, num_frames: int, seed: int
                  ) -> list[RolloutRequest]:
    """``count`` rollouts with distinct random context codes (no prefix shared across them) and manoeuvres."""
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(count):
        context = rng.integers(0, layout.codebook_size, (num_context, layout.image_tokens))
        actions = actions_for_manoeuvre(MANOEUVRES[i % len(MANOEUVRES)], num_context + num_frames)
        requests.append(RolloutRequest(context, actions, num_frames, seed=seed + i))
    return requests


def row_sampling(backend: WorldModelBackend, sampling: SamplingConfig, rollouts: int) -> SamplingConfig:
    """``sampling`` as a run of ``rollouts`` in flight decodes it on ``backend``: a Transformers row chooses
    ``decoding=auto`` for its own rollouts, as an app's run does (terra/generation/decoding.py, ``auto_decoding``);
    a vLLM engine decodes as it was started."""
    if isinstance(backend, HFBackend) and sampling.decoding == "auto":
        sampling = sampling.replace(decoding=auto_decoding("hf", str(backend.device), rollouts))
    return backend.as_run(sampling)


def timed_generate(backend: WorldModelBackend, requests: list[RolloutRequest], sampling: SamplingConfig) -> dict:
    """Run ``requests`` together; wall time, aggregate frames/s, per-rollout seconds per frame, and the decoding
    that ran (:func:`row_sampling`) with its forward passes per frame."""
    first: list[float | None] = [None] * len(requests)
    last: list[float] = [0.0] * len(requests)

    def on_frame(index: int, frame: int, codes: np.ndarray) -> None:
        now = time.perf_counter()
        first[index] = first[index] or now
        last[index] = now

    sampling = row_sampling(backend, sampling, len(requests))
    start = time.perf_counter()
    states = backend.run_rollouts(requests, sampling, progress=False, on_frame=on_frame)
    wall = time.perf_counter() - start
    n = requests[0].num_frames
    return {
        "decoding": sum((s.pass_stats() for s in states), PassStats()).as_dict(sampling),
        "rollouts": len(requests),
        "frames_per_rollout": n,
        "wall_s": wall,
        "frames_per_s": len(requests) * n / wall,
        "s_per_frame": float(np.mean([(t - start) / n for t in last])),
        "first_frame_s": float(np.mean([t - start for t in first])),
        "steady_s_per_frame": float(np.mean([(b - a) / (n - 1) for a, b in zip(first, last)])) if n > 1 else None,
    }
