"""``terra-serve`` started for real on loopback (a free port) with the demo model on the Transformers backend."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

TOKEN = "test-token-0123456789"
SERVE = Path(sys.executable).parent / "terra-serve"
ENV = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "TERRA_SERVE_TOKEN")}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
# Limits small enough to reach in a test: 10 sessions, 10 s idle timeout, 64 KiB messages, 2 MB bodies, 3 steps
# queued on a socket.
LIMITS = ("serve.max_sessions=10", "serve.idle_timeout_s=10", "serve.max_request_bytes=2000000",
          "serve.max_message_bytes=65536", "serve.max_frames=40", "serve.drive_window=3", "serve.max_queued_steps=3")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running ``terra-serve`` process."""

    process: subprocess.Popen
    port: int
    token: str | None
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    @property
    def ghostscript_ran(self) -> bool:
        """Whether the server ran ``gs`` (a fake one on its PATH leaves this mark: Pillow's EPS decoder runs it)."""
        return (self.log.parent / "ghostscript-ran").exists()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=120, **kwargs)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_server(folder: Path, *overrides: str, token: str | None = TOKEN, timeout: float = 180) -> Server:
    """Start ``terra-serve`` (demo model, Transformers, CPU) and wait until ``/health`` answers 200."""
    port = free_port()
    log = folder / f"terra-serve-{port}.log"
    args = [str(SERVE), "backend=hf", "device=cpu", f"serve.port={port}", "serve.log_level=warning", *overrides]
    if token:
        args.append(f"serve.token={token}")
    bin_folder = folder / "bin"
    bin_folder.mkdir(exist_ok=True)
    (bin_folder / "gs").write_text(f"#!/bin/sh\ntouch {folder / 'ghostscript-ran'}\nexit 1\n")
    (bin_folder / "gs").chmod(0o755)
    env = {**ENV, "PATH": f"{bin_folder}{os.pathsep}{ENV.get('PATH', '')}"}
    with log.open("w") as out:
        process = subprocess.Popen(args, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    server = Server(process, port, token, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"terra-serve exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    server.stop()
    pytest.fail(f"terra-serve did not answer /health within {timeout} s:\n{log.read_text()}")


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> Server:
    """One server for the serve tests (a token is required, so every test also exercises it)."""
    roads = tmp_path_factory.mktemp("roads")
    (roads / "ahead.csv").write_text("x,y\n-10,0\n200,0\n")  # a lane through the car at the start, named "ahead"
    server = start_server(tmp_path_factory.mktemp("serve"), *LIMITS, f"serve.roads={roads}")
    yield server
    server.stop()


@pytest.fixture
def client(server):
    """An HTTP client with the token; sessions it opened are deleted afterwards (the server allows 10)."""
    with server.client() as http:
        before = {s["id"] for s in http.get("/sessions").json()["sessions"]}
        yield http
        for session in http.get("/sessions").json()["sessions"]:
            if session["id"] not in before:
                http.delete(f"/sessions/{session['id']}")
