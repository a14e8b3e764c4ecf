"""The Transformers backend's KV caches as plain tensors: a rollout keeps ``KV`` between frames, a forward pass
takes a :class:`DynamicCache` (terra/generation/hf_backend.py, terra/generation/hf_speculative.py).

Nothing here writes a cache tensor in place (a :class:`DynamicCache` grows by concatenation, :func:`crop` slices),
so a forked rollout may share its parent's tensors.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, heads, length, head_dim]


def kv_tensors(cache: DynamicCache) -> KV:
    """The cache's keys and values, layer by layer."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def kv_cache(kv: KV) -> DynamicCache:
    """A :class:`DynamicCache` holding ``kv`` (which stays unchanged: the cache grows by concatenation)."""
    cache = DynamicCache()
    for layer, (keys, values) in enumerate(kv):
        cache.update(keys, values, layer)
    return cache


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every layer of ``cache`` (views)."""
    for layer in cache.layers:
        layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]
