"""``terra-serve`` settings, checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from terra.config.checks import MAX_FRAMES, check_whole_number, known_settings, shown
from terra.config.network import HOST_NAME, check_token, is_loopback
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


def _entries(value: Any, name: str, example: str) -> tuple[str, ...]:
    """A setting that lists strings (one string is a list of one)."""
    values = [value] if isinstance(value, str) else value
    if not isinstance(values, (list, tuple)) or not all(isinstance(v, str) and v for v in values):
        raise TerraInputError(f"serve.{name} must be a list of strings (got {value!r}); e.g. serve.{name}=[{example}]")
    return tuple(values)


@dataclass(frozen=True)
class ServeSettings:
    """Where the server listens and the limits that keep one client from hurting the others."""

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = None
    max_sessions: int = 16
    idle_timeout_s: float = 300.0
    max_frames: int = 600
    max_request_bytes: int = 16_000_000
    max_message_bytes: int = 65536
    max_queued_steps: int = 8
    drive_window: int = 3
    send_timeout_s: float = 20.0
    image_format: str = "jpeg"
    jpeg_quality: int = 90
    log_level: str = "info"
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    cors: bool = False
    roads: str | None = None  # a folder of road files (.json, .csv, a clipgt .zip) a session may name

    def __post_init__(self) -> None:
        for name, minimum, maximum in (("port", 0, 65535), ("max_sessions", 1, 1024), ("max_frames", 1, MAX_FRAMES),
                                       ("max_request_bytes", 1024, 1 << 30), ("max_message_bytes", 256, 1 << 24),
                                       ("max_queued_steps", 1, 1024), ("drive_window", 1, 64),
                                       ("jpeg_quality", 1, 100)):
            check_whole_number(getattr(self, name), f"serve.{name}", minimum,
                               f"serve.{name}={getattr(ServeSettings, name)}", maximum)
        for name in ("idle_timeout_s", "send_timeout_s"):  # finite: a session or a send that never times out
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_WAIT_S:
                raise TerraInputError(f"serve.{name} must be a positive number of seconds, at most {MAX_WAIT_S:g} "
                                      f"(got {shown(value)})")
        if self.image_format not in IMAGE_FORMATS:
            raise TerraInputError(f"serve.image_format must be one of {', '.join(IMAGE_FORMATS)} "
                                  f"(got {self.image_format!r})")
        if self.log_level not in LOG_LEVELS:
            raise TerraInputError(f"serve.log_level must be one of {', '.join(LOG_LEVELS)} (got {self.log_level!r})")
        if not isinstance(self.host, str) or not self.host:
            raise TerraInputError(f"serve.host must be an address or host name (got {self.host!r})")
        check_token(self.token, "serve.token", "TERRA_SERVE_TOKEN")
        if self.token is None and not is_loopback(self.host):
            raise TerraInputError(f"serve.host={self.host} is reachable beyond this machine, so a token is "
                                  "required: set serve.token=... or TERRA_SERVE_TOKEN, or bind serve.host=127.0.0.1")
        hosts = _entries(self.allowed_hosts, "allowed_hosts", "terra.example.org")
        for entry in hosts:
            if split_host(entry) is None:
                raise TerraInputError(f"serve.allowed_hosts: {entry!r} is not a host name, with or without a port; "
                                      "e.g. terra.example.org or terra.example.org:8000")
        origins = _entries(self.allowed_origins, "allowed_origins", "https://terra.example.org")
        normalised = tuple(web_origin(entry) for entry in origins)
        for entry, origin in zip(origins, normalised):
            if origin is None:
                raise TerraInputError(f"serve.allowed_origins: {entry!r} is not a web origin; give scheme://host"
                                      "[:port] without a path, e.g. http://localhost:3000")
        if not isinstance(self.cors, bool):
            raise TerraInputError(f"serve.cors must be true or false (got {self.cors!r})")
        if self.cors and not normalised:
            raise TerraInputError("serve.cors=true sends CORS headers to serve.allowed_origins, which is empty; "
                                  "list the pages' origins, e.g. serve.allowed_origins=[http://localhost:3000]")
        if self.roads is not None and not (isinstance(self.roads, str) and Path(self.roads).expanduser().is_dir()):
            raise TerraInputError(f"serve.roads={shown(self.roads, 200)} is not a folder; give a folder of road files "
                                  "(.json, .csv, a clipgt .zip) that sessions name, or leave it null")
        object.__setattr__(self, "allowed_hosts", hosts)
        object.__setattr__(self, "allowed_origins", normalised)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "ServeSettings":
        """Settings from a plain mapping (the ``serve`` config block); unknown keys fail with one line."""
        return cls(**known_settings(values, cls, "serve"))
