"""Lookup-free quantisation tokenizer (MAGVIT-v2 style), the family of Terra's image tokenizer.

The encoder outputs ``z_channels`` values per position; each is quantised to its sign, one bit per channel.

Bit order: channel 0 is the most significant bit, and a bit is 1 where the channel's value is positive.
So ``code = sum_c [z_c > 0] * 2 ** (z_channels - 1 - c)``, and the embedding of code ``c`` fed to the
decoder is its bits mapped to ``{-1, +1}`` (times ``quantizer_config.codebook_scale``, default 1).

Config (Terra's ``config.json`` loads unchanged)::

    {"model_type": "lfq_tokenizer",
     "encoder_decoder_config": {"ch": 128, "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 2, "z_channels": 18,
                                "resolution": 256, "in_channels": 3, "out_ch": 3, "attn_resolutions": [16],
                                "dropout": 0.0},
     "quantizer_config": {...},
     "image_size": [288, 512]}            # ours; absent in Terra's config, which runs at 288x512

Attention sits at the levels where ``resolution // 2**level`` is in ``attn_resolutions`` (taming's rule).
Training losses (read from ``quantizer_config`` with these defaults): commitment
``commitment_loss_weight`` 0.25, entropy ``entropy_loss_weight`` 0.1 times (per-sample entropy −
``diversity_gamma`` 1.0 × codebook entropy), code probabilities ``softmax(-||z - c||² / entropy_temperature)``
with temperature 0.01.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from einops import rearrange

from tokenizer.errors import InputError
from tokenizer.base import ImageTokenizer, TrainOutput
from tokenizer.modules import Decoder, Encoder

DEFAULT_IMAGE_SIZE = (288, 512)  # Terra's input size (SPEC §5)
EXACT_ENTROPY_MAX_BITS = 12  # up to 4096 codes the codebook entropy is computed exactly

TERRA_CONFIG: dict[str, Any] = {
    "encoder_decoder_config": {
        "ch": 128, "ch_mult": [1, 1, 2, 2, 4], "num_res_blocks": 2, "z_channels": 18, "resolution": 256,
        "in_channels": 3, "out_ch": 3, "attn_resolutions": [16], "dropout": 0.0,
    },
    "quantizer_config": {},
    "image_size": list(DEFAULT_IMAGE_SIZE),
}


def bits_to_codes(bits: torch.Tensor) -> torch.Tensor:
    """Bits ``[..., C]`` (bool or 0/1) → codes ``[...]`` int64; bit 0 is the most significant."""
    num_bits = bits.shape[-1]
    weights = 2 ** torch.arange(num_bits - 1, -1, -1, device=bits.device, dtype=torch.long)
    return (bits.long() * weights).sum(-1)


def codes_to_bits(codes: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Codes ``[...]`` → bits ``[..., num_bits]`` (bool), the inverse of :func:`bits_to_codes`."""
    shifts = torch.arange(num_bits - 1, -1, -1, device=codes.device, dtype=torch.long)
    return (codes.long().unsqueeze(-1) >> shifts) & 1 == 1


def _binary_entropy(p: torch.Tensor) -> torch.Tensor:
    p = p.clamp(1e-6, 1 - 1e-6)
    return -(p * p.log() + (1 - p) * (1 - p).log())


