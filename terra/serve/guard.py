"""Which requests ``terra-serve`` answers at all: the checks that keep web pages from reaching a local server."""

from __future__ import annotations

import ipaddress

from starlette.types import ASGIApp, Receive, Scope, Send

from terra.core.atomic import json_text
from terra.serve.settings import ServeSettings, is_loopback, split_host, web_origin

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class RequestGuard:
    """ASGI middleware applying the Host, Origin and Content-Type checks of this module to every request."""

    def __init__(self, app: ASGIApp, settings: ServeSettings) -> None:
        self.app = app
        bound = settings.host.lower()
        self.bound = f"[{bound}]" if ":" in bound else bound
        self.any_address = self.bound in ("0.0.0.0", "[::]")  # every interface: any IP literal reaches it
        self.loopback = is_loopback(settings.host)
        self.hosts = [split_host(entry) for entry in settings.allowed_hosts]
        self.origins = set(settings.allowed_origins)  # normalised as browsers send them

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        problem = self._problem(scope, {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]})
        if problem is None:
            return await self.app(scope, receive, send)
        status, message = problem
        if scope["type"] == "websocket":  # closing before accepting: the server answers the handshake with 403
            await receive()
            return await send({"type": "websocket.close", "code": 1008, "reason": message[:120]})
        body = json_text({"error": message}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _problem(self, scope: Scope, headers: dict[str, str]) -> tuple[int, str] | None:
        """(status, one line) for a request this server must not answer, else None."""
        port = scope["server"][1] if scope.get("server") else None
        host = headers.get("host", "")
        if not self._host_allowed(host, port):
            return 400, (f"Host {ascii(host[:100])} is not a name this server answers to; serving under a name? add "
                         "it to serve.allowed_hosts")
        origin = headers.get("origin")
        websocket = scope["type"] == "websocket"
        if origin is not None and (websocket or scope["method"] in STATE_CHANGING):
            scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
            own = web_origin(f"{scheme}://{host}")
            if not self._origin_allowed(web_origin(origin), own, port):
                return 403, (f"requests from the web page at {ascii(origin[:100])} are refused; to let that page "
                             "drive this server, add it to serve.allowed_origins")
        if not websocket and scope["method"] == "POST":
            kind = headers.get("content-type")
            has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
            media_type = (kind or "").split(";")[0].strip().lower()
            if (kind is not None or has_body) and media_type != "application/json":
                return 415, (f"request bodies must be JSON; send Content-Type: application/json (got "
                             f"{ascii(kind[:60]) if kind else 'none'})")
        return None

    def _host_allowed(self, host: str, port: int | None) -> bool:
        parsed = split_host(host)
        if parsed is None:
            return False
        name, given = parsed
        if (name, None) in self.hosts or (name, given) in self.hosts:  # serve.allowed_hosts: any port, or given's
            return True
        if given not in (None, port):
            return False
        if name in ("localhost", self.bound):
            return True
        return _is_ip(name) and (self.any_address or (self.loopback and is_loopback(name.strip("[]"))))

    def _origin_allowed(self, origin: str | None, own: str | None, port: int | None) -> bool:
        if origin is None:  # "null" (a sandboxed or file:// page) or malformed
            return False
        if origin in self.origins or origin == own:
            return True
        return self.loopback and origin in {f"http://{name}:{port}" for name in LOOPBACK_NAMES}
