"""vLLM with streaming-input requests: one engine request per rollout window, fed a frame at a time."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.generation.rollout import FrameDone, RolloutState
from terra.generation.vllm_backend import VLLMBackend

POLL_WAIT_S = 0.05  # poll() returns empty-handed after this long, so a driver can take in new work meanwhile
CALL_TIMEOUT_S = 600.0  # for work handed to the loop thread (engine start-up, aborts, shutdown)


@dataclass(eq=False)
class _Stream:
    """One open streaming request: the current window of one rollout (kept in its state's ``cache``)."""

    request_id: str
    inputs: asyncio.Queue | None = None  # StreamingInput chunks, then None (loop thread only)
    task: asyncio.Task | None = None  # runs generate() (loop thread only)
    codes: list[int] = field(default_factory=list)  # sampled codes not yet handed over (loop thread only)
    closing: bool = False  # its input has ended (loop thread only)


class StreamingVLLMBackend(VLLMBackend):
    """:class:`VLLMBackend` (same arguments) on vLLM's asyncio engine with streaming-input requests."""

    name = "vLLM streaming"

    def _start_engine(self, engine_args: dict[str, Any]) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from terra.vllm import compat

        self._done: queue.SimpleQueue = queue.SimpleQueue()  # (request id, codes | None, cached, error | None)
        self._error: BaseException | None = None
        self._streams: set[_Stream] = set()  # running generate(), loop thread only
        self._open: OrderedDict[str, RolloutState] = OrderedDict()  # request id -> state, least recently used first
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="terra-vllm-streaming", daemon=True)
        self._thread.start()
        # As vllm.LLM, and a stream's tokens handed over once a frame (vLLM's stream_interval: a chunk's end always
        # flushes), not one at a time: the loop thread wakes once per frame, not once per code.
        args = {"disable_log_stats": True, **compat.supported_engine_kwargs(stream_interval=self.layout.image_tokens),
                **engine_args}

        async def build() -> Any:  # on the loop: the engine's client binds to the loop it is created on
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

        try:
            self.engine = self._call(build())
        except BaseException:
            self._stop_loop()
            raise

    # ------------------------------------------------------------------ driver thread

    def _request(self, state: RolloutState, sampling: SamplingConfig, frames: int) -> int:
        from vllm.engine.protocol import StreamingInput

        params = self._sampling_params(sampling, state, delta=True)
        stream = state.cache
        window_tokens = (state.next_frame - state.window.start) * self.layout.frame_span
        if stream is None or state.window_starts:  # a new window, or a rollout without an open stream
            if stream is not None:
                self._end_stream(state)
            self._make_room()
            stream = state.cache = _Stream(f"terra-stream-{next(self._ids)}")
            prompt = self.frame_prompt(state)
            self._loop.call_soon_threadsafe(self._start, stream, StreamingInput(prompt, params), params)
            self._open[stream.request_id] = state
            self._pending[stream.request_id] = (state, window_tokens, True)
            return 1
        self._open.move_to_end(stream.request_id)
        layout, frame = self.layout, state.next_frame
        ids = [int(state.frames[-1][-1])] + [layout.slot_token_id] * layout.slot_tokens
        conditions = np.ascontiguousarray(state.conditions[frame - 1 : frame], dtype=np.float32)
        chunk = StreamingInput({"prompt_token_ids": ids, "multi_modal_data": {"actions": conditions}}, params)
        self._loop.call_soon_threadsafe(self._feed, stream, chunk)
        self._pending[stream.request_id] = (state, window_tokens, False)
        return 1

    def _poll(self) -> list[FrameDone]:
        """The frames finished so far; waits for one up to :data:`POLL_WAIT_S` when frames are queued."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if not self._pending:
            return []
        try:
            items = [self._done.get(timeout=POLL_WAIT_S)]
        except queue.Empty:
            return []
        while not self._done.empty():  # this thread is its only reader
            items.append(self._done.get_nowait())
        done = []
        for request_id, codes, cached, error in items:
            entry = self._pending.pop(request_id, None)
            if entry is None:  # a frame cancelled meanwhile
                continue
            state, prompt_tokens, window_start = entry
            if error is not None:
                self._end_stream(state, abort=True)
                self._error = self._error or error
                continue
            state.add_frame(codes)  # the stream stays open: a window's last frame closes it later
            if not window_start:  # all but this chunk's tokens were in the stream's KV
                cached = prompt_tokens - 1 - self.layout.slot_tokens
            done.append(FrameDone(state, codes, prompt_tokens, cached, window_start))
        if not done and self._error is not None:
            error, self._error = self._error, None
            raise error
        return done

    def _cancel(self, states: Sequence[RolloutState]) -> None:
        """Abort the requests of ``states``' queued frames (their streams end; a later frame opens a new one)."""
        for state in states:
            stream = state.cache
            if isinstance(stream, _Stream) and self._pending.pop(stream.request_id, None) is not None:
                self._end_stream(state, abort=True)

    def release(self, state: RolloutState) -> None:
        stream = state.cache
        if isinstance(stream, _Stream):
            self._end_stream(state, abort=self._pending.pop(stream.request_id, None) is not None)

    def close(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is None or loop.is_closed():
            return
        try:
            if self.engine is not None:
                self._call(self._shutdown())
        finally:
            self.engine = None
            self._pending.clear()
            self._open.clear()
            self._stop_loop()

    def _end_stream(self, state: RolloutState, abort: bool = False) -> None:
        """End the input of ``state``'s stream (vLLM frees its KV, full blocks stay cached), or ``abort`` it."""
        stream, state.cache = state.cache, None
        self._open.pop(stream.request_id, None)
        if abort:
            self._call(self._abort(stream))
        else:
            self._loop.call_soon_threadsafe(self._feed, stream, None)

    def _make_room(self) -> None:
        """Close the least recently used stream without a queued frame if one more would pass ``max_num_seqs``."""
        if len(self._open) >= self.max_num_seqs:
            idle = next((s for request_id, s in self._open.items() if request_id not in self._pending), None)
            if idle is not None:
                self._end_stream(idle)

    def _call(self, coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(CALL_TIMEOUT_S)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(CALL_TIMEOUT_S)
        if not self._thread.is_alive():
            self._loop.close()

    # ------------------------------------------------------------------ loop thread

    def _start(self, stream: _Stream, first: Any, params: Any) -> None:
        stream.inputs = asyncio.Queue()
        stream.inputs.put_nowait(first)
        stream.task = self._loop.create_task(self._run(stream, params))
        self._streams.add(stream)

    def _feed(self, stream: _Stream, chunk: Any) -> None:
        if stream.inputs is not None:
            stream.closing = chunk is None
            stream.inputs.put_nowait(chunk)

    async def _inputs(self, stream: _Stream):
        while (chunk := await stream.inputs.get()) is not None:
            yield chunk

    async def _run(self, stream: _Stream, params: Any) -> None:
        """Drive one streaming request; hand each frame's ``P`` codes to :meth:`poll` as they complete."""
        frame = self.layout.image_tokens
        try:
            async for output in self.engine.generate(self._inputs(stream), params, stream.request_id):
                stream.codes.extend(output.outputs[0].token_ids)
                if len(stream.codes) >= frame:
                    codes, stream.codes = np.asarray(stream.codes[:frame], dtype=np.int64), stream.codes[frame:]
                    self._done.put((stream.request_id, codes, self._cached_tokens(output), None))
            if not stream.closing:  # vLLM ended the request: a frame it owed fails rather than waits forever
                self._done.put((stream.request_id, None, 0, RuntimeError(f"vLLM ended {stream.request_id} early")))
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001  (raised by poll on the driver thread)
            self._done.put((stream.request_id, None, 0, err))
        finally:
            stream.inputs = None
            self._streams.discard(stream)

    async def _abort(self, stream: _Stream) -> None:
        """Cancel ``stream``'s generate() (which aborts its request in vLLM) and wait for it to end."""
        task = stream.task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _shutdown(self) -> None:
        from terra.vllm import compat

        for stream in list(self._streams):
            await self._abort(stream)
        compat.shutdown_engine(self.engine)
