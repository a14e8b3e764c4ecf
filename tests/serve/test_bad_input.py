"""Bad input never takes ``terra-serve`` down: each mistake gets one clear error (HTTP 4xx or a WebSocket error
frame) and the other sessions keep stepping. Also the token, the session limit and the idle timeout."""

from __future__ import annotations

import base64
import io
import json
import socket
import time

import httpx
import pytest
from PIL import Image
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.serve.test_server import PROTOCOLS, STRAIGHT, open_socket, receive_frame

JSON = {"Content-Type": "application/json"}  # raw bodies below say what they are (others get 415: test_guard.py)


@pytest.fixture
def session_id(client) -> str:
    return client.post("/sessions", json={"seed": 0}).json()["id"]


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert message and "\n" not in message and "Traceback" not in message
    return message


def idle_engine(client) -> bool:
    """Nothing queued or generating in the server's engine (``GET /metrics``)."""
    metrics = client.get("/metrics").json()
    return metrics["queued"] == 0 and metrics["in_flight"] == 0


def still_serving(client, sid: str) -> None:
    """The server is up and a session still steps."""
    assert client.get("/health").status_code == 200
    assert client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT}).status_code == 200


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "malformed JSON"),
    (b'{"action": {"steer": NaN, "speed_kmh": 30}}', 400, "NaN is not a number"),
    (b'{"action": [[0, 1, 0.45]]}', 400, r"shape [6, 3]"),
    (b'{"action": {"steer": 0.1, "speed_kmh": 1e309}}', 400, "speed_kmh must be a finite number"),
    (b'{"action": {"steer": "left", "speed_kmh": 30}}', 400, "steer must be a finite number"),
    (b'{"action": {"fly": true}}', 400, "exactly one of"),
    (b'{"act": 1}', 400, "the body must be"),
    (b'[1, 2, 3]', 400, "the body must be"),
    pytest.param(b'{"action": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400, "malformed JSON (RecursionError",
                 id="deep-nesting"),
    pytest.param(b'{"action": {"steer": 0, "speed_kmh": ' + b"9" * 400 + b"}}", 400, "a number of 400 digits",
                 id="huge-integer"),
    (b'{"action": {"manoeuvre": "\\ud800"}}', 400, "unknown manoeuvre"),
    (b"\xff\xfe{}", 400, "malformed JSON"),
    # a route in a step is refused, not dropped (a session's route comes from its scene), and numbers are numbers
    (b'{"action": {"trajectory": {"x": [0, 1, 2], "y": [0, 0, 0], "routes": [[10, 0]]}}}', 400,
     "an action's trajectory gives 'routes', but a step takes no route"),
    (b'{"action": {"trajectory": {"x": [0, 1, 2], "y": [0, 0, 0]}, "ego_routes": [[[10, 0]]]}}', 400,
     "an action gives 'ego_routes', but a step takes no route"),
    (b'{"action": {"steer": 0, "speed_kmh": 30}, "Road": [[0, 0], [50, 0]]}', 400,
     "a step gives 'Road', but a step takes no route"),
    (b'{"action": {"trajectory": {"x": ["0", 1, 2], "y": [0, 0, 0]}}}', 400, "not numbers: the string '0'"),
    (b'{"action": {"trajectory": {"x": [0, 1, 2], "y": [0, false, 0]}}}', 400, "false (a boolean)"),
    (b'{"action": [["1.5", 1, 0.45], [0, 2, 0.95], [0, 3, 1.45], [0, 4, 1.95], [0, 5, 2.45], [0, 6, 2.95]]}', 400,
     "not numbers: the string '1.5'"),
])
def test_bad_steps_are_400_with_one_line(client, session_id, body, status, message):
    response = client.post(f"/sessions/{session_id}/step", content=body, headers=JSON)
    assert message in error_of(response, status)


