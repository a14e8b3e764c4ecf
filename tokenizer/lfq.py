"""Terra's image tokenizer: the Open-MAGVIT2 (v1) LFQ model (``model_type: lfq_tokenizer``)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from terra.core.errors import TerraInputError
from terra.tokenizer.base import ImageTokenizer, TrainOutput
from terra.tokenizer.lfq_quantizer import LookupFreeQuantizer
from terra.tokenizer.magvit2 import Decoder, Encoder

DEFAULT_IMAGE_SIZE = (288, 512)  # Terra's input size: 18x32 codes

TERRA_CONFIG: dict[str, Any] = {  # the published config.json, without auto_map, plus the image size
    "encoder_decoder_config": {"ch": 128, "in_channels": 3, "out_ch": 3, "z_channels": 18, "num_res_blocks": 2,
                               "ch_mult": [1, 1, 2, 2, 4]},
    "quantizer_config": {"dim": 18, "codebook_size": 262144, "batch_maximization_weight": 1.0,
                         "sample_minimization_weight": 1.0},
    "image_size": list(DEFAULT_IMAGE_SIZE),
}


class LFQTokenizer(ImageTokenizer):
    """Open-MAGVIT2 encoder and decoder around a lookup-free (sign) quantiser."""

    model_type = "lfq_tokenizer"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self.config.pop("auto_map", None)
        net = _network_config(self.config)
        quant = _quantizer_config(self.config, net["z_channels"])
        self.num_bits = net["z_channels"]
        self.num_levels = len(net["ch_mult"])
        self.encoder = Encoder(net["ch"], net["ch_mult"], net["num_res_blocks"], net["z_channels"], net["in_channels"])
        self.quantize = LookupFreeQuantizer(self.num_bits, float(quant.get("sample_minimization_weight", 1.0)),
                                            float(quant.get("batch_maximization_weight", 1.0)))
        self.decoder = Decoder(net["ch"], net["ch_mult"], net["num_res_blocks"], net["z_channels"], net["out_ch"])
        self.entropy_loss_weight = float(quant.get("entropy_loss_weight", 0.1))
        self.commitment_loss_weight = float(quant.get("commitment_loss_weight", 0.25))
        self._image_size = tuple(int(v) for v in self.config.get("image_size") or DEFAULT_IMAGE_SIZE)
        self._check_image_size()

    @property
    def downsample_factor(self) -> int:
        return 2 ** (self.num_levels - 1)

    @property
    def codebook_size(self) -> int:
        return 2**self.num_bits

    @property
    def image_size(self) -> tuple[int, int]:
        return self._image_size

    def latent_to_codes(self, latent: torch.Tensor) -> torch.Tensor:
        return self.quantize.latent_to_codes(latent)

    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        return self.quantize.codes_to_latent(codes, self.dtype)

    def forward(self, images: torch.Tensor) -> TrainOutput:
        """Training pass: reconstruction through the straight-through sign, plus entropy and commitment losses."""
        q = self.quantize(self.encode_latent(images))
        loss = self.entropy_loss_weight * q.entropy_loss + self.commitment_loss_weight * q.commitment
        stats = {"commitment": q.commitment.detach(), "sample_entropy": q.sample_entropy.detach(),
                 "codebook_entropy": q.codebook_entropy.detach()}
        return TrainOutput(self.decode_latent(q.quantized), q.codes, loss, stats)


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
        raise TerraInputError(
            f"encoder_decoder_config needs a non-empty ch_mult, num_res_blocks >= 1 and z_channels >= 1 (got "
            f"{out['ch_mult']}, {out['num_res_blocks']}, {out['z_channels']}); fix config.json"
        )
    return out


def _quantizer_config(config: Mapping[str, Any], z_channels: int) -> dict[str, Any]:
    """``quantizer_config``, checked against the encoder's ``z_channels`` (one bit per channel)."""
    quant = config.get("quantizer_config") or {}
    if not isinstance(quant, dict):
        raise TerraInputError("quantizer_config must be a JSON object; fix config.json")
    if "dim" in quant and int(quant["dim"]) != z_channels:
        raise TerraInputError(
            f"quantizer_config.dim {quant['dim']} differs from encoder_decoder_config.z_channels {z_channels}; "
            "make them equal in config.json"
        )
    if "codebook_size" in quant and int(quant["codebook_size"]) != 2**z_channels:
        raise TerraInputError(
            f"quantizer_config.codebook_size {quant['codebook_size']} differs from 2**z_channels = "
            f"{2**z_channels}; fix config.json"
        )
    return quant
