"""The Transformers backend's KV caches as plain tensors (``KV``) between frames, :class:`DynamicCache` s in a pass.
A rollout's tensors are never written in place, so a fork may share its parent's.
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer: keys, values [B, heads, length, head_dim]


def kv_tensors(cache: DynamicCache) -> KV:
    return [layer.held() if isinstance(layer, BufferLayer) else (layer.keys, layer.values) for layer in cache.layers]


def kv_cache(kv: KV | None, capacity: int | None = None) -> DynamicCache:
    """A cache holding ``kv``: grown by concatenation (``kv`` unchanged), or a copy in ``capacity`` BufferLayers."""
    cache = DynamicCache()
    if capacity is not None:
        cache.layer_class_to_replicate = partial(BufferLayer, capacity)
    for layer, (keys, values) in enumerate(kv or []):
        cache.update(keys, values, layer)
    return cache


def crop(cache: DynamicCache, length: int) -> None:
    """Keep the first ``length`` positions of every layer of ``cache``."""
    for layer in cache.layers:
        if isinstance(layer, BufferLayer):
            layer.length = min(layer.length, length)
        elif length < layer.get_seq_length():
            layer.crop(length - layer.get_seq_length())


class BufferLayer(DynamicLayer):
    """A cache layer in buffers of ``capacity`` positions, written in place (a speculative pass copies its tokens)."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._keys = self._values = torch.empty(0)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        batch, heads, _, width = key_states.shape
        self.dtype, self.device = key_states.dtype, key_states.device
        self._keys = key_states.new_empty(batch, heads, self.capacity, width)
        self._values = value_states.new_empty(batch, value_states.shape[1], self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:  # past the capacity: double it
            room = max(end, 2 * self._keys.shape[-2])
            self._keys, self._values = (
                torch.cat([kept[:, :, : self.length], kept.new_empty(*kept.shape[:2], room - self.length,
                                                                      kept.shape[-1])], dim=2)
                for kept in (self._keys, self._values))
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.held()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last ``-tokens_to_remove`` positions (a positive value: keep that many, as DynamicLayer)."""
        self.length = min(tokens_to_remove, self.length) if tokens_to_remove > 0 else self.length + tokens_to_remove

    def held(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._keys[:, :, : self.length], self._values[:, :, : self.length]