@pytest.mark.parametrize("spec, message", [
    ({"context": {"builtin": {"manoeuvre": "fly"}}}, "unknown manoeuvre"),
    ({"context": {"images": ["bm90IGFuIGltYWdl"]}}, "cannot be read as an image"),
    ({"context": {"images": ["%%%"]}}, "not valid base64"),
    ({"context": {"images": []}}, "list of 1 to 15 images"),
    ({"context": {"codes": [[1, 2, 3]]}}, "codes per frame"),
    ({"context": {"codes": [[[5000] * 16] * 9]}}, "codebook"),
    ({"context": {"builtin": {}, "codes": []}}, "one of builtin"),
    ({"sampling": {"temperature": -1}}, "sampling.temperature must be"),
    ({"sampling": {"temp": 1}}, "sampling must be an object"),
    ({"seed": -3}, "seed must be a whole number"),
    ({"max_frames": 10_000}, "over this host's limit of 40"),
    ({"colour": "red"}, "unknown session settings"),
])
def test_bad_session_specs_are_400(client, spec, message):
    assert message in error_of(client.post("/sessions", json=spec), 400)


def test_huge_uploads_are_413_and_image_bombs_400(client, session_id):
    big = b'{"context": {"images": ["' + b"A" * 2_100_000 + b'"]}}'
    assert "max_request_bytes" in error_of(client.post("/sessions", content=big, headers=JSON), 413)

    def chunks():  # no Content-Length: the server counts while reading
        yield b'{"context": {"images": ["'
        for _ in range(30):
            yield b"A" * 100_000

    assert "max_request_bytes" in error_of(client.post("/sessions", content=chunks(), headers=JSON), 413)
    buffer = io.BytesIO()
    Image.new("L", (5000, 5000)).save(buffer, format="PNG")  # 25 Mpx, a few kB compressed
    bomb = base64.b64encode(buffer.getvalue()).decode()
    assert "5000x5000 pixels" in error_of(client.post("/sessions", json={"context": {"images": [bomb]}}), 400)
    buffer = io.BytesIO()
    Image.new("I;16", (256, 144)).save(buffer, format="PNG")  # 16-bit grey: not a colour photo
    deep = base64.b64encode(buffer.getvalue()).decode()
    assert "pixel mode" in error_of(client.post("/sessions", json={"context": {"images": [deep]}}), 400)
    still_serving(client, session_id)


def test_uploads_are_png_or_jpeg_and_never_reach_ghostscript(server, client, session_id):
    """An EPS upload would make Pillow run ``gs`` on the client's PostScript; a GIF is refused as well."""
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\nshowpage\n"
    buffer = io.BytesIO()
    Image.new("RGB", (32, 18)).save(buffer, format="GIF")
    for data in (eps, buffer.getvalue()):
        upload = "data:image/png;base64," + base64.b64encode(data).decode()
        message = error_of(client.post("/sessions", json={"context": {"images": [upload]}}), 400)
        assert "cannot be read as an image" in message and "PNG or JPEG" in message
    assert not server.ghostscript_ran
    still_serving(client, session_id)


def test_unknown_sessions_and_formats(client, session_id):
    assert "no session" in error_of(client.post("/sessions/nope/step", json={"action": STRAIGHT}), 404)
    assert "no session" in error_of(client.delete("/sessions/nope"), 404)
    long_id = "x" * 4000 + "%0Aforged"  # a client's id is quoted short and escaped, never echoed whole
    for answer in (client.get(f"/sessions/{long_id}"), client.delete(f"/sessions/{long_id}")):
        error = error_of(answer, 404)
        assert error.startswith("no session 'xxx") and len(error) < 200 and "\n" not in error, error
    assert "format must be" in error_of(client.get(f"/sessions/{session_id}/video", params={"format": "avi"}), 400)


def test_token_is_enforced(server, session_id):
    anonymous = httpx.Client(base_url=server.url, timeout=30)
    assert "bearer token" in error_of(anonymous.get("/sessions"), 401)
    assert anonymous.get("/metrics").status_code == 401
    assert anonymous.post(f"/sessions/{session_id}/step", json={"action": STRAIGHT}).status_code == 401
    wrong = anonymous.get("/sessions", headers={"Authorization": "Bearer not-the-token"})
    assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert anonymous.get("/health").status_code == 200
    for protocols in (["terra"], ["terra", "bearer.not-the-token"]):
        with connect(f"{server.ws_url}/sessions/{session_id}/ws", subprotocols=protocols) as ws:
            assert "token" in json.loads(ws.recv(timeout=30))["message"]
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=30)
            assert closed.value.rcvd.code == 1008


