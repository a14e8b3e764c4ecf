"""The interface of every image tokenizer, and saving/loading in the ``config.json`` + safetensors format."""

from __future__ import annotations

import functools
import json
import os
from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from terra.core.atomic import atomic_path, json_text, write_text
from terra.core.errors import TerraInputError, error_reason
from terra.tokenizer.tensors import check_like


CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TORCH_WEIGHTS_NAME = "pytorch_model.bin"  # older checkpoints (read only)

_REGISTRY: dict[str, type["ImageTokenizer"]] = {}


@dataclass
class TrainOutput:
    """What a training forward pass returns: reconstruction, codes, weighted quantiser loss, statistics."""

    reconstruction: torch.Tensor  # [B, 3, H, W]
    codes: torch.Tensor  # [B, h, w] int64
    quantizer_loss: torch.Tensor  # scalar, already weighted
    stats: dict[str, torch.Tensor]  # unweighted parts, for logging


class ImageTokenizer(nn.Module, metaclass=ABCMeta):
    """Base class: conv encoder → quantiser → codes; codes → embedding → conv decoder."""

    model_type: ClassVar[str] = ""
    image_size: tuple[int, int]  # (H, W) the tokenizer works at
    downsample_factor: int  # pixels per code along each axis
    codebook_size: int  # codes are integers in [0, codebook_size)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.model_type:
            _REGISTRY[cls.model_type] = cls

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__()
        self.config = json.loads(json.dumps(dict(config)))  # a plain, JSON-safe copy
        self.config["model_type"] = self.model_type

    # ------------------------------------------------------------------------------------------ sizes
    @property
    def grid_shape(self) -> tuple[int, int]:
        """``(h, w)`` codes per image at :attr:`image_size`."""
        height, width = self.image_size
        return height // self.downsample_factor, width // self.downsample_factor

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _check_image_size(self) -> None:
        height, width = self.image_size
        if height % self.downsample_factor or width % self.downsample_factor:
            raise TerraInputError(f"tokenizer image_size {height}x{width} is not a multiple of its downsampling factor "
                                  f"{self.downsample_factor}; set image_size in config.json to multiples of it")

    # --------------------------------------------------------------------------------- quantisation
    @abstractmethod
    def latent_to_codes(self, latent: torch.Tensor) -> torch.Tensor:
        """Encoder output ``[B, C, h, w]`` → codes ``[B, h, w]`` (int64)."""

    @abstractmethod
    def codes_to_latent(self, codes: torch.Tensor) -> torch.Tensor:
        """Codes ``[B, h, w]`` → decoder input ``[B, C, h, w]`` in the model's dtype."""

    def encode_latent(self, images: torch.Tensor) -> torch.Tensor:
        """Images → continuous latent before quantisation (``[B, C, h, w]``)."""
        return self.encoder(images)

    def decode_latent(self, latent: torch.Tensor) -> torch.Tensor:
        """Quantised latent → images (no clamping)."""
        return self.decoder(latent)

    # ------------------------------------------------------------------------------ public encode/decode
    @torch.no_grad()
    def encode(self, images: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """Images ``[B, 3, H, W]`` in [-1, 1] → codes ``[B, h, w]`` (int64, on the model's device)."""
        if not torch.is_tensor(images) or images.ndim != 4 or images.shape[1] != 3:
            shape = list(images.shape) if torch.is_tensor(images) else type(images).__name__
            raise TerraInputError(f"images must be a tensor [B, 3, H, W] in [-1, 1], got {shape}; "
                                  "load files with terra.tokenizer.images.load_images")
        factor = self.downsample_factor
        if images.shape[2] % factor or images.shape[3] % factor:
            raise TerraInputError(f"image size {images.shape[2]}x{images.shape[3]} is not a multiple of {factor}; "
                                  f"resize to {self.image_size[0]}x{self.image_size[1]} (load_images does it)")
        out = [self.latent_to_codes(self.encode_latent(chunk.to(device=self.device, dtype=self.dtype)))
               for chunk in images.split(batch_size or len(images) or 1)]
        return torch.cat(out) if out else torch.empty(0, *self.grid_shape, dtype=torch.long, device=self.device)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor, batch_size: int | None = None) -> torch.Tensor:
        """Codes ``[B, h, w]`` (or ``[B, h * w]`` at :attr:`grid_shape`) → images ``[B, 3, H, W]`` in [-1, 1]."""
        codes = self.check_codes(codes)
        out = [self.decode_latent(self.codes_to_latent(chunk.to(self.device))).clamp(-1, 1)
               for chunk in codes.split(batch_size or len(codes) or 1)]
        return torch.cat(out) if out else torch.empty(0, 3, *self.image_size, dtype=self.dtype, device=self.device)

    def check_codes(self, codes: Any) -> torch.Tensor:
        """Validate codes and return them as int64 ``[B, h, w]``; bad codes raise :class:`TerraInputError`."""
        codes = torch.as_tensor(codes)
        if codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
            raise TerraInputError(f"codes must be integers, got dtype {codes.dtype}; pass the tokenizer's codes")
        if codes.ndim == 2 and codes.shape[1] == self.grid_shape[0] * self.grid_shape[1]:
            codes = codes.reshape(len(codes), *self.grid_shape)
        if codes.ndim != 3:
            raise TerraInputError(f"codes must have shape [B, h, w] (grid {self.grid_shape[0]}x{self.grid_shape[1]}), "
                                  f"got {list(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise TerraInputError(f"codes hold values in [{int(codes.min())}, {int(codes.max())}] outside the codebook "
                                  f"[0, {self.codebook_size}); decode only image codes of this tokenizer")
        return codes.long()

    # ------------------------------------------------------------------------------------ save / load
    def save_pretrained(self, directory: str | os.PathLike) -> Path:
        """Write ``config.json`` and ``model.safetensors`` (the current dtype) into ``directory``, atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        with atomic_path(directory / WEIGHTS_NAME) as tmp:
            save_file(tensors, tmp, metadata={"format": "pt", "model_type": self.model_type})
        write_text(directory / CONFIG_NAME, json_text(self.config, indent=2) + "\n")
        return directory

    @classmethod
    def from_config(cls, config: Mapping[str, Any], source: str, fix: str) -> "ImageTokenizer":
        """A new tokenizer of this class (random weights) from ``config``; a bad config is one line."""
        try:
            return cls(config)
        except TerraInputError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as err:  # a config the modules cannot be built from
            raise TerraInputError(f"{source} describes a tokenizer that cannot be built ({type(err).__name__}: "
                                  f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}); {fix}") from None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, device: str | torch.device | None = None,
                        dtype: torch.dtype | None = None) -> "ImageTokenizer":
        """Load a saved tokenizer folder (or Hub id); calling it on the base class picks the class from config."""
        folder = _resolve_folder(str(path))
        config = _read_config(folder / CONFIG_NAME)
        klass = _REGISTRY.get(config.get("model_type"))
        if klass is None:
            raise TerraInputError(f"{folder / CONFIG_NAME}: model_type {config.get('model_type')!r} is not a known "
                                  f"tokenizer; use one of {sorted(_REGISTRY)}")
        if cls is not ImageTokenizer and not issubclass(klass, cls):
            raise TerraInputError(f"{folder / CONFIG_NAME} describes a {config['model_type']} but {cls.__name__} was "
                                  "asked for; use load_tokenizer to open any tokenizer")
        model = klass.from_config(config, str(folder / CONFIG_NAME), "fix or re-save config.json")
        model.load_weights(_read_weights(folder), source=str(folder))
        return model.to(device=device, dtype=dtype).eval()

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], source: str = "checkpoint") -> None:
        """Load weights strictly; mismatched, integer or non-finite weights raise one line."""
        converted = clean(state_dict)
        expected = self.state_dict()
        missing = sorted(set(expected) - set(converted))
        unexpected = sorted(set(converted) - set(expected))
        if missing or unexpected:
            raise TerraInputError(f"{source}: weights do not match the config ({len(missing)} missing, e.g. "
                                  f"{missing[:3]}; {len(unexpected)} unexpected, e.g. {unexpected[:3]}); check that "
                                  "config.json describes these weights (or map other key names in tokenizer/base.py)")
        bad = [k for k in expected if tuple(expected[k].shape) != tuple(converted[k].shape)]
        if bad:
            k = bad[0]
            raise TerraInputError(f"{source}: {len(bad)} weights have the wrong shape (e.g. {k}: "
                                  f"{list(converted[k].shape)} vs {list(expected[k].shape)} from config.json); the "
                                  "config does not describe these weights")
        for key, value in expected.items():  # the values: floating point where the model's are, and finite
            check_like(converted[key], value, f"{source}: tensor {key}",
                       "the tokenizer's weights are damaged: download or copy them again")
        self.load_state_dict(converted, strict=True)


def load_tokenizer(path: str | os.PathLike, device: str | torch.device | None = None,
                   dtype: torch.dtype | None = None) -> ImageTokenizer:
    """Open any saved tokenizer: a folder, a Hub id, or LlamaGen's original VQ-16 ``.pt`` file."""
    path_str = str(path)
    if Path(path_str).is_file() and Path(path_str).suffix in (".pt", ".pth", ".ckpt"):
        from terra.tokenizer.vq import VQTokenizer

        return VQTokenizer.from_llamagen(path_str).to(device=device, dtype=dtype)
    return ImageTokenizer.from_pretrained(path_str, device=device, dtype=dtype)


