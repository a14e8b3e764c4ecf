"""Vector-quantised tokenizer in LlamaGen's VQ-16 layout (also used by Valeo's VaViM)."""

from __future__ import annotations

import argparse
import os
import pickle
from typing import Any, Mapping

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from terra.core.errors import TerraInputError
from terra.tokenizer.base import ImageTokenizer, TrainOutput
from terra.tokenizer.modules import Decoder, Encoder

VQ16_CONFIG: dict[str, Any] = {
    "codebook_size": 16384, "codebook_embed_dim": 8, "codebook_l2_norm": True, "commit_loss_beta": 0.25,
    "entropy_loss_ratio": 0.0, "encoder_ch_mult": [1, 1, 2, 2, 4], "decoder_ch_mult": [1, 1, 2, 2, 4],
    "z_channels": 256, "dropout_p": 0.0, "ch": 128, "num_res_blocks": 2, "image_size": [288, 512],
}


class VectorQuantizer(nn.Module):
    """The codebook (``embedding``, ``[codebook_size, embed_dim]``) and its nearest-entry lookup."""

    def __init__(self, codebook_size: int, embed_dim: int, l2_norm: bool) -> None:
        super().__init__()
        self.l2_norm = l2_norm
        self.embedding = nn.Embedding(codebook_size, embed_dim)
        with torch.no_grad():
            self.embedding.weight.uniform_(-1.0 / codebook_size, 1.0 / codebook_size)
            if l2_norm:
                self.embedding.weight.copy_(F.normalize(self.embedding.weight, dim=-1))

    def codebook(self) -> torch.Tensor:
        """Entries as used for lookup and decoding (l2-normalised when configured)."""
        weight = self.embedding.weight
        return F.normalize(weight, dim=-1) if self.l2_norm else weight

    def affinity(self, z: torch.Tensor) -> torch.Tensor:
        """``[N, D]`` vectors → ``[N, K]`` negative squared distances to every entry (fp32, even under autocast)."""
        with torch.autocast(z.device.type, enabled=False):
            z = z.float()
            book = self.codebook().float()
            if self.l2_norm:
                z = F.normalize(z, dim=-1)
            return 2 * z @ book.T - z.pow(2).sum(-1, keepdim=True) - book.pow(2).sum(-1)


class VQTokenizer(ImageTokenizer):
    """LlamaGen-compatible VQ tokenizer with an l2-normalised codebook."""

    model_type = "vq_tokenizer"

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__({**VQ16_CONFIG, **dict(config)})
        c = self.config
        if len(c["encoder_ch_mult"]) != len(c["decoder_ch_mult"]):
            raise TerraInputError("encoder_ch_mult and decoder_ch_mult need the same length (same down/upsampling)")
        common = dict(ch=int(c["ch"]), num_res_blocks=int(c["num_res_blocks"]), z_channels=int(c["z_channels"]),
                      dropout=float(c["dropout_p"]))
        self.encoder = Encoder(ch_mult=list(c["encoder_ch_mult"]), **common)
        self.decoder = Decoder(ch_mult=list(c["decoder_ch_mult"]), **common)
        self.quantize = VectorQuantizer(int(c["codebook_size"]), int(c["codebook_embed_dim"]),
                                        bool(c["codebook_l2_norm"]))
        self.quant_conv = nn.Conv2d(int(c["z_channels"]), int(c["codebook_embed_dim"]), 1)
        self.post_quant_conv = nn.Conv2d(int(c["codebook_embed_dim"]), int(c["z_channels"]), 1)
        self.downsample_factor = 2 ** (len(c["encoder_ch_mult"]) - 1)
        self.codebook_size = int(c["codebook_size"])
        self.image_size = tuple(int(v) for v in c["image_size"])
        self._check_image_size()

    def encode_latent(self, images: torch.Tensor) -> torch.Tensor:
        return self.quant_conv(self.encoder(images))

    def decode_latent(self, latent: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.post_quant_conv(latent))

    def latent_to_codes(self, latent: torch.Tensor) -> torch.Tensor:
        b, _, h, w = latent.shape
        return self.quantize.affinity(rearrange(latent, "b d h w -> (b h w) d")).argmax(-1).reshape(b, h, w)

    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        return rearrange(self.quantize.codebook()[codes], "b h w d -> b d h w").to(self.dtype)

    def forward(self, images: torch.Tensor) -> TrainOutput:
        """Training pass: straight-through reconstruction, codebook + commitment (+ entropy) losses."""
        vq = self.quantize
        z = self.encode_latent(images)
        b, _, h, w = z.shape
        flat = rearrange(z, "b d h w -> (b h w) d").float()
        affinity = vq.affinity(flat)
        codes = affinity.argmax(-1)
        if vq.l2_norm:
            flat = F.normalize(flat, dim=-1)
        z_q = vq.codebook().float()[codes]
        codebook_loss = (z_q - flat.detach()).pow(2).mean()
        commitment = (z_q.detach() - flat).pow(2).mean()
        z_q = flat + (z_q - flat).detach()
        recon = self.decode_latent(rearrange(z_q, "(b h w) d -> b d h w", b=b, h=h, w=w).to(z.dtype))
        loss = codebook_loss + float(self.config["commit_loss_beta"]) * commitment
        stats = {"codebook": codebook_loss.detach(), "commitment": commitment.detach()}
        ratio = float(self.config["entropy_loss_ratio"])
        if ratio > 0:
            entropy = _entropy_loss(affinity)
            loss = loss + ratio * entropy
            stats["entropy"] = entropy.detach()
        return TrainOutput(recon, codes.reshape(b, h, w), loss, stats)

    @classmethod
    def from_llamagen(cls, path: str | os.PathLike, **config: Any) -> "VQTokenizer":
        """Load LlamaGen's original checkpoint; ``config`` overrides the VQ-16 defaults."""
        try:
            with torch.serialization.safe_globals([argparse.Namespace]):
                checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        except (OSError, RuntimeError, EOFError, pickle.UnpicklingError) as err:
            raise TerraInputError(f"{path} cannot be read as a torch checkpoint ({type(err).__name__}); "
                                  "pass LlamaGen's vq_ds16_*.pt file") from None
        key = next((k for k in ("ema", "model", "state_dict") if isinstance(checkpoint, dict) and k in checkpoint),
                   None)
        state_dict = checkpoint[key] if key else checkpoint
        if not isinstance(state_dict, dict) or not all(torch.is_tensor(v) for v in state_dict.values()):
            raise TerraInputError(f"{path} holds no state dict under ema, model or state_dict; "
                                  "pass LlamaGen's original checkpoint")
        model = cls(config)
        model.load_weights(state_dict, source=str(path))
        return model.eval()

def _entropy_loss(affinity: torch.Tensor, temperature: float = 0.01) -> torch.Tensor:
    """LlamaGen's codebook entropy loss: per-sample entropy minus entropy of the average assignment."""
    probs = F.softmax(affinity / temperature, dim=-1)
    log_probs = F.log_softmax(affinity / temperature, dim=-1)
    avg = probs.mean(0)
    return -(probs * log_probs).sum(-1).mean() + (avg * (avg + 1e-5).log()).sum()