def test_socket_errors_are_frames_and_the_socket_keeps_working(server, client, session_id):
    bad = [
        "{not json",
        json.dumps({"type": "fly"}),
        json.dumps({"type": "step"}),
        json.dumps({"type": "step", "action": [[1, 2]]}),
        '{"type": "step", "action": {"steer": NaN, "speed_kmh": 30}}',
        json.dumps({"type": "keys", "keys": {"jump": True}}),
        json.dumps({"type": "drive", "on": "yes"}),
        json.dumps({"type": "ack"}),
        b"\x00\x01binary",
        '{"type": "step", "action": ' + "[" * 20_000 + "]" * 20_000 + "}",
        '{"type": "step", "action": {"steer": 0, "speed_kmh": ' + "9" * 400 + "}}",
    ]
    said = {  # a route in a step message is refused, not dropped; a misspelt key is guessed
        json.dumps({"type": "step", "action": STRAIGHT, "routes": [[[10, 0]] * 8] * 2}): "a step takes no route",
        json.dumps({"type": "step", "action": {"trajectory": {"x": [0, 1], "y": [0, 0], "road": [[0, 0], [9, 0]]}}}):
            "an action's trajectory gives 'road', but a step takes no route",
        json.dumps({"type": "step", "acton": STRAIGHT}): "unknown key 'acton' (did you mean 'action'?)",
    }
    with open_socket(server, session_id) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        for message in [*bad, *said]:
            ws.send(message)
            reply = json.loads(ws.recv(timeout=30))
            assert reply["type"] == "error" and reply["message"] and "\n" not in reply["message"], (message, reply)
            assert said.get(message, "") in reply["message"], (message, reply)
        ws.send(json.dumps({"type": "step", "action": STRAIGHT}))
        assert receive_frame(ws)[0]["index"] == 0
        ws.send("x" * 70_000)  # over serve.max_message_bytes: the server closes this socket (1009)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
        assert closed.value.rcvd is None or closed.value.rcvd.code == 1009
    still_serving(client, session_id)


def test_too_many_queued_steps_on_a_socket(server, session_id):
    with open_socket(server, session_id) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        for _ in range(6):  # one in flight + serve.max_queued_steps=3 queued; the rest are refused
            ws.send(json.dumps({"type": "step", "action": STRAIGHT}))
        errors = frames = 0
        while frames + errors < 6:
            message = ws.recv(timeout=300)
            if isinstance(message, bytes):
                frames += 1
            else:
                assert "already queued" in json.loads(message)["message"]
                errors += 1
        assert 4 <= frames <= 5 and errors == 6 - frames


def test_disconnect_mid_frame_and_a_socket_that_never_reads(server, client, session_id):
    other = client.post("/sessions", json={"seed": 1}).json()["id"]
    with connect(f"{server.ws_url}/sessions/{other}/ws", subprotocols=PROTOCOLS) as ws:
        ws.send(json.dumps({"type": "step", "action": STRAIGHT}))
    # that client is gone while its frame is being generated; the next one never reads nor acknowledges
    with connect(f"{server.ws_url}/sessions/{other}/ws", subprotocols=PROTOCOLS, max_queue=1) as silent:
        silent.send(json.dumps({"type": "keys", "keys": {"up": True}}))
        silent.send(json.dumps({"type": "drive", "on": True}))
        start = time.monotonic()
        still_serving(client, session_id)  # another session is served while both of them misbehave
        assert time.monotonic() - start < 60
        # Driving runs serve.drive_window (3) frames ahead of the acknowledgements that never come: the frame
        # indices of the session reach 0, 1, 2 (the closed socket's step, if it ran, was frame 0), then it stalls.
        # Wait on that state, not on a clock: 3 frames, and the engine with nothing queued or in flight.
        deadline = time.monotonic() + 180
        while not (client.get(f"/sessions/{other}").json()["frames"] == 3 and idle_engine(client)):
            assert client.get(f"/sessions/{other}").json()["frames"] <= 3, "drove past the drive window"
            assert time.monotonic() < deadline, "the drive window's frames did not come"
            time.sleep(0.2)
        assert client.get(f"/sessions/{other}").json()["frames"] == 3  # stalled: costs no model time
        deadline = time.monotonic() + 30
        while client.get(f"/sessions/{other}").status_code != 404:  # and it expires like any idle session
            assert time.monotonic() < deadline, "the stalled session did not expire"
            time.sleep(1)
    still_serving(client, client.post("/sessions", json={}).json()["id"])  # (session_id expired meanwhile too)


