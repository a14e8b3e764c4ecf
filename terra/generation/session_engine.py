"""Sessions: many open-ended rollouts on one backend, each stepped one action at a time, from one driver thread."""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.rollout import (
    DEFAULT_OVERLAP, FrameDone, PassStats, RolloutRequest, RolloutState, WorldModelBackend,
)
from terra.contract.routes import no_route

RATE_WINDOW_S = 10.0  # frames/s is measured over this many seconds


@dataclass
class StepResult:
    index: int  # frames generated before it since the last reset (0 = first after the context)
    codes: np.ndarray  # [P]
    action: np.ndarray  # [6, 3] that conditioned it
    queue_s: float  # waiting before the backend took it
    generate_s: float  # in the backend
    cached_tokens: int
    prompt_tokens: int
    passes: int  # forward passes that generated it (sequential decoding: one per image token)


class Rollout:
    """One open-ended rollout in a :class:`SessionEngine`; its state is only touched by the driver thread."""

    def __init__(self, state: RolloutState) -> None:
        self.state = state
        self.request = state.request
        self.busy = False  # a step is in the backend
        self.closed = False
        self.waiting: deque[_Job] = deque()
        self.current: _Job | None = None

    def codes(self) -> np.ndarray:
        """Every frame's codes so far ``[n + generated, P]``, context first."""
        return np.stack(self.state.frames)


@dataclass
class _Job:
    kind: str  # step | fork | reset | close
    rollout: Rollout
    future: Future = field(default_factory=Future)
    actions: np.ndarray | None = None  # [n, 6, 3] of the next n frames
    routes: list | None = None  # their routes, for a model with route slots (None in it: no route)
    sampling: SamplingConfig | None = None
    single: bool = True  # the future resolves to one StepResult, else to the list of them
    results: list = field(default_factory=list)
    queued_at: float = field(default_factory=time.perf_counter)
    started_at: float = 0.0


