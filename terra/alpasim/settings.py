"""``terra-alpasim`` settings (the ``alpasim`` block of conf/alpasim.yaml and the shared run settings), checked
before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf

from terra.config.checks import MAX_FRAMES, check_choice, check_whole_number, known_settings
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError

IMAGE_FORMATS = ("jpeg", "png")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # AlpaSim's runtime sets its channel's limit to this, both ways


@dataclass(frozen=True)
class AlpasimSettings:
    """Where the server listens, the limits that keep one rollout from hurting the others, and the frames' format."""

    host: str = "127.0.0.1"
    port: int = 50051
    max_sessions: int = 16
    max_frames: int = 3000
    idle_timeout_s: float = 600.0
    image_format: str = "jpeg"
    jpeg_quality: int = 90

    def __post_init__(self) -> None:
        for name, minimum, maximum in (("port", 0, 65535), ("max_sessions", 1, None), ("max_frames", 1, MAX_FRAMES),
                                       ("jpeg_quality", 1, 100)):
            check_whole_number(getattr(self, name), f"alpasim.{name}", minimum,
                               f"alpasim.{name}={getattr(AlpasimSettings, name)}", maximum)
        value = self.idle_timeout_s
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise TerraInputError(f"alpasim.idle_timeout_s must be a positive number of seconds (got {value!r})")
        check_choice(self.image_format, "alpasim.image_format", IMAGE_FORMATS)
        if not isinstance(self.host, str) or not self.host:
            raise TerraInputError(f"alpasim.host must be an address or host name (got {self.host!r}); e.g. "
                                  "alpasim.host=0.0.0.0 for AlpaSim's containers")

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
    """The run's shared settings and the server's own, from conf/alpasim.yaml and the command line."""
    settings = AlpasimSettings.from_mapping(OmegaConf.to_container(cfg.alpasim, resolve=True))
    spec = run_spec(cfg)
    if spec.num_context != 1:
        raise TerraInputError(f"num_context={spec.num_context}: AlpaSim sends one initial frame per camera, so a "
                              "session starts from one context frame; leave num_context=1")
    return spec, settings
