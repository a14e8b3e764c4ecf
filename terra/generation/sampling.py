"""The Transformers backend's sampler (the settings, :class:`SamplingConfig`, are in terra/config/sampling.py).

Image tokens are drawn only from the image codebook ``[0, codebook_size)``: ids at or above it (the action
placeholder, special ids) are never sampled, whatever the logits say. ``temperature == 0`` means greedy.
"""

from __future__ import annotations

import torch

from terra.config.sampling import SamplingConfig


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
