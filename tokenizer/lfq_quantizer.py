"""Lookup-free quantisation (LFQ): each latent channel is quantised to its sign, one bit per channel."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

ENTROPY_TEMPERATURE = 0.01  # Open-MAGVIT2's entropy_loss default
ENTROPY_EPS = 1e-5  # inside the log of the codebook entropy, as in Open-MAGVIT2


def bits_to_codes(bits: torch.Tensor) -> torch.Tensor:
    """Bits ``[..., C]`` (bool or 0/1) → codes ``[...]`` int64; bit 0 is the most significant."""
    num_bits = bits.shape[-1]
    weights = 2 ** torch.arange(num_bits - 1, -1, -1, device=bits.device, dtype=torch.long)
    return (bits.long() * weights).sum(-1)


def codes_to_bits(codes: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Codes ``[...]`` → bits ``[..., num_bits]`` (bool), the inverse of :func:`bits_to_codes`."""
    shifts = torch.arange(num_bits - 1, -1, -1, device=codes.device, dtype=torch.long)
    return (codes.long().unsqueeze(-1) >> shifts) & 1 == 1


@dataclass
class QuantizerOutput:
    """What a training pass of the quantiser returns (losses unweighted by the tokenizer's loss weights)."""

    quantized: torch.Tensor  # [B, C, h, w], ±1 forward, straight-through gradient to the latent
    codes: torch.Tensor  # [B, h, w] int64
    entropy_loss: torch.Tensor  # sample_minimization_weight * sample - batch_maximization_weight * codebook entropy
    commitment: torch.Tensor
    sample_entropy: torch.Tensor
    codebook_entropy: torch.Tensor


class LookupFreeQuantizer(nn.Module):
    """Sign quantiser with ``2 ** num_bits`` codes, Open-MAGVIT2's LFQ with one codebook."""

    def __init__(
        self, num_bits: int, sample_minimization_weight: float = 1.0, batch_maximization_weight: float = 1.0
    ) -> None:
        super().__init__()
        self.num_bits = num_bits
        self.sample_minimization_weight = sample_minimization_weight
        self.batch_maximization_weight = batch_maximization_weight

    def latent_to_codes(self, latent: torch.Tensor) -> torch.Tensor:
        """Latent ``[B, C, h, w]`` → codes ``[B, h, w]`` (int64)."""
        return bits_to_codes(rearrange(latent > 0, "b c h w -> b h w c"))

    def codes_to_latent(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Codes ``[B, h, w]`` → the ±1 decoder input ``[B, C, h, w]``."""
        signs = codes_to_bits(codes, self.num_bits).to(dtype) * 2 - 1
        return rearrange(signs, "b h w c -> b c h w")

    def forward(self, z: torch.Tensor) -> QuantizerOutput:
        """Training pass: straight-through quantisation, codes, commitment and entropy terms (fp32)."""
        q = torch.where(z > 0, 1.0, -1.0).to(z.dtype)
        with torch.autocast(z.device.type, enabled=False):  # entropies need fp32 logs and matmuls
            logits = rearrange(z.float(), "b c h w -> (b h w) c") * (4 / ENTROPY_TEMPERATURE)
            sample_entropy, codebook_entropy = entropies(logits)
            commitment = (z.float() - q.float()).pow(2).mean()
        entropy_loss = (self.sample_minimization_weight * sample_entropy
                        - self.batch_maximization_weight * codebook_entropy)
        return QuantizerOutput(
            quantized=z + (q - z).detach(), codes=self.latent_to_codes(z.detach()), entropy_loss=entropy_loss,
            commitment=commitment, sample_entropy=sample_entropy, codebook_entropy=codebook_entropy,
        )


def entropies(bit_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position code entropy (mean over positions) and entropy of the position-averaged code distribution."""
    log_p1, log_p0 = F.logsigmoid(bit_logits), F.logsigmoid(-bit_logits)
    sample_entropy = -(log_p1.exp() * log_p1 + log_p0.exp() * log_p0).sum(-1).mean()
    high = bit_logits.shape[-1] // 2
    p_high = _pattern_probabilities(log_p1[:, :high], log_p0[:, :high])
    p_low = _pattern_probabilities(log_p1[:, high:], log_p0[:, high:])
    avg = (p_high.T @ p_low).flatten() / len(bit_logits)
    return sample_entropy, -(avg * (avg + ENTROPY_EPS).log()).sum()


def _pattern_probabilities(log_p1: torch.Tensor, log_p0: torch.Tensor) -> torch.Tensor:
    """Log-probabilities of k independent bits ``[N, k]`` → probabilities of all ``2**k`` patterns ``[N, 2**k]``."""
    k = log_p1.shape[-1]
    bits = codes_to_bits(torch.arange(2**k, device=log_p1.device), k).to(log_p1.dtype)  # [2**k, k]
    return (log_p1 @ bits.T + log_p0 @ (1 - bits).T).exp()