class LFQTokenizer(ImageTokenizer):
    """Sign-quantised conv autoencoder with ``2 ** z_channels`` codes."""

    model_type = "lfq_tokenizer"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        edc = self.config.get("encoder_decoder_config")
        if not isinstance(edc, dict):
            raise InputError("LFQ tokenizer config lacks encoder_decoder_config; add it (see tokenizer/lfq.py)")
        missing = [k for k in ("ch", "ch_mult", "num_res_blocks", "z_channels") if k not in edc]
        if missing:
            raise InputError(f"encoder_decoder_config lacks {', '.join(missing)}; add them to config.json")
        self.quantizer_config = dict(self.config.get("quantizer_config") or {})
        self.num_bits = int(edc["z_channels"])
        stated = self.quantizer_config.get("codebook_size")
        if stated is not None and int(stated) != 2**self.num_bits:
            raise InputError(
                f"quantizer_config.codebook_size {stated} differs from 2**z_channels = {2 ** self.num_bits}; fix config.json"
            )
        ch_mult = list(edc["ch_mult"])
        resolution = edc.get("resolution", 256)
        resolution = int(resolution[0] if isinstance(resolution, (list, tuple)) else resolution)
        attn_resolutions = set(edc.get("attn_resolutions", []))
        attn_levels = [i for i in range(len(ch_mult)) if resolution // 2**i in attn_resolutions]
        common = dict(ch=int(edc["ch"]), ch_mult=ch_mult, num_res_blocks=int(edc["num_res_blocks"]),
                      z_channels=self.num_bits, attn_levels=attn_levels, dropout=float(edc.get("dropout", 0.0)))
        self.encoder = Encoder(in_channels=int(edc.get("in_channels", 3)), **common)
        self.decoder = Decoder(out_channels=int(edc.get("out_ch", 3)), **common)
        size = self.config.get("image_size") or (edc["resolution"] if isinstance(edc.get("resolution"), list) else None)
        self._image_size = tuple(int(v) for v in size) if size else DEFAULT_IMAGE_SIZE
        self._check_image_size()
        self.scale = float(self.quantizer_config.get("codebook_scale", 1.0))

    @property
    def downsample_factor(self) -> int:
        return 2 ** (len(self.encoder.conv_blocks) - 1)

    @property
    def codebook_size(self) -> int:
        return 2**self.num_bits

    @property
    def image_size(self) -> tuple[int, int]:
        return self._image_size

    def latent_to_codes(self, latent: torch.Tensor) -> torch.Tensor:
        return bits_to_codes(rearrange(latent > 0, "b c h w -> b h w c"))

    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        signs = codes_to_bits(codes, self.num_bits).to(self.dtype) * 2 - 1
        return rearrange(signs * self.scale, "b h w c -> b c h w")

    def forward(self, images: torch.Tensor) -> TrainOutput:
        """Training pass: reconstruction through the straight-through sign, plus commitment and entropy losses."""
        z = self.encode_latent(images)
        q = torch.where(z > 0, self.scale, -self.scale).to(z.dtype)
        z_q = z + (q - z).detach()
        recon = self.decode_latent(z_q)
        qc = self.quantizer_config
        commitment = (z.float() - q.float()).pow(2).mean()
        sample_entropy, codebook_entropy = self._entropies(z.float())
        gamma = float(qc.get("diversity_gamma", 1.0))
        loss = float(qc.get("commitment_loss_weight", 0.25)) * commitment + float(
            qc.get("entropy_loss_weight", 0.1)
        ) * (sample_entropy - gamma * codebook_entropy)
        stats = {"commitment": commitment.detach(), "sample_entropy": sample_entropy.detach(),
                 "codebook_entropy": codebook_entropy.detach()}
        return TrainOutput(recon, self.latent_to_codes(z.detach()), loss, stats)

    def _entropies(self, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean per-position entropy and entropy of the batch-average code distribution (nats).

        With ``p(code) ∝ exp(-||z - c||² / T)`` over the ±scale codebook, the bits are independent:
        ``p(bit_c = 1) = sigmoid(4 scale z_c / T)``. The per-position entropy is then exactly the sum of bit
        entropies. The codebook entropy is exact up to :data:`EXACT_ENTROPY_MAX_BITS` bits; above that it
        is the sum of the entropies of the average bit marginals (an upper bound that still rewards
        balanced, independent bits) since the full 2**C distribution would not fit in memory.
        """
        with torch.autocast(z.device.type, enabled=False):  # log-probabilities need fp32 matmuls
            temperature = float(self.quantizer_config.get("entropy_temperature", 0.01))
            p = torch.sigmoid(4 * self.scale * rearrange(z.float(), "b c h w -> (b h w) c") / temperature)  # [N, C]
            sample_entropy = _binary_entropy(p).sum(-1).mean()
            if self.num_bits > EXACT_ENTROPY_MAX_BITS:
                return sample_entropy, _binary_entropy(p.mean(0)).sum()
            bits = codes_to_bits(torch.arange(self.codebook_size, device=z.device), self.num_bits).float()  # [K, C]
            log_p = p.clamp_min(1e-8).log() @ bits.T + (1 - p).clamp_min(1e-8).log() @ (1 - bits).T  # [N, K]
            avg = log_p.exp().mean(0)
            return sample_entropy, -(avg * avg.clamp_min(1e-8).log()).sum()
