"""``executor=ray``: the batch on a Ray cluster, one actor (terra/batch/ray_actor.py) per GPU or per group of
``tensor_parallel_size`` GPUs (on a cluster without GPUs, ``ray.num_actors`` CPU actors).

The driver joins the cluster at ``ray.address`` (or starts a local one for the run), starts the actors and
streams samples to them: each actor holds a few more samples not yet generated than its engine runs at once, and
gets the next one the moment a rollout leaves its engine (while that one is still being written), so a faster
actor takes more. Only the driver writes the manifest, from
the records the actors return: with the plan's resume and skip-if-complete, every sample is recorded exactly
once. An actor that dies is restarted by Ray (``ray.max_restarts``); its unfinished samples go back to the queue
for any live actor, at most ``ray.max_retries`` more times each, then they are recorded as failed with the
error. Ctrl-C (or SIGTERM) kills the actors and leaves a cluster this run started shut down; files are written
atomically, so a rerun resumes.

Ray is imported only here and in the actor's module, never by ``executor=local``.
"""

from __future__ import annotations

import logging
import re
import secrets
import socket
import sys
import time
from collections import deque
from typing import Any, Callable, Sequence

from tqdm.auto import tqdm

from terra.batch.config import BatchConfig
from terra.batch.manifest import sample_record
from terra.batch.plan import Item
from terra.batch.ray_settings import RaySettings
from terra.batch.stream import longest_rollout
from terra.core.errors import TerraInputError, error_line
from terra.models import LlamaActionConfig

POLL_S = 1.0  # how often the driver asks each actor for its frames so far (the frame bar)
WAIT_NOTICE_S = 300.0  # say so once when no actor has started after this long (vLLM starts in 1-2 min)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CAUSE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")
_HELP = "README.md, \"Running across nodes\""


class RayExecutor:
    """Runs planned samples on Ray actors; :meth:`connect` before any output is written, then :meth:`run`."""

    def __init__(self, config: BatchConfig) -> None:
        self.config = config
        self.settings = RaySettings.parse(config.ray)
        self.ray: Any = None
        self.joined = False  # this run called ray.init (and so calls ray.shutdown)
        self.count, self.options = 0, {}  # the actors: how many, their ray.remote options (set by connect)

    def connect(self) -> None:
        """Import Ray, join the cluster (or start a local one) and check that it has room for the actors; a missing
        Ray, an address where no cluster answers or too few GPUs/CPUs raise :class:`TerraInputError`. A process
        that already joined a cluster (a notebook, a test) keeps it."""
        self._join()
        try:
            self.count, self.options = self.actor_options()
        except BaseException:
            self.close()
            raise

    def _join(self) -> None:
        try:
            import ray
        except ImportError as err:
            raise TerraInputError(f"executor=ray needs Ray ({error_line(err)}): pip install 'terra-world-model[ray]' "
                                  "on this machine and every node, or use executor=local") from None
        self.ray = ray
        if ray.is_initialized():
            return
        address = self.settings.address
        if address not in (None, "auto", "local"):
            _check_reachable(address)
        options: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": self.settings.log_to_driver}
        if address in (None, "local"):  # a cluster of this machine, for this run
            options["include_dashboard"] = False
        try:
            ray.init(address=address, **options)
        except (ConnectionError, TimeoutError) as err:
            raise TerraInputError(f"ray.address={address}: no Ray cluster to join ({error_line(err)}); start one with "
                                  "`ray start --head`, or leave ray.address unset for a local one") from None
        self.joined = True

    def close(self) -> None:
        """Leave the cluster if this run joined it (a local cluster it started stops)."""
        if self.joined and self.ray is not None and self.ray.is_initialized():
            self.ray.shutdown()
        self.joined = False

    def actor_options(self) -> tuple[int, dict[str, Any]]:
        """How many actors, and their ``ray.remote`` options, for the cluster's resources and this run's settings."""
        ray, config, settings = self.ray, self.config, self.settings
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), float(resources.get("CPU", 0))
        tp = int(dict(config.backend_options).get("tensor_parallel_size", 1) or 1)
        on_gpus = str(config.device) != "cpu" and gpus > 0
        if str(config.device).startswith("cuda") and gpus == 0:
            raise TerraInputError(f"device={config.device} but the Ray cluster has no GPUs; use device=auto or cpu")
        if on_gpus:
            groups = gpus // tp
            count = settings.num_actors or groups
            if groups == 0 or count > groups:
                raise TerraInputError(f"{count or 1} actor(s) of tensor_parallel_size={tp} need {(count or 1) * tp} "
                                      f"GPU(s) but the Ray cluster has {gpus}; lower ray.num_actors")
        else:
            count = settings.num_actors or 1
            if count * settings.cpus_per_actor > cpus:
                raise TerraInputError(f"ray.num_actors={count} x ray.cpus_per_actor={settings.cpus_per_actor:g} "
                                      f"needs more CPUs than the Ray cluster has ({cpus:g})")
        options = {"num_cpus": settings.cpus_per_actor, "num_gpus": tp if on_gpus else 0,
                   "max_restarts": settings.max_restarts, "max_task_retries": 0,  # the driver retries (bounded)
                   "max_concurrency": 10_000}  # calls are coroutines waiting for their records: cheap
        if settings.runtime_env:
            options["runtime_env"] = settings.runtime_env
        return count, options

    def run(self, items: Sequence[Item], model_config: LlamaActionConfig, emit: Callable[[dict], None],
            on_frames: Callable[[int, int], None] | None = None) -> None:
        """Run ``items`` on the actors; ``emit`` gets one record per item (with ``actor``, ``node``, ``gpus``),
        ``on_frames`` a sample's index and its frames generated so far, as the actors' progress polls tell."""
        from terra.batch.ray_actor import RolloutActor  # imports Ray

        ray = self.ray
        token = secrets.token_hex(4)
        remote = ray.remote(**self.options)(RolloutActor)
        actors = [remote.options(name=f"terra-batch-{token}-{a}").remote(self.config, model_config,
                                                                         longest_rollout(items))
                  for a in range(self.count)]
        try:
            _Dispatcher(ray, actors, self.settings, emit, on_frames).run(items)
        finally:
            for actor in actors:
                ray.kill(actor, no_restart=True)


