"""``terra-alpasim`` settings, checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from omegaconf import DictConfig

from terra.config.checks import MAX_FRAMES, Range, known_settings, select, shown
from terra.config.schema import block_settings, check_schema, setting
from terra.config.spec import RunConfig, RunSpec, run_spec
from terra.core.errors import TerraInputError
from terra.config.network import HOST_NAME, check_token, is_loopback

IMAGE_FORMATS = ("jpeg", "png")
MAX_MESSAGE_BYTES = 64 * 1024 * 1024  # AlpaSim's runtime sets its channel's limit to this, both ways
MAX_SESSIONS = 1024  # a thread and a rollout each: more would only queue on one engine
MAX_PIXELS = 8192 * 8192  # the tokenizer's bound on any frame
MAX_IDLE_S = 7 * 24 * 3600.0  # a week


@dataclass
class AlpasimBlock:
    host: str = setting("127.0.0.1", "0.0.0.0 to serve AlpaSim's containers: any address beyond loopback needs a "
                                     "token")
    port: int = setting(50051, "", Range(0, 65535, 50051, whole=True))
    # Any: a token of digits stays a number here, and its check says so
    token: Any = setting("${oc.env:TERRA_ALPASIM_TOKEN,null}", "clients send gRPC metadata authorization: Bearer "
                                                               "<token>")
    max_sessions: int = setting(64, "AlpaSim rollouts at once; more are refused with RESOURCE_EXHAUSTED; the engine "
                                    "makes room for them (KV memory: docs/alpasim.md, \"Sessions and memory\")",
                                Range(1, MAX_SESSIONS, 64, whole=True))
    max_frames: int = setting(3000, "frames one session may render (5 min at 10 fps)",
                              Range(1, MAX_FRAMES, 3000, whole=True))
    max_image_pixels: int = setting(3840 * 2160, "an initial frame's pixels (3840x2160), read from its header before "
                                                 "it is decoded", Range(64 * 64, MAX_PIXELS, 3840 * 2160, whole=True))
    idle_timeout_s: float = setting(600.0, "a session with no request for this long is closed (a runtime that "
                                           "died)", Range(0, MAX_IDLE_S, 600, low_open=True))
    image_format: str = setting("jpeg", "the frames sent", choices=IMAGE_FORMATS)
    jpeg_quality: int = setting(90, "", Range(1, 100, 90, whole=True))


@dataclass
class AlpasimConfig(RunConfig):
    """terra-alpasim's settings."""

    num_context: int = setting(1, "AlpaSim sends one initial frame per camera: a session starts from that one frame")
    alpasim: AlpasimBlock = setting(AlpasimBlock(), "")


@dataclass
class AlpasimSettings(AlpasimBlock):
    """Where the server listens, the limits that keep one rollout from hurting the others, and the frames' format."""

    token: Any = None  # a program gives its own; the config reads TERRA_ALPASIM_TOKEN

    def __post_init__(self) -> None:
        for name, item in block_settings(AlpasimBlock, "alpasim").items():
            item.check(getattr(self, name))
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
    check_schema(cfg, AlpasimConfig)
    settings = AlpasimSettings.from_mapping(select(cfg, "alpasim"))
    spec = run_spec(cfg)
    if spec.num_context != 1:
        raise TerraInputError(f"num_context={spec.num_context}: AlpaSim sends one initial frame per camera, so a "
                              "session starts from one context frame; leave num_context=1")
    return spec, settings
