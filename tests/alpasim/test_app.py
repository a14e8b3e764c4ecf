"""``terra-alpasim`` as a command: settings and the port checked before the model loads (exit 2, one line); with
the demo model it serves AlpaSim's calls (JPEG frames at the model's size) and stops on SIGTERM (exit 143)."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("carla_driver_interface")

from terra.alpasim import video_model_pb2 as pb  # noqa: E402
from terra.alpasim.client import straight, trajectory  # noqa: E402
from tests.alpasim.fake_runtime import FakeRuntime  # noqa: E402
from tests.conftest import one_error_line  # noqa: E402

COMMAND = Path(sys.executable).parent / "terra-alpasim"
ENV = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("overrides, message", [
    (["alpasim.port=70000"], "alpasim.port must be a whole number from 0 to 65535 (got 70000)"),
    (["alpasim.max_frames=20000"], "alpasim.max_frames must be a whole number from 1 to 10000"),
    (["alpasim.max_sessions=0"], "alpasim.max_sessions must be a whole number from 1 to 1024"),
    (["alpasim.max_sessions=1000000000"], "alpasim.max_sessions must be a whole number from 1 to 1024"),
    (["alpasim.max_image_pixels=1e12"], "alpasim.max_image_pixels must be a whole number from 4096 to 67108864"),
    (["alpasim.image_format=bmp"], "unknown alpasim.image_format 'bmp'; choose one of: jpeg, png"),
    (["alpasim.idle_timeout_s=0"], "alpasim.idle_timeout_s must be a number above 0 and at most 604800"),
    (["alpasim.idle_timeout_s=inf"], "alpasim.idle_timeout_s must be a finite number above 0"),
    (["alpasim.host=0.0.0.0"], "alpasim.host=0.0.0.0 is reachable beyond this machine, so a token is required"),
    (["alpasim.host=0.0.0.0", "alpasim.token=short"], "alpasim.token must be 8 to 256 letters"),
    (["num_context=3"], "AlpaSim sends one initial frame per camera"),
    (["alpasim=null"], "alpasim must be a block of settings (host, idle_timeout_s, "),
    (["alpasim.token=1234567890"], "alpasim.token was read as a number, not as text"),
    (["+alpasim.colour=red"], "unknown setting 'alpasim.colour'"),
])
def test_bad_settings_exit_2_with_one_line(tmp_path, overrides, message):
    result = subprocess.run([str(COMMAND), *overrides], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                            timeout=120)
    one_error_line(result, "terra-alpasim", message)


def test_a_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run([str(COMMAND), f"alpasim.port={port}"], cwd=tmp_path, env=ENV, capture_output=True,
                                text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"terra-alpasim: error: cannot listen on 127.0.0.1:{port} (Address already in use); stop the program that "
        "uses the port or choose "
        "another alpasim.port / alpasim.host"], result.stderr


def test_the_demo_model_serves_alpasim_and_stops_on_sigterm(tmp_path):
    port = free_port()
    log = tmp_path / "terra-alpasim.log"
    with log.open("w") as out:
        process = subprocess.Popen([str(COMMAND), "backend=hf", "device=cpu", f"alpasim.port={port}"], cwd=tmp_path,
                                   env=ENV, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while "ready; WorldModelService on 127.0.0.1:" not in log.read_text():
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        runtime = FakeRuntime(f"127.0.0.1:{port}")
        assert "demo, one camera at 144x256, 10 fps" in runtime.version().version_id
        session = runtime.start()
        frames = runtime.chunk(session, trajectory(straight(), range(1, 6))).camera_outputs[0].rgb_frames
        runtime.close(session)
        assert [f.format for f in frames] == [pb.JPEG] * 5
        assert {Image.open(io.BytesIO(f.data)).size for f in frames} == {(256, 144)}
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 128 + signal.SIGTERM
        assert log.read_text().strip().splitlines()[-1] == "terra-alpasim: interrupted by SIGTERM"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
