"""``terra-alpasim`` settings, checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from omegaconf import DictConfig

from terra.config.checks import (MAX_FRAMES, check_choice, check_number, check_whole_number, known_settings, select,
                                 shown)
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError
from terra.config.network import HOST_NAME, check_token, is_loopback

IMAGE_FORMATS = ("jpeg", "png")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # AlpaSim's runtime sets its channel's limit to this, both ways
MAX_SESSIONS = 1024  # a thread and a rollout each: more would only queue on one engine
MAX_PIXELS = 8192 * 8192  # the tokenizer's bound on any frame
MAX_IDLE_S = 7 * 24 * 3600.0  # a week


@dataclass(frozen=True)
class AlpasimSettings:
    """Where the server listens, the limits that keep one rollout from hurting the others, and the frames' format."""

    host: str = "127.0.0.1"
    port: int = 50051
    token: str | None = None
    max_sessions: int = 64  # the AlpaSim docs, "Sessions and memory"
    max_frames: int = 3000
    max_image_pixels: int = 3840 * 2160
    idle_timeout_s: float = 600.0
    image_format: str = "jpeg"
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        for name, minimum, maximum in (("port", 0, 65535), ("max_sessions", 1, MAX_SESSIONS),
                                       ("max_frames", 1, MAX_FRAMES), ("max_image_pixels", 64 * 64, MAX_PIXELS),
                                       ("jpeg_quality", 1, 100)):
            check_whole_number(getattr(self, name), f"alpasim.{name}", minimum,
                               f"alpasim.{name}={getattr(AlpasimSettings, name)}", maximum)
        check_number(self.idle_timeout_s, "alpasim.idle_timeout_s", 0.0, MAX_IDLE_S, "alpasim.idle_timeout_s=600",
                     low_open=True)
        check_choice(self.image_format, "alpasim.image_format", IMAGE_FORMATS)
        if not isinstance(self.host, str) or not HOST_NAME.fullmatch(self.host.strip("[]").lower()):
            raise TerraInputError(f"alpasim.host must be an address or host name (got {shown(self.host)}); e.g. "
                                  "alpasim.host=0.0.0.0 for AlpaSim's containers (with alpasim.token)")
        check_token(self.token, "alpasim.token", "TERRA_ALPASIM_TOKEN")
        if self.token is None and not is_loopback(self.host.strip("[]").lower()):
            raise TerraInputError(f"alpasim.host={self.host} is reachable beyond this machine, so a token is "
                                  "required: set alpasim.token=... or TERRA_ALPASIM_TOKEN (clients send the gRPC "
                                  "metadata authorization: Bearer <token>), or bind alpasim.host=127.0.0.1")

    @property
    def address(self) -> str:
        """``host:port`` as gRPC binds it (an IPv6 address in brackets)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "AlpasimSettings":
        """Settings from a plain mapping (the ``alpasim`` config block); unknown keys fail with one line."""
        return cls(**known_settings(values, cls, "alpasim"))


def alpasim_spec(cfg: DictConfig) -> tuple[RunSpec, AlpasimSettings]:
    """The run's shared settings and the server's own, from `alpasim` and the command line."""
    settings = AlpasimSettings.from_mapping(select(cfg, "alpasim"))
    spec = run_spec(cfg)
    if spec.num_context != 1:
        raise TerraInputError(f"num_context={spec.num_context}: AlpaSim sends one initial frame per camera, so a "
                              "session starts from one context frame; leave num_context=1")
    return spec, settings
