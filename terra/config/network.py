"""What the network servers (terra-serve, terra-alpasim) check of where they listen and of their tokens: loopback
addresses (beyond them a server needs a token), host names and the token's characters."""

from __future__ import annotations

import ipaddress
import re

TOKEN_PATTERN = re.compile(r"[A-Za-z0-9._~+-]{8,256}")  # sent as a WebSocket subprotocol, so token characters only
HOST_NAME = re.compile(r"[a-z0-9_.-]+|[0-9a-f:.]+")  # a DNS name or an IPv4 address; or an IPv6 one (brackets dropped)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
