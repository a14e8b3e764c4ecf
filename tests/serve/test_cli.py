"""``terra-serve`` as a command: settings checked before the model loads (exit 2, one line), and a graceful
shutdown that sends open sockets a close frame."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from terra.serve.settings import ServeSettings, is_loopback
from tests.conftest import one_error_line
from tests.serve.conftest import ENV, SERVE, TOKEN, start_server


@pytest.mark.parametrize("overrides, message", [
    (["serve.host=0.0.0.0"], "serve.host=0.0.0.0 is reachable beyond this machine, so a token is required"),
    (["serve.host=192.168.1.20", "serve.token=short"], "serve.token must be 8 to 256"),
    (["serve.token=1234567890"], "serve.token was read as a number, not as text"),
    (["serve=null"], "serve must be a block of settings (allowed_hosts, "),
    (["serve.port=70000"], "serve.port must be a whole number from 0 to 65535"),
    (["serve.max_sessions=0"], "serve.max_sessions must be a whole number from 1 to 1024"),
    (["serve.max_sessions=1000000000"], "serve.max_sessions must be a whole number from 1 to 1024"),
    (["serve.max_request_bytes=1e15"], "serve.max_request_bytes must be a whole number from 1024 to 1073741824"),
    (["serve.idle_timeout_s=inf"], "serve.idle_timeout_s must be a positive number of seconds, at most 604800"),
    (["serve.image_format=bmp"], "serve.image_format must be one of jpeg, png"),
    (["serve.idle_timeout_s=-1"], "serve.idle_timeout_s must be a positive number"),
    (["+serve.colour=red"], "unknown setting 'serve.colour'"),
    (["serve.colour=red"], "unknown setting 'serve.colour'"),
    (["num_context=16"], "num_context=16 does not fit a window of 16 frames"),
    (["serve.allowed_origins=[ftp://files.example]"], "'ftp://files.example' is not a web origin"),
    (["serve.allowed_hosts=[terra.test/page]"], "'terra.test/page' is not a host name"),
    (["serve.cors=true"], "serve.cors=true sends CORS headers to serve.allowed_origins, which is empty"),
    (["num_threads=many"], "num_threads must be auto, a whole number from 1 to 1024 or null (got 'many')"),
    (["serve.roads=/no/such/roads"], "serve.roads='/no/such/roads' is not a folder; give a folder of road files"),
])
def test_bad_settings_exit_2_with_one_line(tmp_path, overrides, message):
    result = subprocess.run([str(SERVE), *overrides], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                            timeout=120)
    one_error_line(result, "terra-serve", message)
    assert list(tmp_path.iterdir()) == []  # no run folder


def test_a_bad_road_file_in_serve_roads_is_one_line_before_the_model_loads(tmp_path):
    roads = tmp_path / "roads"
    roads.mkdir()
    (roads / "ahead.json").write_text('{"road": [[0, 0], [10, "a"]]}')
    result = subprocess.run([str(SERVE), f"serve.roads={roads}"], cwd=tmp_path, env=ENV, capture_output=True,
                            text=True, timeout=120)
    one_error_line(result, "terra-serve", "ahead.json: road[1][1]: must be a number (y, metres)")


def test_token_rules():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.5")
    assert not is_loopback("0.0.0.0") and not is_loopback("example.org")
    assert ServeSettings(host="0.0.0.0", token=TOKEN).token == TOKEN
    assert ServeSettings(host="127.0.0.1").token is None


def test_shutdown_sends_open_sockets_a_close_frame(tmp_path):
    server = start_server(tmp_path, token=None)
    try:
        with server.client() as http:
            sid = http.post("/sessions", json={}).json()["id"]
        with connect(f"{server.ws_url}/sessions/{sid}/ws") as ws:
            assert json.loads(ws.recv(timeout=30))["type"] == "ready"
            server.process.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=60)
        assert closed.value.rcvd.code == 1001 and closed.value.rcvd.reason == "server shutting down"
        assert server.process.wait(60) == 143  # as every app ends on SIGTERM (terra/apps/runner.py, run_app)
        assert server.log.read_text().strip().splitlines()[-1] == "terra-serve: interrupted by SIGTERM"
    finally:
        server.stop()


def test_a_port_in_use_is_one_line_before_the_model_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([str(SERVE), "backend=hf", "device=cpu", f"serve.port={port}"], cwd=tmp_path, env=ENV,
                                capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and result.stdout == "", (result.stdout, result.stderr)  # never "ready"
    assert result.stderr.strip() == (f"terra-serve: error: cannot listen on 127.0.0.1:{port} (Address already in "
                                     "use); stop the program that uses the port or choose another serve.port / "
                                     "serve.host")


def test_ready_is_printed_once_the_server_listens(tmp_path):
    server = start_server(tmp_path, token=None)  # waits for GET /health
    try:
        ready = f"terra-serve: transformers backend ready; open http://127.0.0.1:{server.port}/"
        deadline = time.monotonic() + 60
        while ready not in (text := server.log.read_text()).splitlines():  # printed as the server starts serving
            assert time.monotonic() < deadline and server.process.poll() is None, text
            with server.client() as http:
                assert http.get("/health").status_code == 200
        assert "Loading weights" not in text  # no third-party progress bar in a log
    finally:
        server.stop()
