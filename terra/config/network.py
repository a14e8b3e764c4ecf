"""Network servers' checks: loopback addresses (beyond them a token is needed), host names, token characters."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from terra.core.errors import TerraInputError

TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+-]{8,256}")  # sent as a WebSocket subprotocol, so token characters only
HOST_NAME = re.compile(r"[a-z0-9_.-]+|[0-9a-f:.]+")  # a DNS name or an IPv4 address; or an IPv6 one (brackets dropped)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1, IPv4-mapped 127.0.0.0/8)."""
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def check_token(token: Any, setting: str, variable: str) -> None:
    """Refuse a token ``setting`` that is not 8 to 256 token characters; ``variable`` names its environment variable."""
    if token is None or (isinstance(token, str) and TOKEN_PATTERN.fullmatch(token)):
        return
    if isinstance(token, (bool, int, float)):
        kind = "a truth value" if isinstance(token, bool) else "a number"
        raise TerraInputError(f"{setting} was read as {kind}, not as text (Hydra reads digits alone so, and a leading "
                              f"0 or + would be lost); quote it, {setting}=\"'<token>'\", or set {variable}=<token>")
    raise TerraInputError(f"{setting} must be 8 to 256 letters, digits or - . _ ~ +; e.g. "
                          f"{variable}=$(openssl rand -hex 16)")
