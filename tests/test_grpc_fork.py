"""A process that has served gRPC forks children with no gRPC thread in them: imageio's ffmpeg reader forks
(tokenizer/images.py), and a gRPC poller thread restarted between fork and exec logs into the child's stderr pipe
and can hang it (terra/__init__.py). Each case runs in a fresh interpreter, since grpc reads the setting once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("grpc")

CHILD_THREADS = """
import os
import terra  # noqa: F401  (sets gRPC's fork support before grpc loads)
from concurrent.futures import ThreadPoolExecutor
import grpc

server = grpc.server(ThreadPoolExecutor(max_workers=2))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
    try:
        channel.unary_unary("/terra.Test/Nothing")(b"", timeout=10)
    except grpc.RpcError as err:
        assert err.code() == grpc.StatusCode.UNIMPLEMENTED, err
server.stop(0).wait()
read, write = os.pipe()
pid = os.fork()
if pid == 0:
    import time
    deadline = time.monotonic() + 0.5  # a restarted poller starts at once; give it the time to show
    while time.monotonic() < deadline and len(os.listdir("/proc/self/task")) == 1:
        time.sleep(0.01)
    os.write(write, str(len(os.listdir("/proc/self/task"))).encode())
    os._exit(0)
os.close(write)
print(os.read(read, 16).decode())
os.waitpid(pid, 0)
"""


def child_threads(fork_support: str | None) -> int:
    env = {key: value for key, value in os.environ.items() if key != "GRPC_ENABLE_FORK_SUPPORT"}
    if fork_support is not None:
        env["GRPC_ENABLE_FORK_SUPPORT"] = fork_support
    done = subprocess.run([sys.executable, "-c", CHILD_THREADS], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.strip())


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts a child's threads in /proc")
def test_a_forked_child_of_a_grpc_process_runs_no_grpc_thread():
    assert child_threads(None) == 1
    assert child_threads("true") > 1  # the control: gRPC's fork support, asked for, restarts its thread in the child
