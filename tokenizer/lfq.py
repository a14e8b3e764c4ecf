"""Terra's image tokenizer: Open-MAGVIT2 (v1) around a lookup-free quantiser (one sign bit per latent channel)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from terra.core.errors import TerraInputError
from terra.tokenizer.base import ImageTokenizer, TrainOutput
from terra.tokenizer.magvit2 import Decoder, Encoder

ENTROPY_TEMPERATURE = 0.01  # Open-MAGVIT2's entropy_loss default
ENTROPY_EPS = 1e-5  # inside the log of the codebook entropy, as in Open-MAGVIT2
DEFAULT_IMAGE_SIZE = (288, 512)  # Terra's input size: 18x32 codes
TERRA_CONFIG: dict[str, Any] = {  # the published config.json, without auto_map, plus the image size
    "encoder_decoder_config": {"ch": 128, "in_channels": 3, "out_ch": 3, "z_channels": 18, "num_res_blocks": 2,
                               "ch_mult": [1, 1, 2, 2, 4]},
    "quantizer_config": {"dim": 18, "codebook_size": 262144, "batch_maximization_weight": 1.0,
                         "sample_minimization_weight": 1.0},
    "image_size": list(DEFAULT_IMAGE_SIZE),
}


def bits_to_codes(bits: torch.Tensor) -> torch.Tensor:
    """Bits ``[..., C]`` (bool or 0/1) → codes ``[...]`` int64; bit 0 is the most significant."""
    weights = 2 ** torch.arange(bits.shape[-1] - 1, -1, -1, device=bits.device, dtype=torch.long)
    return (bits.long() * weights).sum(-1)


def codes_to_bits(codes: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Codes ``[...]`` → bits ``[..., num_bits]`` (bool), the inverse of :func:`bits_to_codes`."""
    shifts = torch.arange(num_bits - 1, -1, -1, device=codes.device, dtype=torch.long)
    return (codes.long().unsqueeze(-1) >> shifts) & 1 == 1


@dataclass
class QuantizerOutput:
    """What a training pass of the quantiser returns (losses unweighted by the tokenizer's loss weights)."""

    quantized: torch.Tensor  # [B, C, h, w], ±1 forward, straight-through gradient to the latent
    entropy_loss: torch.Tensor  # sample_minimization_weight * sample - batch_maximization_weight * codebook entropy
    commitment: torch.Tensor
    sample_entropy: torch.Tensor
    codebook_entropy: torch.Tensor


class LookupFreeQuantizer(nn.Module):
    """Sign quantiser, one bit per latent channel: Open-MAGVIT2's LFQ with one codebook."""

    def __init__(self, sample_minimization_weight: float = 1.0, batch_maximization_weight: float = 1.0) -> None:
        super().__init__()
        self.sample_minimization_weight = sample_minimization_weight
        self.batch_maximization_weight = batch_maximization_weight

    def forward(self, z: torch.Tensor) -> QuantizerOutput:
        """Training pass: straight-through quantisation, commitment and entropy terms (fp32)."""
        q = torch.where(z > 0, 1.0, -1.0).to(z.dtype)
        with torch.autocast(z.device.type, enabled=False):  # entropies need fp32 logs and matmuls
            logits = rearrange(z.float(), "b c h w -> (b h w) c") * (4 / ENTROPY_TEMPERATURE)
            sample_entropy, codebook_entropy = entropies(logits)
            commitment = (z.float() - q.float()).pow(2).mean()
        entropy_loss = (self.sample_minimization_weight * sample_entropy
                        - self.batch_maximization_weight * codebook_entropy)
        return QuantizerOutput(z + (q - z).detach(), entropy_loss, commitment, sample_entropy, codebook_entropy)


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


