"""``terra-serve`` settings, checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional
from urllib.parse import urlsplit

from terra.config.checks import MAX_FRAMES, Range, known_settings, shown
from terra.config.network import HOST_NAME, check_token, is_loopback
from terra.config.schema import block_settings, flag, setting
from terra.config.spec import RunConfig
from terra.core.errors import TerraInputError

IMAGE_FORMATS = ("jpeg", "png")
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
MAX_WAIT_S = 7 * 24 * 3600.0  # a week: the longest idle or send timeout


def split_host(value: str) -> tuple[str, int | None] | None:
    """``name[:port]`` or ``[v6]:port`` → (lower-case name, v6 in brackets; port or None); None when malformed."""
    try:
        parts = urlsplit(f"//{value}")
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or not HOST_NAME.fullmatch(name) or parts.path or parts.query or parts.fragment \
            or parts.username is not None:
        return None
    return (f"[{name}]" if ":" in name else name), port


def web_origin(value: str) -> str | None:
    """``scheme://host[:port]`` as browsers send it in ``Origin`` (lower case, no default port); None if not one."""
    try:
        parts = urlsplit(value.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") or parts.query \
            or parts.fragment or parts.username is not None:
        return None
    name = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    default = {"http": 80, "https": 443}[parts.scheme]
    return f"{parts.scheme}://{name}" + (f":{port}" if port not in (None, default) else "")


def _seconds(name: str) -> Callable[[Any], float]:
    """The check of a finite wait: a session or a send that never times out holds its slot for good."""
    def check(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_WAIT_S:
            raise TerraInputError(f"serve.{name} must be a positive number of seconds, at most {MAX_WAIT_S:g} "
                                  f"(got {shown(value)})")
        return float(value)
    return check


def _one_of(name: str, choices: tuple[str, ...]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in choices:
            raise TerraInputError(f"serve.{name} must be one of {', '.join(choices)} (got {shown(value)})")
        return value
    return check


def _entries(name: str, example: str) -> Callable[[Any], tuple[str, ...]]:
    """The check of a setting that lists strings (one string is a list of one)."""
    def check(value: Any) -> tuple[str, ...]:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) and v for v in values):
            raise TerraInputError(f"serve.{name} must be a list of strings (got {shown(value)}); e.g. "
                                  f"serve.{name}=[{example}]")
        return tuple(values)
    return check


@dataclass
class ServeBlock:
    host: str = setting("127.0.0.1", "any address beyond loopback needs a token")
    port: int = setting(8000, "", Range(0, 65535, 8000, whole=True))
    # Any: a token of digits stays a number here, and its check says so
    token: Any = setting("${oc.env:TERRA_SERVE_TOKEN,null}", "bearer token; required when host is not a loopback "
                                                            "address")
    max_sessions: int = setting(16, "open sessions at once; more are refused with HTTP 429",
                                Range(1, 1024, 16, whole=True))
    idle_timeout_s: float = setting(300.0, "a session with no step for this long is closed (its sockets get a close "
                                           f"frame); above 0 .. {MAX_WAIT_S:g}", check=_seconds("idle_timeout_s"))
    max_frames: int = setting(600, "frames one session may generate (60 s at 10 Hz); then reset it or open another",
                              Range(1, MAX_FRAMES, 600, whole=True))
    max_request_bytes: int = setting(16_000_000, "HTTP request bodies (uploaded context frames are base64 in JSON)",
                                     Range(1024, 1 << 30, 16_000_000, whole=True))
    max_message_bytes: int = setting(65536, "WebSocket messages from a client", Range(256, 1 << 24, 65536, whole=True))
    max_queued_steps: int = setting(8, "steps one socket may queue before it gets an error frame",
                                    Range(1, 1024, 8, whole=True))
    drive_window: int = setting(3, "frames the server sends ahead of a driving client's acknowledgements",
                                Range(1, 64, 3, whole=True))
    send_timeout_s: float = setting(20.0, f"a socket that takes longer to accept a frame is closed; above 0 .. "
                                          f"{MAX_WAIT_S:g}", check=_seconds("send_timeout_s"))
    image_format: str = setting("jpeg", "frames sent to clients; jpeg | png",
                                check=_one_of("image_format", IMAGE_FORMATS))
    jpeg_quality: int = setting(90, "", Range(1, 100, 90, whole=True))
    log_level: str = setting("info", "uvicorn's: critical | error | warning | info | debug",
                             check=_one_of("log_level", LOG_LEVELS))
    roads: Optional[str] = setting(None, "a folder of road files (.json, .csv, a clipgt .zip) a session names by file "
                                         "stem in its \"road\" (each read and checked before the model loads); null: "
                                         "sessions give a road's content only")
    allowed_hosts: Any = setting([], "names it is served under, e.g. [terra.example.org] (any port) or "
                                     "[terra.example.org:443]; requests must name this server in Host",
                                 check=_entries("allowed_hosts", "terra.example.org"))
    allowed_origins: Any = setting([], "other pages that may drive it, e.g. [http://localhost:3000]; a WebSocket or "
                                       "a POST/DELETE sent by a browser page must come from the server's own origin "
                                       "or one of these", check=_entries("allowed_origins", "https://terra.example.org"))
    cors: Any = flag(False, "true: CORS headers for allowed_origins, so those pages can read the answers")


@dataclass
class ServeConfig(RunConfig):
    """terra-serve's settings."""

    num_context: int = setting(3, "context frames a session starts from (built-in or the last uploaded ones)")
    serve: ServeBlock = setting(ServeBlock(), "")


@dataclass
class ServeSettings(ServeBlock):
    """Where the server listens and the limits that keep one client from hurting the others."""

    token: Any = None  # a program gives its own; the config reads TERRA_SERVE_TOKEN

    def __post_init__(self) -> None:
        for name, item in block_settings(ServeBlock, "serve").items():
            setattr(self, name, item.check(getattr(self, name)))
        if not isinstance(self.host, str) or not self.host:
            raise TerraInputError(f"serve.host must be an address or host name (got {self.host!r})")
        check_token(self.token, "serve.token", "TERRA_SERVE_TOKEN")
        if self.token is None and not is_loopback(self.host):
            raise TerraInputError(f"serve.host={self.host} is reachable beyond this machine, so a token is "
                                  "required: set serve.token=... or TERRA_SERVE_TOKEN, or bind serve.host=127.0.0.1")
        for entry in self.allowed_hosts:
            if split_host(entry) is None:
                raise TerraInputError(f"serve.allowed_hosts: {entry!r} is not a host name, with or without a port; "
                                      "e.g. terra.example.org or terra.example.org:8000")
        origins = tuple(web_origin(entry) for entry in self.allowed_origins)
        for entry, origin in zip(self.allowed_origins, origins):
            if origin is None:
                raise TerraInputError(f"serve.allowed_origins: {entry!r} is not a web origin; give scheme://host"
                                      "[:port] without a path, e.g. http://localhost:3000")
        if self.cors and not origins:
            raise TerraInputError("serve.cors=true sends CORS headers to serve.allowed_origins, which is empty; "
                                  "list the pages' origins, e.g. serve.allowed_origins=[http://localhost:3000]")
        if self.roads is not None and not (isinstance(self.roads, str) and Path(self.roads).expanduser().is_dir()):
            raise TerraInputError(f"serve.roads={shown(self.roads, 200)} is not a folder; give a folder of road files "
                                  "(.json, .csv, a clipgt .zip) that sessions name, or leave it null")
        self.allowed_origins = origins

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ServeSettings":
        """Settings from a plain mapping (the ``serve`` config block); unknown keys fail with one line."""
        return cls(**known_settings(values, cls, "serve"))