class _Dispatcher:
    """The driver's loop: samples out to the actors as their engines have room, records back, deaths retried.

    Each sample takes two calls (terra/batch/ray_actor.py): ``run`` returns when its rollout has left the engine,
    ``record`` when its files are written. An actor's room counts only samples not yet generated, so writing never
    holds an engine slot. While an actor is still starting, the others take no more than their engines run at once
    (no read-ahead), so the late one still gets its share of a short run.
    """

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
                tqdm.write(f"rollout: no Ray actor has started after {WAIT_NOTICE_S:.0f} s (models loading, or the "
                           "cluster lacks free resources: `ray status` shows them)", file=sys.stderr)

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
        """A progress() call returned: report each sample's frames (an actor that died meanwhile answers nothing;
        its death reaches the driver through its other calls)."""
        self.polls.pop(ref)
        try:
            frames = self.ray.get(ref)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.RayTaskError):
            return
        for index, count in frames.items():
            self.on_frames(index, count)

    def _room(self, a: int) -> int:
        """Samples actor ``a`` may hold before they are generated: its engine's rollouts, plus read-ahead once every
        actor has started."""
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
                raise _start_failure(err) from None
            self.last_death = _cause(err)
            tqdm.write(f"rollout: Ray actor {a} is gone ({self.last_death}); going on without it", file=sys.stderr)
            return
        if info["error"] is not None:
            if first:
                raise TerraInputError(f"Ray actor {a} on {info['node']} could not start: {info['error']}")
            tqdm.write(f"rollout: Ray actor {a} did not come back ({info['error']}); going on without it",
                       file=sys.stderr)
            self.ray.kill(self.actors[a], no_restart=True)  # it holds its GPU(s) for nothing
            return
        self.infos[a] = info
        self.usable.add(a)
        self.starting.discard(a)
        where = f"GPU {','.join(info['gpus'])}" if info["gpus"] else "CPU"
        tqdm.write(f"rollout: Ray actor {a} on {info['node']} ({where}) {'started' if first else 'is back'}: "
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
        """``(value,)`` of a finished call; None after handling its failure: a dead actor's sample is retried, the
        actor's own error fails the sample."""
        try:
            return (self.ray.get(ref),)
        except self.ray.exceptions.RayActorError as err:  # died, or unreachable (ActorUnavailableError)
            self._actor_lost(a, err)
            self._retry(item, queue, _cause(err))
        except self.ray.exceptions.RayTaskError as err:  # the actor's own error, not a death: no retry
            self._fail(item, f"Ray actor {a}: {_cause(err)}")
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
        self.last_death = _cause(err)
        if a in self.usable:
            self.usable.discard(a)
            tqdm.write(f"rollout: Ray actor {a} on {self.infos[a]['node']} died ({self.last_death}); its unfinished "
                       "samples go back to the queue", file=sys.stderr)
            self.pings[self.actors[a].info.remote()] = (a, False)

    def _fail(self, item: Item, error: str) -> None:
        self.emit(sample_record(item.sample, "failed", error=error, stage="generate", seed=item.seed,
                                attempts=self.attempts.get(item.sample.index, 0)))


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Raise :class:`TerraInputError` unless something accepts TCP connections at ``address`` (Ray itself
    would retry for minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise TerraInputError(f"ray.address={address} is not auto or host:port (e.g. 10.0.0.1:6379)")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as err:
        raise TerraInputError(f"ray.address={address}: no Ray cluster answers there ({err.strerror or err}); start "
                              "the head node with `ray start --head`, or fix the address") from None


def _cause(err: BaseException) -> str:
    """The last ``SomeError: message`` line of a Ray error's text (it carries the remote traceback)."""
    lines = _ANSI.sub("", str(err)).splitlines()
    for line in reversed(lines):
        match = _CAUSE.match(line)
        if match:
            return f"{match.group(1)}: {match.group(2).strip()}"
    return " ".join((lines or [type(err).__name__])[0].split())[:300]


def _start_failure(err: BaseException) -> TerraInputError:
    """The one line for an actor that died while starting: most often a node without the project."""
    text = _ANSI.sub("", str(err))
    node = re.search(r"\bip=([\w.:-]+)", text)
    where = f" on {node.group(1)}" if node else ""
    cause = _cause(err)
    if "failed to import" in text or re.match(r"(ModuleNotFound|Import)Error", cause):
        return TerraInputError(f"Ray workers{where} cannot import the project ({cause}); install it on every node "
                               f"(pip install 'terra-world-model[ray]') or ship it with ray.runtime_env ({_HELP})")
    return TerraInputError(f"a Ray actor{where} died while starting: {cause}")