def _resolve_folder(path: str) -> Path:
    """A local folder holding config.json, downloading a Hub id first when the path is no local folder."""
    local = Path(path).expanduser()
    if local.is_dir():
        if not (local / CONFIG_NAME).is_file():
            raise TerraInputError(f"tokenizer folder {local} has no {CONFIG_NAME}; pass a folder written by "
                                  "save_pretrained")
        return local
    if local.exists():
        raise TerraInputError(f"tokenizer path {local} is a file; pass the folder holding {CONFIG_NAME} and "
                              f"{WEIGHTS_NAME}")
    parts = path.strip("/").split("/")
    if len(parts) < 2 or path.startswith((".", "/", "~")):
        raise TerraInputError(f"tokenizer folder {path} does not exist; check the path")
    repo_id, subfolder = "/".join(parts[:2]), "/".join(parts[2:]) or None
    try:
        from huggingface_hub import snapshot_download

        root = Path(snapshot_download(repo_id, allow_patterns=[f"{subfolder}/*" if subfolder else "*"]))
    except Exception as err:  # any Hub failure (no network, unknown repo) is the user's input to fix
        raise TerraInputError(f"tokenizer {path} is not a local folder and the Hub download failed "
                              f"({type(err).__name__}); pass a local folder with config.json and "
                              "model.safetensors") from None
    folder = root / subfolder if subfolder else root
    if not (folder / CONFIG_NAME).is_file():
        raise TerraInputError(f"Hub tokenizer {path} has no {CONFIG_NAME}; check the repository and subfolder")
    return folder


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TerraInputError(f"{path} cannot be read as JSON ({err}); fix or re-save the tokenizer") from None
    if not isinstance(config, dict):
        raise TerraInputError(f"{path} must hold a JSON object; re-save the tokenizer")
    return config


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    file = next((folder / n for n in (WEIGHTS_NAME, TORCH_WEIGHTS_NAME) if (folder / n).is_file()), None)
    if file is None:
        raise TerraInputError(f"tokenizer folder {folder} has no {WEIGHTS_NAME}; pass a folder written by "
                              "save_pretrained")
    try:
        return load_file(file) if file.name == WEIGHTS_NAME else torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # safetensors / pickle raise their own types for truncated or foreign files
        raise TerraInputError(f"tokenizer weights {file} cannot be read ({error_reason(err)}); the file is truncated "
                              "or corrupt: download or copy it again") from None


WRAPPER_PREFIXES = ("module.", "_orig_mod.")  # DistributedDataParallel's and torch.compile's
IGNORED_KEYS = {"quantize.codebook_used"}  # LlamaGen's codebook-usage ring buffer: a statistic, not a weight


def clean(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Strip wrapper prefixes and drop training statistics."""
    unwrapped = {functools.reduce(str.removeprefix, WRAPPER_PREFIXES, key): value for key, value in state_dict.items()}
    return {key: value for key, value in unwrapped.items() if key not in IGNORED_KEYS}
