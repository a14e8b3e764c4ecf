"""terra-alpasim on vLLM's engine (the CPU build in CI; the session-wide ``vllm_backend`` of conftest.py): AlpaSim
rollouts at once are batched by the engine, and each gets the frames a direct session gets on it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("carla_driver_interface")

from terra.alpasim.service import WorldModelServicer, bind, start  # noqa: E402
from terra.alpasim.sessions import SessionTable  # noqa: E402
from terra.models.presets import TINY_TOKENIZER  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.tokenizer.lfq import LFQTokenizer  # noqa: E402
from terra.alpasim.client import curve, straight, trajectory  # noqa: E402
from tests.alpasim.fake_runtime import CHUNKS, FakeRuntime, jpeg  # noqa: E402
from tests.alpasim.test_server import SAMPLING, SETTINGS, direct  # noqa: E402

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def served(vllm_backend):
    table = SessionTable(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), vllm_backend), SETTINGS, SAMPLING)
    server, port = bind(SETTINGS)
    start(server, WorldModelServicer(table, "tiny"))
    yield table, FakeRuntime(f"127.0.0.1:{port}")
    server.stop(1).wait()
    table.shutdown()  # the engine's thread ends; the backend stays for the session's other tests


def test_rollouts_at_once_get_their_direct_sessions_frames(served):
    table, runtime = served
    paths = {"straight": straight(), "left": curve(rate=0.3), "right": curve(rate=-0.2, speed=11.0)}
    sessions = {name: runtime.start(seed=40 + i) for i, name in enumerate(paths)}
    kept: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def run(name: str) -> None:
        session, first = sessions[name], 1
        for size in CHUNKS:
            runtime.chunk(session, trajectory(paths[name], range(first, first + size)))
            first += size
        rollout = table.get(session.session_id).rollout
        kept[name] = rollout.state.actions[:13].copy(), rollout.codes()
        runtime.close(session)

    threads = [threading.Thread(target=run, args=(name,)) for name in paths]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    assert set(kept) == set(paths)
    for i, name in enumerate(paths):
        actions, codes = kept[name]
        np.testing.assert_array_equal(codes, direct(table, jpeg(), actions, seed=40 + i), err_msg=name)