def test_session_limit(client, session_id):
    opened = len(client.get("/sessions").json()["sessions"])
    for _ in range(10 - opened):
        assert client.post("/sessions", json={}).status_code == 201
    message = error_of(client.post("/sessions", json={}), 429)
    assert "serve.max_sessions=10" in message
    assert error_of(client.post(f"/sessions/{session_id}/fork"), 429)
    still_serving(client, session_id)


def test_idle_sessions_expire_and_their_sockets_get_a_close_frame(server, client):
    sid = client.post("/sessions", json={}).json()["id"]
    with open_socket(server, sid) as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)  # idle timeout 10 s, checked every 2.5 s
    assert closed.value.rcvd.code == 1000 and "idle timeout" in closed.value.rcvd.reason
    assert client.get(f"/sessions/{sid}").status_code == 404


# ------------------------------------------------------------- round 4: numbers, disconnects, error shapes


@pytest.mark.parametrize("spec, message", [
    ({"seed": 10**30}, "seed must be a whole number from 0 to 4611686018427387903 (got 10000000000000000000000000"),
    ({"seed": 2**62}, "seed must be a whole number from 0 to 4611686018427387903"),
    ({"num_context": 1000}, "num_context must be a whole number from 1 to 15 (got 1000)"),  # the demo's window: 16
    ({"num_context": 16, "context": {"builtin": {"scene": 3}}}, "num_context must be a whole number from 1 to 15"),
])
def test_numbers_beyond_their_range_are_400_before_any_work(client, session_id, spec, message):
    opened = len(client.get("/sessions").json()["sessions"])
    assert message in error_of(client.post("/sessions", json=spec), 400)
    assert len(client.get("/sessions").json()["sessions"]) == opened
    still_serving(client, session_id)


@pytest.mark.parametrize("method, path, status", [("GET", "/no/such/route", 404), ("PUT", "/health", 405),
                                                  ("DELETE", "/sessions", 405)])
def test_every_error_body_has_the_documented_shape(client, method, path, status):
    response = client.request(method, path)
    assert set(response.json()) == {"error"}
    error_of(response, status)


def test_a_client_that_leaves_mid_request_is_no_error(server, client, session_id):
    log_size = server.log.stat().st_size
    with socket.create_connection(("127.0.0.1", server.port)) as raw:  # a body promised, half sent, then gone
        raw.sendall(f"POST /sessions/{session_id}/step HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
                    f"Authorization: Bearer {server.token}\r\nContent-Type: application/json\r\n"
                    "Content-Length: 100\r\n\r\n{\"action\"".encode())
    deadline = time.monotonic() + 60
    while "client left before its request was read" not in (text := server.log.read_text()[log_size:]):
        assert time.monotonic() < deadline, text
        assert client.get("/health").status_code == 200  # a request of its own while waiting: no sleep
    assert "Traceback" not in text and "internal error" not in text and "ERROR" not in text, text
    still_serving(client, session_id)


@pytest.mark.parametrize("headers, status", [
    ([f"Sec-WebSocket-Protocol: {', '.join(f'p{i:04d}' for i in range(3000))}"], b"431"),  # one 21 KB line
    ([f"Sec-WebSocket-Protocol: p{i}" for i in range(3000)], b"431"),  # more than 128 header lines
    (["X-Pad: " + "a" * 51_000], b"431"),
], ids=["3000-subprotocols", "3000-header-lines", "51-KB-header"])
def test_an_oversized_handshake_is_answered_at_once(server, client, session_id, headers, status):
    """websockets refuses these handshakes before the app sees them; the answer comes at once (it never came: the
    client waited until its own timeout) and the server goes on."""
    lines = [f"GET /sessions/{session_id}/ws HTTP/1.1", f"Host: 127.0.0.1:{server.port}", "Upgrade: websocket",
             "Connection: Upgrade", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             f"Authorization: Bearer {server.token}", *headers]
    with socket.create_connection(("127.0.0.1", server.port)) as raw:
        raw.settimeout(10)  # the deadline for an answer that is due at once
        raw.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = raw.recv(64)
        assert answer.startswith(b"HTTP/1.1 " + status), answer
        raw.settimeout(10)
        while raw.recv(4096):  # then the server closes the connection
            pass
    still_serving(client, session_id)
