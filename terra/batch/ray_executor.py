"""``executor=ray``: one actor per GPU (or ``tensor_parallel_size`` group) streaming samples; the driver alone
writes the manifest and retries samples of actors that die. Ray is imported only here and in the actor.
"""

from __future__ import annotations

import secrets
import sys
import time
from collections import deque
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from terra.batch.config import BatchSpec
from terra.batch.manifest import sample_record
from terra.batch.plan import Item
from terra.batch.stream import longest_rollout
from terra.config.ray_settings import RaySettings
from terra.core.ray_cluster import RayCluster, cause, start_failure
from terra.core.errors import TerraInputError
from terra.models import LlamaActionConfig

POLL_S = 1.0  # how often the driver asks each actor for its frames so far (the frame bar)
WAIT_NOTICE_S = 300.0  # say so once when no actor has started after this long


class RayExecutor:
    """Runs planned samples on Ray actors; made (it joins the cluster) before any output is written."""

    def __init__(self, config: BatchSpec) -> None:
        self.config = config
        tp = int(dict(config.run.backend_options).get("tensor_parallel_size", 1) or 1)
        self.cluster = RayCluster(config.ray, str(config.run.device), tp)
        self.cluster.connect()  # sizes the actors; a user error is one line

    def close(self) -> None:
        """Leave the cluster if this run joined it (a local cluster it started stops)."""
        self.cluster.close()

    def run(self, items: Sequence[Item], model_config: LlamaActionConfig, emit: Callable[[dict], None],
            on_frames: Callable[[int, int], None] | None = None) -> None:
        """Run ``items`` on the actors; ``emit`` gets one record per item, ``on_frames`` polled frame counts."""
        from terra.batch.ray_actor import RolloutActor  # imports Ray

        ray = self.cluster.ray
        token = secrets.token_hex(4)
        remote = ray.remote(**self.cluster.options)(RolloutActor)
        actors = [remote.options(name=f"terra-batch-{token}-{a}").remote(self.config, model_config,
                                                                         longest_rollout(items))
                  for a in range(self.cluster.count)]
        try:
            _Dispatcher(ray, actors, self.cluster.settings, emit, on_frames).run(items)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)


