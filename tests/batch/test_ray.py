"""executor=ray (terra/batch/ray_executor.py, ray_actor.py) on a local Ray cluster of 2 CPUs without a dashboard,
with the demo model on the Transformers backend: the same outputs as executor=local, every sample recorded once,
an actor killed mid-run, the driver SIGKILLed and rerun, a malformed sample, and the one-line errors (no Ray, no
cluster at the address, workers that cannot import the project).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import ray

from terra.batch import BatchConfig, read_manifest, run_batch
from terra.core.errors import TerraInputError
from tests.conftest import load_script, spawn_interruptible
from tests.batch.test_batch import (  # noqa: F401  (scenes: the module-scoped fixture of context images)
    NUM_CONTEXT, NUM_FRAMES, ROOT, actbench_line, check_outputs, mixed_lines, scenes, script_args, script_env,
)
from terra.core.atomic import MARKER

pytestmark = pytest.mark.slow


@pytest.fixture
def every_actor_up_first(monkeypatch) -> None:
    """Hold the queue until every actor has started. The executor hands samples out as soon as one actor is up, so on
    a loaded machine the first actor can run them all before the second has imported torch; a test that needs both
    actors to take samples waits for that state instead of racing it."""
    from terra.batch import ray_executor

    hand_out = ray_executor._Dispatcher._hand_out

    def once_all_started(self, queue) -> None:
        if not self.starting:
            hand_out(self, queue)

    monkeypatch.setattr(ray_executor._Dispatcher, "_hand_out", once_all_started)


def config(samples: Path, out: Path, scenes: dict, **changes) -> BatchConfig:
    return BatchConfig(samples=str(samples), output_dir=str(out), image_root=scenes["root"], backend="hf",
                       device="cpu", num_frames=NUM_FRAMES, num_context=NUM_CONTEXT, num_threads=1, progress=False,
                       **changes)


def write_samples(tmp_path: Path, lines: list[str]) -> Path:
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(lines) + "\n")
    return samples


def wait_for_ok(manifest: Path, proc: subprocess.Popen | None = None, actors: int = 1,
                timeout: float = 240) -> Counter:
    """Wait until ``actors`` different actors have written a sample; the samples written so far, per actor."""
    deadline = time.monotonic() + timeout
    while len(written := Counter(r["actor"] for r in (read_manifest(manifest) if manifest.is_file() else [])
                                 if r["status"] == "ok")) < actors:
        assert proc is None or proc.poll() is None, f"finished before it could be killed:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"fewer than {actors} actor(s) wrote a sample in time"
        time.sleep(0.05)
    return written


def test_two_actors_write_what_the_local_executor_writes(tmp_path, scenes, ray_cluster, every_actor_up_first):
    lines = mixed_lines(scenes, 6) + [actbench_line(scenes, "bad", context_frames=["curve_left/missing.png"])]
    samples = write_samples(tmp_path, lines)
    local = run_batch(config(samples, tmp_path / "local", scenes, save_codes=True))
    ran = run_batch(config(samples, tmp_path / "ray", scenes, save_codes=True, executor="ray", max_concurrent=1,
                           ray={"num_actors": 2}))
    ids = [f"s{i}" for i in range(6)]
    for result in (local, ran):
        assert result.counts == {"ok": 6, "failed": 1, "skipped": 0} and result.exit_code == 1
        assert sorted(r["sample_id"] for r in result.records) == sorted(ids + ["bad"])  # each exactly once
        [bad] = [r for r in result.records if r["status"] == "failed"]
        assert bad["sample_id"] == "bad" and bad["stage"] == "input" and "missing.png" in bad["error"]
    for sample_id in ids:  # the same codes and videos, whichever actor ran the sample
        assert np.array_equal(np.load(tmp_path / "local" / f"{sample_id}.codes.npy"),
                              np.load(tmp_path / "ray" / f"{sample_id}.codes.npy")), sample_id
        assert (tmp_path / "ray" / f"{sample_id}.mp4").stat().st_size > 0
    assert {r["actor"] for r in ran.records if r["status"] == "ok"} == {0, 1}
    summary = json.loads((tmp_path / "ray" / "manifest.summary.json").read_text())
    assert summary["executor"] == "ray" and set(summary["actors"]) == {"0", "1"}
    assert sum(a["ok"] for a in summary["actors"].values()) == 6
    assert all(a["gpus"] == "cpu" and a["retried"] == 0 for a in summary["actors"].values())
    assert "actors" not in json.loads((tmp_path / "local" / "manifest.summary.json").read_text())


def test_a_killed_actor_is_restarted_and_its_samples_run_again(tmp_path, scenes, ray_cluster, every_actor_up_first):
    ids = [f"s{i}" for i in range(8)]
    samples = write_samples(tmp_path, mixed_lines(scenes, 8))
    out = tmp_path / "out"
    killed: list[str] = []

    def kill_an_actor() -> None:
        # An actor holds samples (its engine's rollout and read-ahead) while the queue lasts, but may be idle for a
        # moment after its first start: wait until both have written one and kill the one that wrote fewer.
        written = wait_for_ok(out / "manifest.jsonl", actors=2)
        actor = min(written, key=written.get)
        name = next(n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                    if n["name"].startswith("terra-batch-") and n["name"].endswith(f"-{actor}"))
        ray.kill(ray.get_actor(name), no_restart=False)  # as if its process died: Ray restarts it
        killed.append(name)

    killer = threading.Thread(target=kill_an_actor, daemon=True)
    killer.start()
    result = run_batch(config(samples, out, scenes, executor="ray", max_concurrent=1, ray={"num_actors": 2}))
    killer.join(timeout=1)
    assert killed, "the actor was not killed before the run ended"
    assert result.counts == {"ok": 8, "failed": 0, "skipped": 0} and result.exit_code == 0
    assert sorted(r["sample_id"] for r in result.records) == ids  # each exactly once
    assert any(r.get("attempts", 1) >= 2 for r in result.records)  # what the dead actor held ran again
    check_outputs(out, ids, formats=("mp4",))  # complete videos, no temporary file left behind


def test_sigkilled_driver_then_rerun_resumes(tmp_path, scenes, ray_cluster):
    ids = [f"s{i}" for i in range(6)]
    samples = write_samples(tmp_path, mixed_lines(scenes, 6))
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    args = script_args(samples, out, scenes, "executor=ray", "ray.num_actors=2", "max_concurrent=1",
                       f"ray.address={ray_cluster}")  # the rerun's actors start once Ray has removed the first's
    proc = subprocess.Popen(args, cwd=ROOT, env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_ok(manifest, proc)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    done = {r["sample_id"] for r in read_manifest(manifest) if r["status"] == "ok"}
    assert 1 <= len(done) < len(ids)

    rerun = subprocess.run(args, cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=400)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    records = read_manifest(manifest)
    assert sorted(r["sample_id"] for r in records) == ids  # each exactly once
    final = {r["sample_id"]: r["status"] for r in records}
    assert {i for i, s in final.items() if s == "skipped"} >= done and set(final.values()) <= {"ok", "skipped"}
    # one summary line per actor that made samples (one actor may have taken them all before the other started)
    assert re.search(r"^terra-rollout: actor \d on .* \(CPU\): \d succeeded", rerun.stdout, re.MULTILINE)
    check_outputs(out, ids, formats=("mp4",))


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("terra-rollout: error: "), result.stderr
    return lines[0]


def hiding(tmp_path: Path, module: str) -> Path:
    """A folder whose sitecustomize.py makes ``import <module>`` fail in any Python started with it on PYTHONPATH."""
    folder = tmp_path / f"without_{module}"
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None\n")
    return folder


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_no_ray_or_no_cluster_is_one_line_and_exit_2(tmp_path, scenes):
    samples = write_samples(tmp_path, mixed_lines(scenes, 1))
    out = tmp_path / "out"
    no_ray = {**script_env(), "PYTHONPATH": str(hiding(tmp_path, "ray"))}
    line = one_error_line(subprocess.run(script_args(samples, out, scenes, "executor=ray"), cwd=ROOT, env=no_ray,
                                         capture_output=True, text=True, timeout=120))
    assert "executor=ray needs Ray" in line and "pip install 'terra-world-model[ray]'" in line
    assert not out.exists()

    started = time.monotonic()
    address = f"127.0.0.1:{free_port()}"
    line = one_error_line(subprocess.run(script_args(samples, out, scenes, "executor=ray", f"ray.address={address}"),
                                         cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=120))
    assert f"ray.address={address}: no Ray cluster answers there" in line and "ray start --head" in line
    assert time.monotonic() - started < 60 and not out.exists()

    # executor=local never imports Ray: it runs where Ray cannot be imported.
    local = subprocess.run(script_args(samples, out, scenes, "num_frames=1"), cwd=ROOT, env=no_ray,
                           capture_output=True, text=True, timeout=240)
    assert local.returncode == 0, local.stderr
    assert "1 succeeded, 0 failed" in local.stdout


def test_workers_that_cannot_import_the_project_fail_fast(tmp_path, scenes, ray_cluster):
    samples = write_samples(tmp_path, mixed_lines(scenes, 2))
    env = {"env_vars": {"PYTHONPATH": str(hiding(tmp_path, "terra"))}}  # these workers lack the project
    started = time.monotonic()
    with pytest.raises(TerraInputError, match=r"Ray workers on \S+ cannot import the project \(") as err:
        run_batch(config(samples, tmp_path / "out", scenes, executor="ray", ray={"runtime_env": env}))
    assert "ray.runtime_env" in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - started < 120
    deadline = time.monotonic() + 30  # the actors are killed on the way out
    while [n for n in ray.util.list_named_actors(all_namespaces=True) if n["name"].startswith("terra-batch-")]:
        assert time.monotonic() < deadline, "the actors were left running"
        time.sleep(0.1)
    assert sorted(os.listdir(tmp_path / "out")) == [MARKER, "manifest.jsonl", "manifest.summary.json"]


def test_benchmark_compares_actor_counts_and_projects_actbench(tmp_path):
    """scripts/bench/benchmark_rollout.py --executor ray on the CPU: one run per actor count (each starts its own local
    Ray cluster), per-actor counts and the projected wall time of ACT-Bench's 2,286 samples."""
    bench = load_script("bench/benchmark_rollout")
    args = bench.parse_args(["--executor", "ray", "--actors", "1,2", "--actbench"])
    assert (args.runs, args.frames, args.format, args.project) == ([1, 2], 44, "mp4", 2286)
    assert bench.main(["--gpus", "2"]) == 2  # several GPUs are Ray's: --executor ray --actors
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench" / "benchmark_rollout.py"), "--demo",
                           "--backend", "hf", "--executor", "ray", "--actors", "2", "--device", "cpu", "--samples", "4",
                           "--frames", "1", "--format", "mp4", "--out", str(out)],
                          cwd=ROOT, env=script_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (run,) = json.loads((out / "summary.json").read_text())["runs"]
    assert (run["executor"], run["actors"], run["ok"], run["failed"], run["gpus_used"]) == ("ray", 2, 4, 0, ["cpu"])
    assert sum(a["ok"] for a in run["per_actor"].values()) == 4
    assert run["projected_wall_s"] == pytest.approx(run["wall_s"] - run["span_s"] + 2286 / run["samples_per_s"])
    # the generation ends when the last rollout leaves the engine, before its files are written; no GPU, no busy share
    assert 0 < run["generation_s"] < run["span_s"] and run["generated_frames_per_s"] > run["frames_per_s"]
    assert run["gpu_busy_pct_generation"] is None and "gpu_busy_trace" not in run
    assert len(list((out / "run_ray2").glob("*.mp4"))) == 4 and "ray x2" in proc.stdout