class SessionEngine:
    """Runs :class:`Rollout` jobs on ``backend`` from one driver thread."""

    def __init__(self, backend: WorldModelBackend) -> None:
        self.backend = backend
        self._inbox: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._owner: dict[int, Rollout] = {}  # id(state) of a rollout with a step in the backend
        self._count = itertools.count(1)  # numbers the rollouts opened
        self._lock = threading.Lock()  # guards the counters read by metrics()
        self._done_at: deque[float] = deque(maxlen=100_000)
        self.frames_total = 0
        self.cached_tokens = 0
        self.prompt_tokens = 0
        self.pass_stats = PassStats()  # forward passes of every frame generated
        self.last_error: str | None = None
        self._waiting = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="terra-session-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side (any thread)

    def open(self, codes: np.ndarray, actions: np.ndarray, max_frames: int, seed: int | None = None,
             overlap: int = DEFAULT_OVERLAP, routes: np.ndarray | None = None) -> Rollout:
        """A new session's rollout from context ``codes`` ``[n, h, w]`` and the ``n - 1`` ``actions`` between them."""
        n = len(codes)
        room = np.zeros((n + max_frames - 1, 6, 3), dtype=np.float32)
        room[: n - 1] = actions
        if routes is not None:  # the steps' routes come with them
            routes = np.concatenate([routes, no_route(max_frames, routes.shape[1])])
        request = RolloutRequest(codes, room, max_frames, seed=seed, overlap=overlap, routes=routes)
        return Rollout(self.backend.start(request, next(self._count)))

    def step(self, rollout: Rollout, action: np.ndarray, sampling: SamplingConfig,
             route: np.ndarray | None = None) -> Future:
        """Generate ``rollout``'s next frame under ``action`` (and ``route`` ``[K, 3]``; None: no route)."""
        return self._put(_Job("step", rollout, actions=action[None], routes=[route], sampling=sampling))

    def steps(self, rollout: Rollout, actions: np.ndarray, sampling: SamplingConfig,
              routes: list | None = None) -> Future:
        """Generate ``rollout``'s next ``len(actions)`` frames, as one request where the backend can."""
        routes = [None] * len(actions) if routes is None else list(routes)
        return self._put(_Job("step", rollout, actions=actions, routes=routes, sampling=sampling, single=False))

    def fork(self, rollout: Rollout) -> Future:
        """A second :class:`Rollout` continuing from ``rollout`` after its queued steps."""
        return self._put(_Job("fork", rollout))

    def reset(self, rollout: Rollout) -> Future:
        """Back to the context frames, with the same seed (the same actions then give the same frames)."""
        return self._put(_Job("reset", rollout))

    def close_rollout(self, rollout: Rollout) -> Future:
        """Free the rollout after its queued jobs; later jobs fail."""
        return self._put(_Job("close", rollout))

    def metrics(self) -> dict[str, Any]:
        """Frames generated, frames/s over the last :data:`RATE_WINDOW_S`, queued and in-flight frames."""
        now = time.perf_counter()
        with self._lock:
            recent = sum(1 for t in self._done_at if now - t <= RATE_WINDOW_S)
            return {
                "frames_total": self.frames_total,
                "frames_per_s": recent / RATE_WINDOW_S,
                "queued": self._waiting,
                "in_flight": len(self._owner),
                "prefix_cache_hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None,
                "passes_per_frame": self.pass_stats.passes_per_frame,
                "tokens_per_pass": self.pass_stats.tokens_per_pass,
                "last_error": self.last_error,
            }

    def close(self) -> None:
        """Stop the driver thread; queued and in-flight jobs fail. The backend stays open."""
        if not self._closed:
            self._closed = True
            self._inbox.put(None)
            self._thread.join(timeout=60)

    def _put(self, job: _Job) -> Future:
        if self._closed:
            raise TerraInputError("the session engine is shut down")
        with self._lock:
            self._waiting += 1
        self._inbox.put(job)
        return job.future

    # ------------------------------------------------------------------ driver thread

    def _run(self) -> None:
        while True:
            jobs = [self._inbox.get()] if not self.backend.num_queued else []
            while not self._inbox.empty():  # this thread is its only reader
                jobs.append(self._inbox.get_nowait())
            if any(job is None for job in jobs):
                return self._fail_all(jobs)
            for job in jobs:
                self._dispatch(job)
            if self.backend.num_queued:
                try:
                    finished = self.backend.poll()
                except Exception as err:  # noqa: BLE001  (the engine stays up; the frames in flight fail)
                    self.last_error = f"{type(err).__name__}: {err}"
                    self._fail_in_flight(err)
                    continue
                for done in finished:
                    self._finish(done)

    def _dispatch(self, job: _Job) -> None:
        rollout = job.rollout
        if rollout.busy or rollout.waiting:
            rollout.waiting.append(job)  # still counted as waiting
        else:
            self._execute(job)

    def _execute(self, job: _Job) -> None:
        """Run a job of an idle rollout; a step goes to the backend, the others complete at once."""
        with self._lock:
            self._waiting -= 1
        if not job.future.set_running_or_notify_cancel():
            return
        rollout = job.rollout
        try:
            if rollout.closed:
                raise TerraInputError("the session is closed")
            if job.kind == "step":
                state = rollout.state
                left = state.request.num_frames - state.num_generated
                if left < len(job.actions):
                    raise TerraInputError(f"the session has reached its limit of {state.request.num_frames} frames "
                                          f"({left} left, {len(job.actions)} asked); reset it or open a new one")
                state.set_next_actions(job.actions)
                if state.layout.route_model:
                    state.set_next_routes(job.routes)
                job.started_at = time.perf_counter()
                self.backend.submit(state, job.sampling, frames=len(job.actions))
                rollout.busy, rollout.current = True, job
                self._owner[id(state)] = rollout
                return
            if job.kind == "fork":
                result: Any = Rollout(self.backend.fork(rollout.state))
            elif job.kind == "reset":
                self.backend.release(rollout.state)
                rollout.state = RolloutState(rollout.request, rollout.state.layout, rollout.state.seed)
                result = None
            else:
                self.backend.release(rollout.state)
                rollout.closed, result = True, None
            job.future.set_result(result)
        except Exception as err:  # noqa: BLE001  (reported to the caller through its future)
            job.future.set_exception(err)

    def _finish(self, done: FrameDone) -> None:
        rollout = self._owner[id(done.state)]
        job = rollout.current
        now = time.perf_counter()
        state = done.state
        with self._lock:
            self.frames_total += 1
            self._done_at.append(now)
            self.cached_tokens += done.cached_tokens
            self.prompt_tokens += done.prompt_tokens
            self.pass_stats += PassStats(1, state.passes[-1], state.layout.image_tokens)
        job.results.append(StepResult(
            index=state.next_frame - 1 - state.num_context, codes=done.codes,
            action=state.actions[state.next_frame - 2].copy(), queue_s=job.started_at - job.queued_at,
            generate_s=now - job.started_at, cached_tokens=done.cached_tokens, prompt_tokens=done.prompt_tokens,
            passes=state.passes[-1],
        ))
        if not done.last:
            return
        del self._owner[id(done.state)]
        rollout.busy, rollout.current = False, None
        job.future.set_result(job.results[0] if job.single else job.results)
        self._drain(rollout)

    def _drain(self, rollout: Rollout) -> None:
        """Run the rollout's waiting jobs until one is a step in the backend."""
        while rollout.waiting and not rollout.busy:
            self._execute(rollout.waiting.popleft())

    def _fail_in_flight(self, err: Exception) -> None:
        rollouts = list(self._owner.values())
        self.backend.cancel([r.state for r in rollouts])
        self._owner.clear()
        for rollout in rollouts:
            job, rollout.busy, rollout.current = rollout.current, False, None
            job.future.set_exception(err)
            self._drain(rollout)

    def _fail_all(self, jobs: list[_Job | None]) -> None:
        error = TerraInputError("the session engine is shut down")
        self.backend.cancel([r.state for r in self._owner.values()])
        pending = [j for j in jobs if j is not None]
        for rollout in self._owner.values():
            pending += [rollout.current, *rollout.waiting]
        for job in pending:
            if not job.future.done():
                job.future.set_exception(error)
