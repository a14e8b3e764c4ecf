"""Sampling settings shared by every backend, and the Transformers backend's sampler.

Image tokens are drawn only from the image codebook ``[0, codebook_size)``: ids at or above it (the action
placeholder, special ids) are never sampled, whatever the logits say. ``temperature == 0`` means greedy.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch

from terra.errors import TerraInputError


@dataclass(frozen=True)
class SamplingConfig:
    """Temperature (0 = greedy), top-k (0 = off) and top-p (1.0 = off); Terra's authors used 0.9 / 0 / 1.0."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        for name, kind in (("temperature", numbers.Real), ("top_k", numbers.Integral), ("top_p", numbers.Real)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, kind):
                raise TerraInputError(
                    f"sampling.{name} must be {'a whole number' if kind is numbers.Integral else 'a number'} "
                    f"(got {value!r}); e.g. sampling.{name}={getattr(SamplingConfig, name)}"
                )
        if not self.temperature >= 0:
            raise TerraInputError(f"sampling.temperature must be >= 0 (got {self.temperature}); use 0 for greedy")
        if self.top_k < 0:
            raise TerraInputError(f"sampling.top_k must be >= 0 (got {self.top_k}); use 0 to turn it off")
        if not 0 < self.top_p <= 1:
            raise TerraInputError(f"sampling.top_p must be in (0, 1] (got {self.top_p}); use 1.0 to turn it off")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def sample_image_tokens(
    logits: torch.Tensor, codebook_size: int, config: SamplingConfig, generators: list[torch.Generator]
) -> torch.Tensor:
    """Draw one image token per row of ``logits [B, vocab]`` with row ``i`` using ``generators[i]``."""
    logits = logits[:, :codebook_size].float()
    if config.greedy:
        return logits.argmax(dim=-1)
    logits = logits / config.temperature
    if 0 < config.top_k < codebook_size:
        kth = torch.topk(logits, config.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative - sorted_logits.softmax(dim=-1) >= config.top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    probs = logits.softmax(dim=-1)
    return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
