"""The Transformers backend's sampler (the settings, :class:`SamplingConfig`, are in terra/config/sampling.py).

Image tokens are drawn only from the image codebook ``[0, codebook_size)``: ids at or above it (the action
placeholder, special ids) are never sampled, whatever the logits say. ``temperature == 0`` means greedy.

A token is drawn by the Gumbel-max trick: ``argmax(s + g)``, where ``s`` are the warped scores of
:func:`image_token_scores` (temperature, top-k, top-p; ``softmax(s)`` is the distribution the token is drawn
from) and ``g`` is Gumbel noise fixed by the rollout's seed, the frame's index and the token's position in the
frame (:func:`gumbel_noise`). The noise of a position does not depend on when, or in which forward pass, its
token is drawn, so sequential and speculative decoding (terra/generation/speculative.py) draw the same token
wherever their inputs agree: that is what makes their codes equal for the same seed.
"""

from __future__ import annotations

from typing import Sequence

import torch

from terra.config.sampling import SamplingConfig

_MASK64 = (1 << 64) - 1


def image_token_scores(logits: torch.Tensor, codebook_size: int, config: SamplingConfig) -> torch.Tensor:
    """The warped scores ``[B, codebook_size]`` (float32) of each row of ``logits [B, vocab]``: divided by the
    temperature, then ``-inf`` outside the top-k (0 = off) and outside top-p (the smallest set of most likely codes
    whose mass reaches it). ``softmax`` of a row is the distribution its token is drawn from. Not greedy."""
    scores = logits[:, :codebook_size].float() / config.temperature
    if 0 < config.top_k < codebook_size:
        kth = torch.topk(scores, config.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= config.top_p  # keep the smallest set reaching top_p
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that spreads every input bit over the output."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def noise_key(seed: int, frame: int, position: int) -> int:
    """The 64-bit seed of the Gumbel noise of image position ``position`` of frame ``frame`` (its index in the
    rollout, context frames counted) of the rollout seeded ``seed``: distinct keys for distinct triples, in
    practice (a hash chain)."""
    key = _mix64(seed & _MASK64)
    key = _mix64((key + 0x9E3779B97F4A7C15 + (frame & _MASK64)) & _MASK64)
    return _mix64((key + 0x9E3779B97F4A7C15 + (position & _MASK64)) & _MASK64)


def gumbel_noise(seed: int, frame: int, positions: Sequence[int], size: int, device: torch.device | str = "cpu"
                 ) -> torch.Tensor:
    """Standard Gumbel noise ``[len(positions), size]`` (float32) for image positions ``positions`` of frame
    ``frame`` of the rollout seeded ``seed``: row ``i`` depends on ``(seed, frame, positions[i])`` only, drawn
    from its own generator (:func:`noise_key`) as ``-log(-log1p(-u))`` of 53-bit uniforms ``u``, so the winning
    tail is not rounded away. Only the rows asked for are drawn: a block of positions costs ``len(positions) x
    size`` random numbers whatever the frame's length. The values depend on the device's generator (a CPU and a
    GPU give different, equally valid, noise)."""
    device = torch.device(device)
    out = torch.empty(len(positions), size, device=device)
    scratch = torch.empty(size, dtype=torch.float64, device=device)  # one row at a time: stays in cache
    tiny = torch.finfo(torch.float64).tiny
    for row, position in zip(out, positions):
        scratch.uniform_(generator=torch.Generator(device).manual_seed(noise_key(seed, frame, position)))
        row.copy_(scratch.clamp_(min=tiny).neg_().log1p_().neg_().log_().neg_())  # -log(-log1p(-u))
    return out


def sample_image_tokens(logits: torch.Tensor, codebook_size: int, config: SamplingConfig,
                        noise: torch.Tensor | None) -> torch.Tensor:
    """One image token per row of ``logits [B, vocab]``: ``argmax(scores + noise)`` with ``noise [B, codebook_size]``
    from :func:`gumbel_noise` (the Gumbel-max trick: a draw from ``softmax(scores)``), or the argmax of the logits
    when greedy (``noise`` unused, may be None)."""
    if config.greedy:
        return logits[:, :codebook_size].float().argmax(dim=-1)
    return (image_token_scores(logits, codebook_size, config) + noise).argmax(dim=-1)
