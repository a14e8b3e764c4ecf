"""The Transformers backend's sampler (the settings, :class:`SamplingConfig`, are in terra/config/sampling.py).

Image tokens are drawn only from the image codebook ``[0, codebook_size)``: ids at or above it (the action
placeholder, special ids) are never sampled, whatever the logits say. ``temperature == 0`` means greedy.
:func:`image_token_probs` is the distribution a token is drawn from (temperature, top-k and top-p applied); the
sequential sampler draws from it and speculative decoding (terra/generation/speculative.py) keeps exactly it.
"""

from __future__ import annotations

import torch

from terra.config.sampling import SamplingConfig


def image_token_probs(logits: torch.Tensor, codebook_size: int, config: SamplingConfig) -> torch.Tensor:
    """The warped distribution ``[B, codebook_size]`` (float32) of each row of ``logits [B, vocab]``: temperature,
    then top-k (0 = off), then top-p (the smallest set of most likely codes whose mass reaches it). Not greedy."""
    logits = logits[:, :codebook_size].float() / config.temperature
    if 0 < config.top_k < codebook_size:
        kth = torch.topk(logits, config.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative - sorted_logits.softmax(dim=-1) >= config.top_p  # keep the smallest set reaching top_p
        logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return logits.softmax(dim=-1)


def sample_image_tokens(
    logits: torch.Tensor, codebook_size: int, config: SamplingConfig, generators: list[torch.Generator]
) -> torch.Tensor:
    """Draw one image token per row of ``logits [B, vocab]`` with row ``i`` using ``generators[i]``."""
    if config.greedy:
        return logits[:, :codebook_size].float().argmax(dim=-1)
    probs = image_token_probs(logits, codebook_size, config)
    return torch.cat([torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generators)])
