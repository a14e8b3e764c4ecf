"""``terra-serve`` round trips over REST and WebSocket against a real server (tests/serve/conftest.py)."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
from PIL import Image
from websockets.asyncio.client import connect as connect_async
from websockets.sync.client import connect

from terra.serve.media import read_frame_message
from tests.serve.conftest import TOKEN

STRAIGHT = {"steer": 0.0, "speed_kmh": 30}
LEFT = {"steer": 1.0, "speed_kmh": 30}
PROTOCOLS = ["terra", f"bearer.{TOKEN}"]


def image_of(data_url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(data_url.split(",", 1)[1])))


def open_socket(server, session_id: str):
    return connect(f"{server.ws_url}/sessions/{session_id}/ws", subprotocols=PROTOCOLS, open_timeout=30,
                   max_size=2**22)


def receive_frame(ws, timeout: float = 120) -> tuple[dict, bytes]:
    """The next binary frame message (text messages in between must not be errors)."""
    while True:
        message = ws.recv(timeout=timeout)
        if isinstance(message, bytes):
            return read_frame_message(message)
        assert json.loads(message)["type"] != "error", message


def test_health_page_and_metrics(server):
    import httpx

    health = httpx.get(f"{server.url}/health")  # no token needed: load balancers probe it
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["token_required"]
    page = httpx.get(f"{server.url}/")
    assert page.status_code == 200 and "/static/app.js" in page.text
    assert "createImageBitmap" in httpx.get(f"{server.url}/static/app.js").text
    with server.client() as http:
        metrics = http.get("/metrics").json()
    assert {"sessions", "frames_total", "frames_per_s", "queued", "in_flight"} <= set(metrics)
    assert metrics["backend"] == "transformers"


def test_rest_round_trip_fork_reset_video_and_frame_limit(client):
    spec = {"context": {"builtin": {"manoeuvre": "curve_left", "scene": 3}}, "seed": 5,
            "sampling": {"temperature": 0.0}, "max_frames": 3}
    created = client.post("/sessions", json=spec)
    assert created.status_code == 201, created.text
    info = created.json()
    sid = info["id"]
    assert info["frames"] == 0 and info["max_frames"] == 3 and info["context"] == "built-in curve_left, scene 3"
    assert (info["route"], info["route_source"]) == (True, "scene")  # the demo model is told the scene's road

    first = client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT, "codes": True}).json()
    assert first["index"] == 0 and first["format"] == "jpeg" and first["pose"][0] > 0.5  # moved forward
    assert image_of(first["image"]).size == (256, 144)
    assert np.asarray(first["codes"]).shape == (9, 16)
    assert set(first["timings"]) >= {"queue_s", "generate_s", "decode_s", "encode_s", "total_s"}
    second = client.post(f"/sessions/{sid}/step", json={"action": LEFT}).json()
    assert second["index"] == 1 and second["pose"][2] > first["pose"][2]  # turning left
    stepped = client.get(f"/sessions/{sid}").json()
    assert (stepped["frames"], stepped["route"], stepped["routed_steps"]) == (2, True, 2)  # told at each step

    fork = client.post(f"/sessions/{sid}/fork")
    assert fork.status_code == 201 and fork.json()["frames"] == 2 and fork.json()["id"] != sid
    assert fork.json()["routed_steps"] == 2

    assert client.post(f"/sessions/{sid}/reset").json()["frames"] == 0
    again = client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT, "codes": True}).json()
    assert again["codes"] == first["codes"]  # greedy from the same context and action: the same frame

    mp4 = client.get(f"/sessions/{sid}/video", params={"format": "mp4"})
    assert mp4.status_code == 200 and mp4.headers["content-type"] == "video/mp4" and mp4.content[4:8] == b"ftyp"
    gif = client.get(f"/sessions/{fork.json()['id']}/video", params={"format": "gif"})
    assert gif.content[:6] == b"GIF89a" and Image.open(io.BytesIO(gif.content)).n_frames == 5  # 3 context + 2

    client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT})
    client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT})
    over = client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT})
    assert over.status_code == 400 and "limit of 3 frames" in over.json()["error"]
    assert client.delete(f"/sessions/{sid}").status_code == 204
    assert client.get(f"/sessions/{sid}").status_code == 404


def test_websocket_steps_keys_drive_window_and_reset(server, client):
    sid = client.post("/sessions", json={"seed": 1}).json()["id"]
    with open_socket(server, sid) as ws:
        assert ws.subprotocol == "terra"
        ready = json.loads(ws.recv(timeout=30))
        assert ready["type"] == "ready" and ready["session"]["id"] == sid
        ws.send(json.dumps({"type": "step", "action": LEFT}))
        header, image = receive_frame(ws)
        assert header["index"] == 0 and header["session"] == sid
        assert Image.open(io.BytesIO(image)).size == (256, 144)

        ws.send(json.dumps({"type": "keys", "keys": {"up": True}}))
        ws.send(json.dumps({"type": "drive", "on": True}))
        driven = [receive_frame(ws)[0] for _ in range(3)]  # serve.drive_window frames without acknowledgements
        assert [h["index"] for h in driven] == [1, 2, 3]
        assert driven[-1]["speed_kmh"] > driven[0]["speed_kmh"]  # the up key accelerates
        try:
            extra = ws.recv(timeout=4)
        except TimeoutError:
            extra = None
        assert extra is None, "the server ran ahead of the client's acknowledgements"
        ws.send(json.dumps({"type": "ack", "index": 3}))
        assert receive_frame(ws)[0]["index"] == 4
        ws.send(json.dumps({"type": "drive", "on": False}))
        ws.send(json.dumps({"type": "reset"}))
        while True:  # frames already on their way, then the reset
            message = ws.recv(timeout=120)
            if isinstance(message, str) and json.loads(message)["type"] == "reset":
                break
        ws.send(json.dumps({"type": "step", "action": LEFT}))
        assert receive_frame(ws)[0]["index"] == 0


def test_eight_concurrent_sessions_all_get_their_frames(server, client):
    ids = [client.post("/sessions", json={"seed": i, "context": {"builtin": {"scene": i}}}).json()["id"]
           for i in range(8)]
    frames_before = client.get("/metrics").json()["frames_total"]

    async def drive(sid: str) -> list[tuple[dict, bytes]]:
        async with connect_async(f"{server.ws_url}/sessions/{sid}/ws", subprotocols=PROTOCOLS, max_size=2**22) as ws:
            assert json.loads(await ws.recv())["type"] == "ready"
            for action in (STRAIGHT, LEFT):
                await ws.send(json.dumps({"type": "step", "action": action}))
            return [read_frame_message(await asyncio.wait_for(ws.recv(), 300)) for _ in range(2)]

    async def all_sessions():
        return await asyncio.gather(*(drive(sid) for sid in ids))

    results = asyncio.run(all_sessions())
    for sid, frames in zip(ids, results):
        assert [h["index"] for h, _ in frames] == [0, 1] and all(h["session"] == sid for h, _ in frames)
    images = {bytes(frames[0][1]) for frames in results}
    assert len(images) == 8  # eight scenes, eight different frames
    assert client.get("/metrics").json()["frames_total"] - frames_before == 16


def test_uploaded_context_images(client):
    rng = np.random.default_rng(0)
    images = []
    for i in range(4):
        pixels = np.full((288, 512, 3), 90, dtype=np.uint8)
        pixels[150:] = 60 + 10 * i  # a dark road below a grey sky, brightening
        pixels += rng.integers(0, 20, pixels.shape, dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).save(buffer, format="PNG")
        images.append("data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode())
    created = client.post("/sessions", json={"context": {"images": images, "speed_kmh": 20}})
    assert created.status_code == 201, created.text
    info = created.json()
    assert info["context"] == "3 images" and info["num_context"] == 3 and info["speed_kmh"] == 20
    assert (info["route"], info["route_source"]) == (False, None)  # no road known: none told
    frame = client.post(f"/sessions/{info['id']}/step", json={"action": {"manoeuvre": "straight"}}).json()
    assert frame["index"] == 0 and image_of(frame["image"]).size == (256, 144)


def test_sessions_take_a_road_and_say_per_step_whether_it_was_told(client):
    lane = [[-10.0, 0.0], [40.5, 0.0]]  # in the session's frame: ends 40.5 m ahead of the car at the start
    created = client.post("/sessions", json={"seed": 2, "road": lane, "max_frames": 3})
    assert created.status_code == 201, created.text
    info = created.json()
    assert (info["route"], info["route_source"], info["route_told"]) == (True, "road", [])
    first = client.post(f"/sessions/{info['id']}/step", json={"action": STRAIGHT}).json()
    assert first["route_told"] == "road ended"  # 0.8 m on, under half the route's 80 m of road ahead
    stepped = client.get(f"/sessions/{info['id']}").json()
    assert (stepped["route"], stepped["routed_steps"], stepped["route_told"]) == (False, 0, ["road ended"])

    long = json.dumps([{"points": [[-10, 0], [200, 0]]}])  # lanes, as a JSON text
    told = client.post("/sessions", json={"seed": 2, "road": long, "context": {"codes": first_codes(client)}})
    assert told.status_code == 201, told.text
    frame = client.post(f"/sessions/{told.json()['id']}/step", json={"action": STRAIGHT}).json()
    assert frame["route_told"] == "told"
    assert client.get(f"/sessions/{told.json()['id']}").json()["route_told"] == ["told"]

    named = client.post("/sessions", json={"seed": 2, "road": "ahead"})  # serve.roads' ahead.csv
    assert named.status_code == 201 and named.json()["route_source"] == "road", named.text
    assert client.post(f"/sessions/{named.json()['id']}/step", json={"action": STRAIGHT}).json()["route_told"] == "told"

    none = client.post("/sessions", json={"seed": 2, "road": None}).json()  # null: no route, not the scene's
    assert (none["route"], none["route_source"]) == (False, None)
    assert client.post(f"/sessions/{none['id']}/step", json={"action": STRAIGHT}).json()["route_told"] == "none given"

    off = ("road: the car does not lie on a lane of the road (within 4 m of a centreline, heading within 60 degrees "
           "of it): the nearest lane is 500.0 m away, heading 0 degrees off the car's; give the road in the session's "
           "frame")
    for road, said in (([[500, 0], [700, 0]], off),
                       ([[10, 0], [-200, 0]], "heading 180 degrees off the car's"),
                       ([[-10, 0], [30, 0]], "the road ends within 40 m ahead of the car, so it has no route"),
                       ("road.json", "'road.json' is no road this server knows; give one of this server's roads "
                                     "(ahead) or the road itself"), ([[0, "1"]], "road[0][1]: must be a number")):
        refused = client.post("/sessions", json={"road": road})
        assert refused.status_code == 400 and said in refused.json()["error"], refused.text
    assert client.post(f"/sessions/{none['id']}/step", json={"action": STRAIGHT}).status_code == 200  # still serving


def first_codes(client) -> list:
    """The codes of a built-in session's first frame, as context for a session of codes."""
    sid = client.post("/sessions", json={"seed": 0, "sampling": {"temperature": 0.0}}).json()["id"]
    return [client.post(f"/sessions/{sid}/step", json={"action": STRAIGHT, "codes": True}).json()["codes"]]
