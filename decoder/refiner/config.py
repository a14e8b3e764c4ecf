"""The video refiner's settings: network sizes and the published sampling recipe (:class:`RefinerConfig`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from terra.core.errors import TerraInputError

GUIDANCE_MODES = ("published", "zero_frames")
ARITHMETIC_MODES = ("published", "float32")
DECODER_MID_RES_BLOCKS = 2  # the temporal decoder's mid block, whatever vae_layers_per_block is
# Every UNet res block's GroupNorm: Terra's ``GroupNorm32`` has torch's default epsilon; diffusers would build 1e-6.
UNET_RES_BLOCK_EPS = 1e-5


@dataclass(frozen=True)
class RefinerConfig:
    """Network sizes (they must match the weights) and sampling settings (free to change)."""

    # networks
    unet_channels: tuple[int, ...] = (320, 640, 1280, 1280)
    unet_attention: tuple[bool, ...] = (True, True, True, False)  # a transformer after each res block of a level
    head_dim: int = 64
    layers_per_block: int = 2
    context_dim: int = 1024  # width of the (all-zero) cross-attention context
    vector_dim: int = 256  # each of cond_aug, fps_id, motion_bucket_id → one sinusoidal embedding of this width
    vae_channels: tuple[int, ...] = (128, 256, 512, 512)
    vae_layers_per_block: int = 2
    latent_channels: int = 4
    scale_factor: float = 0.18215  # diffusion latents = temporal-autoencoder latents * scale_factor
    # video
    height: int = 384
    width: int = 640
    num_frames: int = 25  # frames per refinement pass
    min_overlap: int = 3  # frames shared by consecutive passes (at least); the later copies are dropped
    # sampling
    num_steps: int = 15
    sigma_min: float = 0.002
    sigma_max: float = 700.0
    rho: float = 7.0
    min_guidance: float = 1.5  # guidance scale of the first frame of a pass ...
    max_guidance: float = 3.0  # ... and of the last; linear in between
    guidance: str = "published"  # published | zero_frames
    arithmetic: str = "published"  # published (Terra's dtypes) | float32
    fps_id: int = 9
    motion_bucket_id: int = 127
    cond_aug: float = 0.0
    # temporal decoder: frames per decoder call and overlap, as DiffusionEngine.decode_first_stage
    decode_frames: int = 1  # published en_and_decode_n_samples_a_time: each frame decoded on its own
    decode_overlap: int = 3
    decode_batch: int = 8  # independent decoder calls (frames when decode_frames=1) run together
    # speed options (results agree up to rounding)
    channels_last: bool = False
    compile: bool = False

    @property
    def latent_size(self) -> tuple[int, int]:
        """``(h, w)`` of the latents: the video size over the autoencoder's downsampling."""
        factor = 2 ** (len(self.vae_channels) - 1)
        return self.height // factor, self.width // factor

    def replace(self, **changes: Any) -> "RefinerConfig":
        """A copy with ``changes`` applied and checked (unknown names raise :class:`TerraInputError`)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise TerraInputError(f"unknown refiner settings {unknown}; known: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        """Raise :class:`TerraInputError` (one line) on settings the refiner cannot run with."""
        factor = 2 ** (len(self.vae_channels) - 1) * 2 ** (len(self.unet_channels) - 1)
        if self.height % factor or self.width % factor:
            raise TerraInputError(f"refiner size {self.height}x{self.width} must be a multiple of {factor} "
                                  f"(autoencoder and UNet downsampling); e.g. 384x640")
        for name in ("num_frames", "num_steps", "decode_frames", "decode_batch"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise TerraInputError(f"refiner.{name} must be a whole number of at least 1 (got "
                                      f"{getattr(self, name)!r})")
        if not 0 <= self.min_overlap < self.num_frames:
            raise TerraInputError(f"refiner.min_overlap={self.min_overlap} must be at least 0 and below the "
                                  f"{self.num_frames} frames of a pass; Terra uses 3")
        for name, modes in (("guidance", GUIDANCE_MODES), ("arithmetic", ARITHMETIC_MODES)):
            if getattr(self, name) not in modes:
                raise TerraInputError(f"refiner.{name} {getattr(self, name)!r} is unknown; choose one of {list(modes)}")
        if not 0 < self.sigma_min < self.sigma_max:
            raise TerraInputError(f"refiner sigmas need 0 < sigma_min < sigma_max (got {self.sigma_min}, "
                                  f"{self.sigma_max})")

    def unet_kwargs(self) -> dict[str, Any]:
        """Arguments of ``diffusers.UNetSpatioTemporalConditionModel`` for these sizes."""
        down = ["CrossAttnDownBlockSpatioTemporal" if a else "DownBlockSpatioTemporal" for a in self.unet_attention]
        up = ["CrossAttnUpBlockSpatioTemporal" if a else "UpBlockSpatioTemporal" for a in reversed(self.unet_attention)]
        return {"in_channels": 2 * self.latent_channels, "out_channels": self.latent_channels,
                "down_block_types": tuple(down), "up_block_types": tuple(up), "block_out_channels": self.unet_channels,
                "addition_time_embed_dim": self.vector_dim,
                "projection_class_embeddings_input_dim": 3 * self.vector_dim, "layers_per_block": self.layers_per_block,
                "cross_attention_dim": self.context_dim, "transformer_layers_per_block": 1,
                "num_attention_heads": tuple(c // self.head_dim for c in self.unet_channels),
                "num_frames": self.num_frames}

    def encoder_kwargs(self) -> dict[str, Any]:
        """Arguments of ``diffusers.AutoencoderKL``: the conditioning encoder (SD's autoencoder)."""
        n = len(self.vae_channels)
        return {"in_channels": 3, "out_channels": 3, "down_block_types": ("DownEncoderBlock2D",) * n,
                "up_block_types": ("UpDecoderBlock2D",) * n, "block_out_channels": self.vae_channels,
                "layers_per_block": self.vae_layers_per_block, "latent_channels": self.latent_channels}

    def temporal_vae_kwargs(self) -> dict[str, Any]:
        """Arguments of ``diffusers.AutoencoderKLTemporalDecoder``: the first-stage (temporal) autoencoder."""
        kwargs = {k: v for k, v in self.encoder_kwargs().items() if k != "up_block_types"}  # its decoder is temporal
        return {**kwargs, "scaling_factor": self.scale_factor}


TERRA = RefinerConfig()  # the published refiner (1.53 B UNet parameters)

# The same architecture at toy size for tests and CPU demos: random weights, 32x48 videos, 5 frames per pass.
TINY = RefinerConfig(unet_channels=(32, 64), unet_attention=(True, False), head_dim=16, layers_per_block=1,
                     context_dim=32, vector_dim=16, vae_channels=(32, 32), vae_layers_per_block=1,
                     height=32, width=48, num_frames=5, min_overlap=2, num_steps=4, decode_batch=4)

PRESETS = {"terra": TERRA, "tiny": TINY}


def preset(name: str) -> RefinerConfig:
    """The named preset (``terra`` | ``tiny``); an unknown name raises :class:`TerraInputError`."""
    if name not in PRESETS:
        raise TerraInputError(f"unknown refiner preset {name!r}; choose one of {sorted(PRESETS)}")
    return PRESETS[name]
