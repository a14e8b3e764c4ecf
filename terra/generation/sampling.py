"""The Transformers backend's sampler."""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import torch

from terra.config.sampling import SamplingConfig


def image_token_scores(logits: torch.Tensor, codebook_size: int, config: SamplingConfig) -> torch.Tensor:
    """The warped scores ``[B, codebook_size]`` float32 of ``logits [B, vocab]``: temperature, top-k (0: off), top-p."""
    scores = logits[:, :codebook_size].float()
    if config.temperature != 1.0:
        scores = scores / config.temperature
    if 0 < config.top_k < codebook_size:
        kth = torch.topk(scores, config.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if config.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= config.top_p  # keep the smallest set reaching top_p
        scores = scores.masked_fill(drop.scatter(1, order, drop), float("-inf"))
    return scores


_WORD = 0xFFFFFFFF
_SIGN = 1 << 31
_STREAMS = (0x2545F491, 0x4F6CDD1D)  # the two words of a key (and of a uniform) start from these


def _int32(values: torch.Tensor) -> torch.Tensor:
    return (((values + _SIGN) & _WORD) - _SIGN).to(torch.int32)


def _hash32(words: torch.Tensor) -> torch.Tensor:
    """Chris Wellons' ``lowbias32`` hash of int32 ``words``, in place: a bijection of 32-bit words."""
    scratch = torch.empty_like(words)
    for multiplier, shift in ((0x21F0AAAD, 16), (0x735A2D97, 15), (None, 15)):
        words.bitwise_xor_(torch.bitwise_right_shift(words, shift, out=scratch).bitwise_and_((1 << 32 - shift) - 1))
        if multiplier is not None:
            words.mul_(multiplier)
    return words


def noise_keys(seed: int | torch.Tensor, frame: int | torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The int32 keys ``[2, n]`` of the Gumbel noise of image ``positions [n]`` of ``frame`` of rollout ``seed``."""
    device = positions.device
    seed, frame = (torch.as_tensor(v, dtype=torch.int64, device=device) for v in (seed, frame))
    keys = torch.tensor(_STREAMS, dtype=torch.int32, device=device)[:, None]  # both chains at once
    for link in (seed & _WORD, seed >> 32, frame & _WORD, positions.to(torch.int64)):
        keys = _hash32(keys ^ _int32(link))
    return keys.expand(2, len(positions))


@lru_cache(maxsize=4)
def _column_words(size: int, device: torch.device) -> torch.Tensor:
    codes = torch.arange(size, dtype=torch.int32, device=device)
    return torch.stack([_hash32(codes ^ start) for start in _STREAMS])


def gumbel_noise(seed: int | torch.Tensor, frame: int | torch.Tensor, positions: Sequence[int] | torch.Tensor,
                 size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Gumbel noise ``[len(positions), size]`` float32 of image ``positions`` of ``frame`` of rollout ``seed``."""
    device = torch.device(device)
    positions = torch.as_tensor(positions, dtype=torch.int64, device=device).reshape(-1)
    keys = noise_keys(seed, frame, positions)
    columns = _column_words(size, device)
    # in place from here: a frame's noise is megabytes
    bits = _hash32(keys[0, :, None] ^ columns[0]).bitwise_right_shift_(12).to(torch.int64)
    bits.bitwise_and_(0xFFFFF).bitwise_left_shift_(32)  # 20 bits, then 32 more
    bits.bitwise_or_(_hash32(keys[1, :, None] ^ columns[1]).to(torch.int64).bitwise_and_(_WORD))
    uniform = bits.to(torch.float64).add_(0.5).mul_(2.0 ** -52)
    exponential = uniform.neg_().log1p_().neg_()  # in float64: exact where it is small (the winning tail)
    return exponential.to(torch.float32).log_().neg_()


def sample_image_tokens(logits: torch.Tensor, codebook_size: int, config: SamplingConfig,
                        noise: torch.Tensor | None) -> torch.Tensor:
    """One image token per row of ``logits [B, vocab]``: ``argmax(scores + noise)``, or of the logits when greedy."""
    if config.greedy:
        return logits[:, :codebook_size].float().argmax(dim=-1)
    return (image_token_scores(logits, codebook_size, config) + noise).argmax(dim=-1)
