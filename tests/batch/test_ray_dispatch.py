"""The driver's dispatch loop of executor=ray (terra/batch/ray_executor.py, ``_Dispatcher``) against a scripted
stand-in for Ray's call/wait/get API: which actor gets which sample, and when. Runs without a Ray cluster; the
end-to-end behaviour on a real local cluster is in tests/batch/test_ray.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from terra.batch import ray_executor
from terra.batch.plan import Item
from terra.batch.ray_executor import _Dispatcher
from terra.config.ray_settings import RaySettings
from terra.inputs.samples import Sample


class ActorDied(Exception):
    """Stands for ray.exceptions.RayActorError."""


class TaskFailed(Exception):
    """Stands for ray.exceptions.RayTaskError."""


class Ref:
    """A call's result: ``value`` (an exception is raised by ``get``)."""

    def __init__(self, kind: str, actor: int, value: Any) -> None:
        self.kind, self.actor, self.value = kind, actor, value

    def __repr__(self) -> str:
        return f"Ref({self.kind}, actor {self.actor}, {self.value!r})"


class FakeRay:
    """``wait`` returns the one ref that ``pick(refs, step)`` chooses; calls are logged in ``self.calls``."""

    class exceptions:
        RayActorError = ActorDied
        RayTaskError = TaskFailed

    def __init__(self, pick: Callable[[list[Ref], int], Ref]) -> None:
        self.pick, self.step, self.calls = pick, 0, []

    def wait(self, refs: list[Ref], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        self.step += 1
        ref = self.pick(refs, self.step)
        return [ref], [r for r in refs if r is not ref]

    def get(self, ref: Ref) -> Any:
        if isinstance(ref.value, BaseException):
            raise ref.value
        return ref.value


class _Method:
    def __init__(self, actor: "FakeActor", name: str) -> None:
        self.actor, self.name = actor, name

    def remote(self, *args: Any) -> Ref:
        return self.actor.call(self.name, *args)


class FakeActor:
    """An actor whose ``run`` returns the sample's index, ``record`` a record. Each index in ``lose`` makes one
    record() call answer None (the actor restarted since), each in ``die`` one run() call raise ActorDied."""

    def __init__(self, ray: FakeRay, number: int, max_concurrent: int, depth: int) -> None:
        self.ray, self.number, self.max_concurrent, self.depth = ray, number, max_concurrent, depth
        self.lose: list[int] = []
        self.die: list[int] = []
        self.running: set[int] = set()  # samples handed to run() whose record() was not called yet
        self.info, self.run, self.record = _Method(self, "info"), _Method(self, "run"), _Method(self, "record")
        self.progress = _Method(self, "progress")

    def call(self, name: str, *args: Any) -> Ref:
        self.ray.calls.append((name, self.number, *args))
        if name == "progress":  # two frames of each sample it holds
            return Ref("progress", self.number, {index: 2 for index in self.running})
        if name == "info":
            return Ref("info", self.number, {"node": "10.0.0.1", "pid": 1, "gpus": [str(self.number)],
                                             "device": "cuda", "max_concurrent": self.max_concurrent,
                                             "depth": self.depth, "error": None})
        if name == "run":
            index = args[0].sample.index
            self.running.add(index)
            if index in self.die:
                self.die.remove(index)
                return Ref("run", self.number, ActorDied("ActorDiedError: the actor died unexpectedly"))
            return Ref("run", self.number, index)
        index = args[0]
        self.running.discard(index)
        if index in self.lose:
            self.lose.remove(index)
            return Ref("record", self.number, None)
        return Ref("record", self.number, {"index": index, "sample_id": index, "status": "ok"})


def items(count: int) -> list[Item]:
    return [Item(Sample("s.jsonl", i + 1, i, {"sample_id": i}), i, 4, {}, Path(f"{i}.json"), None, "")
            for i in range(count)]


def runs_per_actor(ray: FakeRay) -> dict[int, int]:
    counts: dict[int, int] = {}
    for name, actor, *_ in ray.calls:
        if name == "run":
            counts[actor] = counts.get(actor, 0) + 1
    return counts


def first_of(kind: str, refs: list[Ref], actor: int | None = None) -> Ref | None:
    return next((r for r in refs if r.kind == kind and (actor is None or r.actor == actor)), None)


def any_ready(refs: list[Ref], step: int) -> Ref:
    """Answers in the order a fast actor gives them: starts first, then generations, then records."""
    return first_of("info", refs) or first_of("run", refs) or first_of("record", refs)


def test_an_actor_still_starting_keeps_its_share_of_a_short_run():
    # Actor 0 is up first; actor 1 answers a step later. 8 samples, 4 rollouts per engine, read-ahead of 1.
    seen: dict[int, dict[int, int]] = {}

    def pick(refs: list[Ref], step: int) -> Ref:
        seen[step] = runs_per_actor(ray)
        if step == 1:
            return first_of("info", refs, 0)
        if step == 2:
            return first_of("info", refs, 1)
        return first_of("run", refs) or first_of("record", refs)

    ray = FakeRay(pick)
    actors = [FakeActor(ray, a, max_concurrent=4, depth=5) for a in range(2)]
    records: list[dict] = []
    _Dispatcher(ray, actors, RaySettings(), records.append).run(items(8))
    assert seen[2] == {0: 4}  # no read-ahead while actor 1 was starting
    assert runs_per_actor(ray) == {0: 4, 1: 4}
    assert sorted(r["index"] for r in records) == list(range(8))
    assert {r["actor"] for r in records if r["index"] < 4} == {0}


def test_a_generated_sample_frees_its_slot_before_its_record_arrives():
    # One actor, 2 rollouts at once + 1 read-ahead; records come back only once every run() has returned.
    records: list[dict] = []
    seen: list[tuple[int, int]] = []  # (run calls made, records emitted) at each step

    def pick(refs: list[Ref], step: int) -> Ref:
        seen.append(([c[0] for c in ray.calls].count("run"), len(records)))
        return any_ready(refs, step)

    ray = FakeRay(pick)
    _Dispatcher(ray, [FakeActor(ray, 0, max_concurrent=2, depth=3)], RaySettings(), records.append).run(items(6))
    assert (6, 0) in seen  # all six handed out (twice the depth) before any record came back
    assert max(runs for runs, _ in seen[:2]) == 3  # but no more than the depth at once
    assert [name for name, *_ in ray.calls].count("record") == 6
    assert sorted(r["index"] for r in records) == list(range(6))
    assert all("attempts" not in r for r in records)


def test_a_sample_lost_between_generation_and_record_runs_again():
    # The actor restarts after generating sample 1 (its record() answers None); its run() dies for sample 2.
    ray = FakeRay(any_ready)
    actor = FakeActor(ray, 0, max_concurrent=2, depth=2)
    actor.lose, actor.die = [1], [2]
    records: list[dict] = []
    _Dispatcher(ray, [actor], RaySettings(max_retries=1), records.append).run(items(3))
    by_index = {r["index"]: r for r in records}
    assert sorted(by_index) == [0, 1, 2] and len(records) == 3  # each recorded once
    assert "attempts" not in by_index[0]
    assert by_index[1]["attempts"] == 2 and by_index[1]["status"] == "ok"
    assert by_index[2]["attempts"] == 2 and by_index[2]["status"] == "ok"
    assert [c for c in ray.calls if c[0] == "record"].count(("record", 0, 1)) == 2
    assert [c[0] for c in ray.calls].count("info") == 2  # the death made the driver wait for the restart


def test_a_sample_that_keeps_losing_its_actor_fails_with_the_cause():
    ray = FakeRay(any_ready)
    actor = FakeActor(ray, 0, max_concurrent=1, depth=1)
    actor.die = [0, 0]
    records: list[dict] = []
    _Dispatcher(ray, [actor], RaySettings(max_retries=1), records.append).run(items(1))
    assert len(records) == 1 and records[0]["status"] == "failed" and records[0]["attempts"] == 2
    assert records[0]["error"] == ("its Ray actor died 2 times while running it: ActorDiedError: the actor died "
                                   "unexpectedly")


def test_progress_polls_report_frames_and_a_lost_sample_counts_again(monkeypatch):
    """The driver's frame bar (terra/batch/progress.py) hears each actor's frames through progress() polls; a
    sample that goes back to the queue after its actor died counts from zero again."""
    monkeypatch.setattr(ray_executor, "POLL_S", 0.0)
    ray = FakeRay(lambda refs, step: (step % 2 and first_of("progress", refs)) or any_ready(refs, step)
                  or first_of("progress", refs))
    actor = FakeActor(ray, 0, max_concurrent=2, depth=2)
    actor.die = [1]
    records: list[dict] = []
    reports: list[tuple[int, int]] = []
    _Dispatcher(ray, [actor], RaySettings(max_retries=1), records.append,
                lambda index, count: reports.append((index, count))).run(items(3))
    assert sorted(r["index"] for r in records) == [0, 1, 2]
    assert {index for index, count in reports if count == 2} == {0, 1, 2}  # each heard while it ran
    assert (1, 0) in reports  # sample 1 lost its actor: its frames went with it
    assert [name for name, *_ in ray.calls].count("progress") >= 3
    quiet = FakeRay(any_ready)
    _Dispatcher(quiet, [FakeActor(quiet, 0, 2, 2)], RaySettings(), records.append).run(items(2))
    assert "progress" not in [name for name, *_ in quiet.calls]  # no bar, no polls
