"""vLLM's streaming-input request path against the per-frame path, on vLLM's engine (the CPU build in CI).

Two session-wide engines of one model (conftest.py): ``vllm_backend`` sends a request per frame,
``vllm_streaming_backend`` one streaming request per rollout window. Same seeds must give the same codes.
"""

from __future__ import annotations

import numpy as np
import pytest

from terra.config.backend import check_backend
from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.rollout import RolloutRequest
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.session import SessionHost
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import VLLM_BLOCK_SIZE
from tests.session.test_sessions import rollout_inputs

pytestmark = pytest.mark.vllm

GREEDY = SamplingConfig(temperature=0)
SAMPLED = SamplingConfig(temperature=1.0, top_k=50, top_p=0.95)


def requests_of_lengths(layout, lengths: list[int], num_context: int = 2, seed: int = 0) -> list[RolloutRequest]:
    """One rollout per length, sharing a context, each with its own random actions and seed."""
    rng = np.random.default_rng(seed)
    context = rng.integers(0, layout.codebook_size, (num_context, layout.image_tokens))
    shape = (num_context + max(lengths) - 1, layout.action_tokens, 3)
    return [RolloutRequest(context, rng.normal(0, 2, shape).astype(np.float32), n, seed=10 + i)
            for i, n in enumerate(lengths)]


def drain(backend) -> None:
    """Poll until no frame is queued."""
    while backend.num_queued:
        backend.poll()


def finish_one_by_one(backend, states) -> None:
    """Run each state to its end, a frame at a time, then release it."""
    for state in states:
        while not state.finished:
            backend.submit(state, SAMPLED)
            drain(backend)
        backend.release(state)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_streaming_gives_the_per_frame_codes(vllm_backend, vllm_streaming_backend, sampling):
    """Rollouts of different lengths in one batch, the longest past a window rollover (6 frames, overlap 3)."""
    layout = vllm_streaming_backend.layout
    lengths = [8, 2, 5]
    requests = requests_of_lengths(layout, lengths, seed=1)
    start = len(vllm_streaming_backend.frame_stats)
    ours = vllm_streaming_backend.generate(requests, sampling, progress=False)
    stats = vllm_streaming_backend.frame_stats[start:]
    want = vllm_backend.generate(requests, sampling, progress=False)
    for got, expected, n in zip(ours, want, lengths):
        assert got.shape == (n, layout.image_tokens)
        np.testing.assert_array_equal(got, expected)
    assert all(int(o.max()) < layout.codebook_size for o in ours)
    if sampling is SAMPLED:  # seeds matter: another seed samples other codes
        other = vllm_streaming_backend.generate([RolloutRequest(requests[1].context, requests[1].actions, 2,
                                                                seed=99)], sampling, progress=False)[0]
        assert not np.array_equal(other, ours[1])

    assert len(stats) == sum(lengths)
    # a stream's codes reach the loop thread a frame at a time (the chunk's end flushes them), not one by one
    assert vllm_streaming_backend.engine.vllm_config.scheduler_config.stream_interval == layout.image_tokens
    windows = [len(vllm_streaming_backend.start(r).windows) for r in requests]
    assert windows == [3, 1, 2] and sum(s.window_start for s in stats) == sum(windows)  # a request per window
    for s in stats:
        assert s.prompt_tokens % layout.frame_span == 0
        if not s.window_start:  # the window so far, all of it kept in the stream but the new chunk
            assert s.computed_tokens == 1 + layout.action_tokens, s


def test_a_rollover_of_every_rollout_at_once_larger_than_a_step(vllm_backend, vllm_streaming_backend):
    """8 seeded rollouts whose windows roll over together: 8 window prompts (3,312 positions) against the engines'
    budget of 1,024 a step. vLLM's CPU runner cannot split a seeded prompt (vllm_backend.py, cpu_whole_prompts);
    the prompts go whole into successive steps, and both request paths still give the same codes."""
    layout = vllm_streaming_backend.layout
    assert 8 * layout.window_positions > vllm_backend.engine.vllm_config.scheduler_config.max_num_batched_tokens
    requests = requests_of_lengths(layout, [5] * 8, seed=4)
    ours = vllm_streaming_backend.generate(requests, SAMPLED, progress=False)
    want = vllm_backend.generate(requests, SAMPLED, progress=False)
    assert [len(vllm_backend.start(r).windows) for r in requests] == [2] * 8
    for got, expected in zip(ours, want):
        np.testing.assert_array_equal(got, expected)
    assert len({o.tobytes() for o in ours}) == 8  # each its own seed and actions