class _Dispatcher:
    """The driver's loop: samples out to actors with room, records back, deaths retried."""

    def __init__(self, ray: Any, actors: list, settings: RaySettings, emit: Callable[[dict], None],
                 on_frames: Callable[[int, int], None] | None = None) -> None:
        self.ray, self.actors, self.settings, self.emit = ray, actors, settings, emit
        self.on_frames = on_frames  # None: no progress polls
        self.polls: dict[Any, int] = {}  # progress() call → its actor
        self.polled = [0.0] * len(actors)  # when each actor was last asked
        self.infos: list[dict | None] = [None] * len(actors)  # from info(); None until the actor is up
        self.usable: set[int] = set()  # actors taking samples
        self.starting = set(range(len(actors)))  # actors whose first info() has not answered yet
        self.load = [0] * len(actors)  # samples given to each actor and not yet generated
        self.calls: dict[Any, tuple[Item, int]] = {}  # run() call → its item and actor
        self.records: dict[Any, tuple[Item, int]] = {}  # record() call → its item and actor
        self.pings: dict[Any, tuple[int, bool]] = {}  # info() call → its actor, and whether it is the first start
        self.attempts: dict[int, int] = {}  # sample index → runs that ended with the actor's death
        self.last_death = ""

    def run(self, items: Sequence[Item]) -> None:
        queue = deque(items)
        for a, actor in enumerate(self.actors):
            self.pings[actor.info.remote()] = (a, True)
        started, noticed = time.monotonic(), False
        while queue or self.calls or self.records:
            self._hand_out(queue)
            if not (self.usable or self.pings or self.calls or self.records):  # every actor is gone for good
                for item in queue:
                    self._fail(item, f"no Ray actor left to run it; the last one died: {self.last_death}")
                return
            self._poll_progress()
            ready, _ = self.ray.wait([*self.calls, *self.records, *self.pings, *self.polls], num_returns=1,
                                     timeout=1.0)
            for ref in ready:
                if ref in self.pings:
                    self._actor_up(ref, *self.pings.pop(ref))
                elif ref in self.polls:
                    self._progress(ref)
                elif ref in self.calls:
                    self._generated(ref, queue)
                else:
                    self._written(ref, queue)
            if not noticed and not any(self.infos) and time.monotonic() - started > WAIT_NOTICE_S:
                noticed = True
                tqdm.write(f"terra-rollout: no Ray actor has started after {WAIT_NOTICE_S:.0f} s (models loading, or "
                           "the cluster lacks free resources: `ray status` shows them)", file=sys.stderr)

    def _poll_progress(self) -> None:
        """Ask each working actor for its samples' frames so far, at most every :data:`POLL_S` seconds."""
        if self.on_frames is None:
            return
        asked = set(self.polls.values())
        now = time.monotonic()
        for a in self.usable:
            if a not in asked and self.load[a] and now - self.polled[a] >= POLL_S:
                self.polled[a] = now
                self.polls[self.actors[a].progress.remote()] = a

    def _progress(self, ref: Any) -> None:
        """A progress() call returned: report each sample's frames."""
        self.polls.pop(ref)
        try:
            frames = self.ray.get(ref)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.RayTaskError):
            return
        for index, count in frames.items():
            self.on_frames(index, count)

    def _room(self, a: int) -> int:
        """Samples actor ``a`` may hold ungenerated: its engine's rollouts, plus read-ahead once all actors started."""
        info = self.infos[a]
        return info["max_concurrent"] if self.starting else info["depth"]

    def _hand_out(self, queue: deque) -> None:
        """Give queued samples to the usable actors with room, least loaded first, one at a time."""
        while queue:
            room = [a for a in self.usable if self.load[a] < self._room(a)]
            if not room:
                return
            a = min(room, key=lambda k: self.load[k])
            item = queue.popleft()
            self.calls[self.actors[a].run.remote(item)] = (item, a)
            self.load[a] += 1

    def _actor_up(self, ref: Any, a: int, first: bool) -> None:
        """An info() call returned: the actor (re)started, or could not."""
        try:
            info = self.ray.get(ref)
        except self.ray.exceptions.RayActorError as err:
            if first:
                raise start_failure(err) from None
            self.last_death = cause(err)
            tqdm.write(f"terra-rollout: Ray actor {a} is gone ({self.last_death}); going on without it",
                       file=sys.stderr)
            return
        if info["error"] is not None:
            if first:
                raise TerraInputError(f"Ray actor {a} on {info['node']} could not start: {info['error']}")
            tqdm.write(f"terra-rollout: Ray actor {a} did not come back ({info['error']}); going on without it",
                       file=sys.stderr)
            self.ray.kill(self.actors[a], no_restart=True)  # it holds its GPU(s) for nothing
            return
        self.infos[a] = info
        self.usable.add(a)
        self.starting.discard(a)
        where = f"GPU {','.join(info['gpus'])}" if info["gpus"] else "CPU"
        tqdm.write(f"terra-rollout: Ray actor {a} on {info['node']} ({where}) {'started' if first else 'is back'}: "
                   f"{info['max_concurrent']} rollouts at once", file=sys.stderr)

    def _generated(self, ref: Any, queue: deque) -> None:
        """A run() call ended: the sample left its actor's engine; ask for its record (or retry on a death)."""
        item, a = self.calls.pop(ref)
        self.load[a] -= 1
        if self._answer(ref, item, a, queue) is not None:
            self.records[self.actors[a].record.remote(item.sample.index)] = (item, a)

    def _written(self, ref: Any, queue: deque) -> None:
        """A record() call ended: emit the sample's record (or retry when its actor died or restarted meanwhile)."""
        item, a = self.records.pop(ref)
        answer = self._answer(ref, item, a, queue)
        if answer is None:
            return
        record = answer[0]
        if record is None:  # the actor restarted after generating it: the rollout went with the old process
            self._retry(item, queue, "it restarted before writing the sample")
            return
        tries, info = self.attempts.get(item.sample.index, 0), self.infos[a]
        self.emit({**record, "actor": a, "node": info["node"], "gpus": ",".join(info["gpus"]) or "cpu",
                   **({"attempts": tries + 1} if tries else {})})

    def _answer(self, ref: Any, item: Item, a: int, queue: deque) -> tuple[Any] | None:
        """``(value,)`` of a finished call; None once a failure is handled (dead actor: retry; actor error: fail)."""
        try:
            return (self.ray.get(ref),)
        except self.ray.exceptions.RayActorError as err:  # died, or unreachable (ActorUnavailableError)
            self._actor_lost(a, err)
            self._retry(item, queue, cause(err))
        except self.ray.exceptions.RayTaskError as err:  # the actor's own error, not a death: no retry
            self._fail(item, f"Ray actor {a}: {cause(err)}")
        return None

    def _retry(self, item: Item, queue: deque, cause: str) -> None:
        """Queue ``item`` again after its actor lost it, unless it has used up ``ray.max_retries``."""
        tries = self.attempts[item.sample.index] = self.attempts.get(item.sample.index, 0) + 1
        if tries > self.settings.max_retries:
            self._fail(item, f"its Ray actor died {tries} times while running it: {cause}")
        else:
            if self.on_frames is not None:
                self.on_frames(item.sample.index, 0)  # its frames went with the actor
            queue.appendleft(item)

    def _actor_lost(self, a: int, err: Exception) -> None:
        """Stop handing ``a`` samples until Ray has restarted it (an info() call answers then)."""
        self.last_death = cause(err)
        if a in self.usable:
            self.usable.discard(a)
            tqdm.write(f"terra-rollout: Ray actor {a} on {self.infos[a]['node']} died ({self.last_death}); its "
                       "unfinished samples go back to the queue", file=sys.stderr)
            self.pings[self.actors[a].info.remote()] = (a, False)

    def _fail(self, item: Item, error: str) -> None:
        self.emit(sample_record(item.sample, "failed", error=error, stage="generate", seed=item.seed,
                                attempts=self.attempts.get(item.sample.index, 0)))