def test_ctrl_c_stops_the_actors_on_the_cluster(tmp_path, scenes, ray_cluster):
    samples = write_samples(tmp_path, mixed_lines(scenes, 6))
    out = tmp_path / "out"
    args = script_args(samples, out, scenes, "executor=ray", "ray.num_actors=2", "max_concurrent=1",
                       f"ray.address={ray_cluster}")
    proc = spawn_interruptible(args, cwd=ROOT, env=script_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_for_ok(out / "manifest.jsonl", proc)
        assert [n for n in ray.util.list_named_actors(all_namespaces=True) if n["name"].startswith("terra-batch-")]
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == "terra-rollout: interrupted by SIGINT"
    deadline = time.monotonic() + 30  # the run's actors leave the cluster, which goes on serving others
    while [n for n in ray.util.list_named_actors(all_namespaces=True) if n["name"].startswith("terra-batch-")]:
        assert time.monotonic() < deadline, "the actors were left running"
        time.sleep(0.1)
    records = read_manifest(out / "manifest.jsonl")
    assert records and all(r["status"] == "ok" for r in records)  # what finished before the interrupt
    assert ray.cluster_resources().get("CPU") == 2


def test_actors_the_cluster_cannot_hold_are_refused_before_any_output(tmp_path, scenes, ray_cluster):
    samples = write_samples(tmp_path, mixed_lines(scenes, 1))
    for ray_settings, device, message in [
        ({"num_actors": 3}, "cpu", "ray.num_actors=3 x ray.cpus_per_actor=1 needs more CPUs than the Ray cluster"),
        ({"num_actors": 1, "cpus_per_actor": 2.5}, "cpu", "needs more CPUs than the Ray cluster has (2)"),
        ({}, "cuda", "device=cuda but the Ray cluster has no GPUs"),
    ]:
        changes = dict(executor="ray", ray=ray_settings)
        with pytest.raises(TerraInputError, match=re.escape(message)):
            run_batch(dataclasses.replace(config(samples, tmp_path / "out", scenes, **changes), device=device))
        assert not (tmp_path / "out").exists() and ray.is_initialized()  # the test's own cluster stays


def test_samples_are_failed_once_no_actor_is_left(tmp_path, scenes, ray_cluster):
    """ray.max_restarts=0: the one actor, killed mid-run, stays dead; the run ends (no hang) with every sample
    recorded once: those written before, the rest failed with the reason."""
    ids = [f"s{i}" for i in range(6)]
    samples = write_samples(tmp_path, mixed_lines(scenes, 6))
    out = tmp_path / "out"

    def kill_the_actor() -> None:
        wait_for_ok(out / "manifest.jsonl")
        [name] = [n["name"] for n in ray.util.list_named_actors(all_namespaces=True)
                  if n["name"].startswith("terra-batch-")]
        ray.kill(ray.get_actor(name), no_restart=False)

    killer = threading.Thread(target=kill_the_actor, daemon=True)
    killer.start()
    result = run_batch(config(samples, out, scenes, executor="ray", max_concurrent=1,
                              ray={"num_actors": 1, "max_restarts": 0}))
    killer.join(timeout=1)
    assert sorted(r["sample_id"] for r in result.records) == ids and result.exit_code == 1
    failed = [r for r in result.records if r["status"] == "failed"]
    assert failed and result.counts["ok"] >= 1
    assert all(r["stage"] == "generate" and "no Ray actor left to run it" in r["error"] for r in failed)