def test_cancel_and_release_leave_the_engine_usable(vllm_backend, vllm_streaming_backend):
    backend = vllm_streaming_backend
    requests = requests_of_lengths(backend.layout, [4, 4], seed=2)
    want = vllm_backend.generate(requests, SAMPLED, progress=False)
    states = [backend.start(r, i) for i, r in enumerate(requests)]
    for state in states:  # one frame each: both streams open
        backend.submit(state, SAMPLED)
    drain(backend)
    for state in states:
        backend.submit(state, SAMPLED)
    backend.cancel(states[:1])  # aborts its stream mid-frame; the state stays at frame 1
    assert states[0].cache is None and backend.num_queued == 1
    drain(backend)
    backend.release(states[1])  # closes its stream; the next frame opens a new request
    finish_one_by_one(backend, states)
    for state, expected in zip(states, want):
        np.testing.assert_array_equal(state.generated(), expected)
    np.testing.assert_array_equal(backend.generate(requests, SAMPLED, progress=False)[0], want[0])


def test_idle_streams_make_room_for_new_ones(vllm_backend, vllm_streaming_backend):
    """vLLM counts a paused stream against max_num_seqs: one more stream closes the least recently used idle one."""
    backend = vllm_streaming_backend
    requests = requests_of_lengths(backend.layout, [3] * (backend.max_num_seqs + 1), seed=4)
    want = vllm_backend.generate(requests, SAMPLED, progress=False)
    assert not backend._open  # nothing left open by earlier tests
    states = [backend.start(r, i) for i, r in enumerate(requests)]
    for state in states:  # one frame each, one after the other: the first stream is the least recently used
        backend.submit(state, SAMPLED)
        drain(backend)
    assert states[0].cache is None and all(s.cache is not None for s in states[1:])
    assert len(backend._open) == backend.max_num_seqs
    finish_one_by_one(backend, states)
    assert not backend._open
    for state, expected in zip(states, want):
        np.testing.assert_array_equal(state.generated(), expected)


def test_a_streaming_error_reaches_poll_and_the_engine_goes_on(vllm_streaming_backend):
    backend = vllm_streaming_backend
    request = requests_of_lengths(backend.layout, [2], seed=3)[0]
    state = backend.start(request)
    original = backend.frame_prompt
    backend.frame_prompt = lambda s: {**original(s), "multi_modal_data": {"actions": s.actions[:1]}}  # 1 item, 2 frames
    try:
        backend.submit(state, GREEDY)
        with pytest.raises(ValueError, match="the prompt has 2 frames of slots but 1 'actions' items"):
            drain(backend)
    finally:
        del backend.frame_prompt
    assert backend.num_queued == 0 and state.cache is None
    assert backend.generate([request], GREEDY, progress=False)[0].shape == (2, backend.layout.image_tokens)


def test_closed_loop_session_equals_the_batch_rollout(vllm_backend, vllm_streaming_backend):
    """A session through a window rollover and a fork (no open stream: a new request) on the streaming backend."""
    layout = vllm_streaming_backend.layout
    num_frames = 7
    context, actions = rollout_inputs(layout, 2, num_frames, seed=40)
    want = vllm_backend.generate([RolloutRequest(context, actions, num_frames, seed=5)], SAMPLED, progress=False)[0]
    host = SessionHost(WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), vllm_streaming_backend), SAMPLED, max_frames=10)
    try:
        session = host.open(codes=context, actions=actions[:1], seed=5)
        got = [session.step(a, decode=False).codes for a in actions[1:3]]
        twin = session.fork()  # mid-window: its prompt is the session's first chunk and two continuation chunks
        first = twin.step_async(actions[3]).result(timeout=120)
        assert first.prompt_tokens - first.cached_tokens <= VLLM_BLOCK_SIZE + layout.action_tokens  # hashes agree
        got += [session.step(a, decode=False).codes for a in actions[3:]]
        twin_codes = [first.codes.reshape(-1)] + [twin.step(a, decode=False).codes.reshape(-1) for a in actions[4:]]
        np.testing.assert_array_equal(np.stack(got).reshape(num_frames, -1), want)
        np.testing.assert_array_equal(np.stack(twin_codes).reshape(num_frames - 2, -1), want[2:])
        for each in (session, twin):  # releases their streams
            each.close()
        assert not vllm_streaming_backend._open
    finally:
        host.close()


def test_the_request_path_is_chosen_once_at_the_edge(monkeypatch):
    from terra.vllm import compat

    assert check_backend("vllm", {"requests": "per_frame"})[1] == {"requests": "per_frame"}
    with pytest.raises(TerraInputError, match="backend.options.requests"):
        check_backend("vllm", {"requests": "chunked"})
    assert compat.request_path("per_frame") == "per_frame"
    assert compat.request_path("auto") == ("streaming" if compat.has_streaming_input() else "per_frame")
    monkeypatch.setattr(compat, "has_streaming_input", lambda: False)
    assert compat.request_path("auto") == "per_frame"
    with pytest.raises(TerraInputError, match="requests=per_frame"):
        compat.request_path("streaming")