class LFQTokenizer(ImageTokenizer):
    """Open-MAGVIT2 encoder and decoder around a lookup-free (sign) quantiser."""

    model_type = "lfq_tokenizer"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.config.pop("auto_map", None)
        net = _network_config(self.config)
        quant = _quantizer_config(self.config, net["z_channels"])
        self.num_bits = net["z_channels"]
        self.downsample_factor = 2 ** (len(net["ch_mult"]) - 1)
        self.codebook_size = 2**self.num_bits
        self.encoder = Encoder(net["ch"], net["ch_mult"], net["num_res_blocks"], net["z_channels"], net["in_channels"])
        self.quantize = LookupFreeQuantizer(float(quant.get("sample_minimization_weight", 1.0)),
                                            float(quant.get("batch_maximization_weight", 1.0)))
        self.decoder = Decoder(net["ch"], net["ch_mult"], net["num_res_blocks"], net["z_channels"], net["out_ch"])
        self.entropy_loss_weight = float(quant.get("entropy_loss_weight", 0.1))
        self.commitment_loss_weight = float(quant.get("commitment_loss_weight", 0.25))
        self.image_size = tuple(int(v) for v in self.config.get("image_size") or DEFAULT_IMAGE_SIZE)
        self._check_image_size()

    def latent_to_codes(self, latent: torch.Tensor) -> torch.Tensor:
        return bits_to_codes(rearrange(latent > 0, "b c h w -> b h w c"))

    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        return rearrange(codes_to_bits(codes, self.num_bits).to(self.dtype) * 2 - 1, "b h w c -> b c h w")

    def forward(self, images: torch.Tensor) -> TrainOutput:
        """Training pass: reconstruction through the straight-through sign, plus entropy and commitment losses."""
        z = self.encode_latent(images)
        q = self.quantize(z)
        loss = self.entropy_loss_weight * q.entropy_loss + self.commitment_loss_weight * q.commitment
        stats = {"commitment": q.commitment.detach(), "sample_entropy": q.sample_entropy.detach(),
                 "codebook_entropy": q.codebook_entropy.detach()}
        return TrainOutput(self.decode_latent(q.quantized), self.latent_to_codes(z.detach()), loss, stats)


def _network_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """``encoder_decoder_config`` checked, with integer sizes and Open-MAGVIT2's channel defaults filled in."""
    net = config.get("encoder_decoder_config")
    if not isinstance(net, dict):
        raise TerraInputError("LFQ tokenizer config lacks encoder_decoder_config; add it (see tokenizer/lfq.py)")
    missing = [k for k in ("ch", "ch_mult", "num_res_blocks", "z_channels") if k not in net]
    if missing:
        raise TerraInputError(f"encoder_decoder_config lacks {', '.join(missing)}; add them to config.json")
    out = {key: int(net.get(key, 3)) for key in ("ch", "num_res_blocks", "z_channels", "in_channels", "out_ch")}
    out["ch_mult"] = [int(m) for m in net["ch_mult"]]
    if not out["ch_mult"] or out["num_res_blocks"] < 1 or out["z_channels"] < 1:
        raise TerraInputError("encoder_decoder_config needs a non-empty ch_mult, num_res_blocks >= 1 and z_channels "
                              f">= 1 (got {out['ch_mult']}, {out['num_res_blocks']}, {out['z_channels']}); fix "
                              "config.json")
    return out


def _quantizer_config(config: Mapping[str, Any], z_channels: int) -> dict[str, Any]:
    """``quantizer_config``, checked against the encoder's ``z_channels`` (one bit per channel)."""
    quant = config.get("quantizer_config") or {}
    if not isinstance(quant, dict):
        raise TerraInputError("quantizer_config must be a JSON object; fix config.json")
    if "dim" in quant and int(quant["dim"]) != z_channels:
        raise TerraInputError(f"quantizer_config.dim {quant['dim']} differs from encoder_decoder_config.z_channels "
                              f"{z_channels}; make them equal in config.json")
    if "codebook_size" in quant and int(quant["codebook_size"]) != 2**z_channels:
        raise TerraInputError(f"quantizer_config.codebook_size {quant['codebook_size']} differs from 2**z_channels = "
                              f"{2**z_channels}; fix config.json")
    return quant
