"""Web pages cannot reach ``terra-serve`` on its default loopback bind without a token (terra/serve/guard.py):
the three attacks a visited page could make are refused, while the page's own origin, clients that send no
``Origin``, and an origin or host name the user allowed keep working. Real servers on loopback."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.serve.conftest import start_server

EVIL = "http://evil.example"
TRUSTED = "http://trusted.example:5000"


@pytest.fixture(scope="module")
def open_server(tmp_path_factory):
    """No token (the default on loopback), one extra allowed origin and one extra host name, CORS on."""
    server = start_server(tmp_path_factory.mktemp("guard"), f"serve.allowed_origins=[{TRUSTED}]",
                          "serve.allowed_hosts=[terra.test]", "serve.cors=true", token=None)
    yield server
    server.stop()


def session_count(server) -> int:
    return len(httpx.get(f"{server.url}/sessions").json()["sessions"])


def one_line_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert message and "\n" not in message
    return message


def test_websocket_from_a_foreign_page_is_refused_before_the_upgrade(open_server):
    sid = httpx.post(f"{open_server.url}/sessions", json={}).json()["id"]
    url = f"{open_server.ws_url}/sessions/{sid}/ws"
    for origin in (EVIL, "null", f"http://127.0.0.1:{open_server.port + 1}"):
        with pytest.raises(InvalidStatus) as refused:
            connect(url, origin=origin, open_timeout=30)
        assert refused.value.response.status_code == 403, origin
    for origin in (None, f"http://127.0.0.1:{open_server.port}", f"http://localhost:{open_server.port}", TRUSTED):
        with connect(url, origin=origin, open_timeout=30) as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "ready", origin
    assert httpx.get(f"{open_server.url}/sessions/{sid}").json()["frames"] == 0  # nobody drove it


def test_simple_cross_site_posts_create_nothing(open_server):
    before = session_count(open_server)
    forged = httpx.post(f"{open_server.url}/sessions", content=b"{}",
                        headers={"Content-Type": "text/plain", "Origin": EVIL})
    assert "serve.allowed_origins" in one_line_error(forged, 403)
    plain = httpx.post(f"{open_server.url}/sessions", content=b"{}", headers={"Content-Type": "text/plain"})
    assert "Content-Type: application/json" in one_line_error(plain, 415)
    untyped = httpx.post(f"{open_server.url}/sessions", content=b"{}")
    assert "got none" in one_line_error(untyped, 415)
    json_from_evil = httpx.post(f"{open_server.url}/sessions", json={}, headers={"Origin": EVIL})
    assert one_line_error(json_from_evil, 403)
    assert session_count(open_server) == before

    own = httpx.post(f"{open_server.url}/sessions", json={}, headers={"Origin": f"http://127.0.0.1:{open_server.port}"})
    trusted = httpx.post(f"{open_server.url}/sessions", json={}, headers={"Origin": TRUSTED})
    no_origin = httpx.post(f"{open_server.url}/sessions", json={})
    bodiless = httpx.post(f"{open_server.url}/sessions/{no_origin.json()['id']}/fork")  # curl -X POST: no body
    assert [r.status_code for r in (own, trusted, no_origin, bodiless)] == [201] * 4
    sid = own.json()["id"]
    assert one_line_error(httpx.delete(f"{open_server.url}/sessions/{sid}", headers={"Origin": EVIL}), 403)
    assert httpx.get(f"{open_server.url}/sessions/{sid}").status_code == 200
    assert httpx.delete(f"{open_server.url}/sessions/{sid}", headers={"Origin": TRUSTED}).status_code == 204


def test_foreign_host_names_are_refused(open_server):
    port = open_server.port
    for host in (f"evil.example:{port}", "evil.example", f"localhost.evil.example:{port}", f"localhost:{port + 1}"):
        response = httpx.get(f"{open_server.url}/sessions", headers={"Host": host})
        assert "serve.allowed_hosts" in one_line_error(response, 400), host
        assert httpx.get(f"{open_server.url}/", headers={"Host": host}).status_code == 400
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"terra.test:{port}", "terra.test"):
        assert httpx.get(f"{open_server.url}/sessions", headers={"Host": host}).status_code == 200, host


def test_cors_headers_only_for_allowed_origins(open_server, server):
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"}
    allowed = httpx.options(f"{open_server.url}/sessions", headers={"Origin": TRUSTED, **preflight})
    assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == TRUSTED
    foreign = httpx.options(f"{open_server.url}/sessions", headers={"Origin": EVIL, **preflight})
    assert "access-control-allow-origin" not in foreign.headers
    read = httpx.get(f"{open_server.url}/sessions", headers={"Origin": TRUSTED})
    assert read.headers["access-control-allow-origin"] == TRUSTED
    off = httpx.get(f"{server.url}/health", headers={"Origin": TRUSTED})  # serve.cors=false (the default)
    assert off.status_code == 200 and "access-control-allow-origin" not in off.headers


def test_the_token_still_applies_on_top(server):
    own = {"Origin": server.url}
    assert httpx.post(f"{server.url}/sessions", json={}, headers=own).status_code == 401
    with server.client() as http:
        created = http.post("/sessions", json={}, headers=own)
        assert created.status_code == 201
        assert http.post("/sessions", json={}, headers={"Origin": EVIL}).status_code == 403
        http.delete(f"/sessions/{created.json()['id']}")
