"""Hostile inputs to batch rollouts (terra-rollout, terra.batch): no traceback, no hang, no torn manifest.

* A run that fails as a whole (a bad setting, samples file or output folder): exit code 2, exactly one line on
  stderr, nothing left behind (no output folder, nothing in the working folder); settings fail before torch.
* Bad samples (hostile images, FIFOs, path escapes, deep / huge / out-of-range JSON, names no file can take):
  exit code 1, each recorded ``failed`` with a one-line error before anything is generated, the good samples'
  outputs complete and nothing else in the folder.
* Two runs into one folder: the second exits 2 at once naming the first, which completes untouched; a lock
  held by a killed run is free again.
* SIGINT / SIGTERM mid-run: one line, exit 130 / 143, no partial files, a consistent manifest; a rerun completes.
* The manifest under concurrent writer threads and a write cut short: whole records only.

The hostile files are made here: PNG headers claiming huge sizes, FIFOs, deep and huge JSON, ``1e400``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import imageio.v3 as iio
import pytest

from terra.batch.manifest import sample_error
from terra.config.manifest import Manifest, read_manifest
from terra.core.atomic import MARKER
from terra.core.errors import MAX_ERROR_CHARS, TerraInputError
from terra.core.lock import output_lock
from tests.batch.test_batch import (  # noqa: F401  (scenes is a fixture)
    NUM_CONTEXT,
    TEMP_NAME,
    TOTAL,
    actbench_line,
    scenes,
    terra_line,
)
from tests.conftest import spawn_interruptible
from tests.test_hostile_inputs import png_header

ROOT = Path(__file__).resolve().parents[2]
APP = "terra.apps.rollout"  # terra-rollout
NO_ROUTE_NOTICE = "takes a route"  # the one line a route model's run without routes prints (generation/rollout.py)


def without_route_notice(stderr: str) -> list[str]:
    """The lines of ``stderr`` but the one notice of a route model run without routes (the demo model is one)."""
    lines = stderr.splitlines()
    assert sum(NO_ROUTE_NOTICE in line for line in lines) <= 1, stderr
    return [line for line in lines if NO_ROUTE_NOTICE not in line]
DEMO = ROOT / "terra" / "assets" / "demo"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)


@pytest.fixture(scope="module")
def hostile(scenes, tmp_path_factory) -> SimpleNamespace:
    """Hostile files inside image_root (``scenes["root"]``), one good image outside it, hostile trajectory files
    next to the JSONL files (folder ``jsonl``), and a good one-sample JSONL."""
    root = Path(scenes["root"])
    ns = SimpleNamespace(root=root, jsonl=tmp_path_factory.mktemp("jsonl"), elsewhere=tmp_path_factory.mktemp("x"))
    (root / "bomb.png").write_bytes(png_header(100_000, 100_000))  # Pillow's decompression-bomb error
    (root / "big.png").write_bytes(png_header(9000, 9000))  # above MAX_PIXELS, below Pillow's own limit
    (root / "text.png").write_text("not an image")
    os.mkfifo(root / "pipe.png")
    (root / "with_fifo").mkdir()
    iio.imwrite(root / "with_fifo" / "a.png", iio.imread(Path(scenes["straight"]["folder"]) / "00.png"))
    os.mkfifo(root / "with_fifo" / "b.png")
    ns.outside = ns.elsewhere / "frame.png"  # a real image, but outside image_root
    iio.imwrite(ns.outside, iio.imread(Path(scenes["straight"]["folder"]) / "00.png"))
    (ns.jsonl / "deep.json").write_text("[" * 200_000 + "]" * 200_000)
    os.mkfifo(ns.jsonl / "pipe.json")
    with (ns.jsonl / "huge.json").open("wb") as fh:  # 65 MiB, sparse: refused by its size, never read
        fh.truncate(65 << 20)
    ns.good = ns.jsonl / "good.jsonl"
    ns.good.write_text(terra_line(scenes, "ok") + "\n")
    ns.empty = ns.jsonl / "empty.jsonl"
    ns.empty.write_text("\n\n")
    os.mkfifo(ns.jsonl / "samples_fifo.jsonl")
    ns.a_file = ns.jsonl / "a_file"
    ns.a_file.write_text("")
    return ns


def rollout(*args: str, cwd: Path, timeout: float = 300, wrapper: str | None = None) -> subprocess.CompletedProcess:
    """Run terra-rollout (or ``wrapper``, Python code that runs it) in ``cwd`` on the demo model, CPU."""
    cwd.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", wrapper, APP] if wrapper else [sys.executable, "-m", APP]
    return subprocess.run([*command, *fast_args(), *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def fast_args() -> list[str]:
    return ["backend=hf", "device=cpu", "num_frames=2", f"num_context={NUM_CONTEXT}", "num_threads=1"]


def one_error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """The single stderr line of a failed run (checked: exit code, no traceback, nothing else on stderr)."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("terra-rollout: "), result.stderr[-3000:]
    return lines[0]


# ---------------------------------------------------------------------------------------------- the whole run

# case → (arguments from `hostile` (samples, image_root and output.dir default to good ones), text of the line)
WHOLE_RUN_CASES = {
    "added_setting": (lambda h: ["+foo=1"], "unknown setting 'foo'"),
    "device_banana": (lambda h: ["device=banana"], "device='banana'"),
    "num_frames_zero": (lambda h: ["num_frames=0"], "num_frames must be a whole number from 1 to 10000"),
    "num_frames_1e400": (lambda h: ["num_frames=1e400"], "num_frames must be a whole number"),
    "num_context_400_digits": (lambda h: ["num_context=" + "9" * 400], "a 400-digit number"),
    "seed_negative": (lambda h: ["seed=-1"], "seed must be a whole number from 0"),
    "max_concurrent_zero": (lambda h: ["max_concurrent=0"], "max_concurrent must be a whole number from 1 to 4096"),
    "writer_threads_10**6": (lambda h: ["output.writer_threads=1000000"], "output.writer_threads must be"),
    "num_threads_zero": (lambda h: ["num_threads=0"], "num_threads must be"),
    "num_shards_2**40": (lambda h: [f"num_shards={2**40}"], "num_shards must be"),
    "fps_1e9": (lambda h: ["output.fps=1e9"], "output.fps must be a number from 1 to 60"),
    "temperature_inf": (lambda h: ["sampling.temperature=inf"], "sampling.temperature"),
    "max_batch_size_zero": (lambda h: ["backend.options.max_batch_size=0"], "backend.options.max_batch_size"),
    "resume_not_a_flag": (lambda h: ["resume=1"], "resume must be true or false"),
    "allow_outside_not_a_flag": (lambda h: ["allow_paths_outside_image_root=sure"],
                                 "allow_paths_outside_image_root must be true or false"),
    "samples_fifo": (lambda h: [f"samples={h.jsonl / 'samples_fifo.jsonl'}"], "is a FIFO, not a regular file"),
    "samples_folder": (lambda h: [f"samples={h.jsonl}"], "is a folder, not a regular file"),
    "samples_missing": (lambda h: [f"samples={h.jsonl / 'missing.jsonl'}"], "does not exist"),
    "samples_without_samples": (lambda h: [f"samples={h.empty}"], "hold no samples"),  # found after the lock
    "image_root_a_file": (lambda h: [f"image_root={h.a_file}"], "is not a folder"),
    "output_dir_under_a_file": (lambda h: [f"output.dir={h.a_file}/out"], "not writable"),
    "output_dir_name_too_long": (lambda h: [f"output.dir={h.jsonl}/{'n' * 300}"], "too long"),
    "manifest_outside_the_folder": (lambda h: ["output.manifest=../m.jsonl"], "output.manifest"),
    "video_pattern_without_ext": (lambda h: ["output.video_pattern='{sample_id}'"], "must contain {ext}"),
    # the output folder (terra/config/output_dir.py): apart from every input
    "output_dir_holds_the_samples": (lambda h: [f"output.dir={h.jsonl}"], "holds the samples file"),
    "output_dir_in_the_world_model": (lambda h: [f"output.dir={DEMO}/world_model/out"], "lies inside the world model"),
    "output_dir_in_proc": (lambda h: ["output.dir=/proc/terra"], "is not on a disk"),
}


@pytest.mark.parametrize("case", list(WHOLE_RUN_CASES))
def test_hostile_run_exits_2_with_one_line_and_leaves_nothing(case, hostile, tmp_path):
    overrides, expected = WHOLE_RUN_CASES[case]
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    args = [f"samples={hostile.good}", f"image_root={hostile.root}", f"output.dir={out}", *overrides(hostile)]
    line = one_error_line(rollout(*args, cwd=cwd, timeout=120))
    assert line.startswith("terra-rollout: error: ") and expected in line, line
    assert not out.exists() and list(cwd.iterdir()) == []


# Runs the app module (argv[1]) in this process and says on stdout whether torch was imported by the time it ended.
TORCH_PROBE = ("import runpy, sys\nsys.argv = sys.argv[1:]\n"
               "try:\n    runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
               "finally:\n    print('torch imported:', 'torch' in sys.modules, flush=True)\n")


def test_settings_and_the_lock_are_checked_before_torch_is_imported(hostile, tmp_path):
    result = rollout(f"samples={hostile.good}", "sampling.top_p=0", f"output.dir={tmp_path / 'out'}",
                     cwd=tmp_path / "cwd", wrapper=TORCH_PROBE)
    assert "sampling.top_p" in one_error_line(result)
    assert result.stdout.strip() == "torch imported: False"


def test_internal_error_is_one_line_exit_1_and_verbose_shows_the_traceback(hostile, tmp_path):
    broken = ("import terra.batch.run\ndef broken(config):\n    raise RuntimeError('boom\\nsecond line')\n"
              "terra.batch.run.run_locked = broken\n" + TORCH_PROBE)
    out = tmp_path / "out"
    quiet = rollout(f"samples={hostile.good}", f"output.dir={out}", cwd=tmp_path / "cwd", wrapper=broken)
    line = one_error_line(quiet, code=1)
    assert line.startswith("terra-rollout: internal error: RuntimeError: boom (a bug") and "--verbose" in line, line
    verbose = rollout(f"samples={hostile.good}", f"output.dir={out}", "--verbose", cwd=tmp_path / "cwd",
                      wrapper=broken)
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr and "RuntimeError: boom" in verbose.stderr
    assert not out.exists() and list((tmp_path / "cwd").iterdir()) == []


# ---------------------------------------------------------------------------------------------- bad samples


def bad_sample_lines(scenes: dict, h: SimpleNamespace) -> dict[str, tuple[str, str]]:
    """case → (JSONL line, text of its one-line error); every case is a sample of its own."""

    def terra(sample_id, context, **trajectory) -> str:
        return json.dumps({"sample_id": sample_id, "context": context, **(trajectory or {"manoeuvre": "straight"})})

    deep = "[" * 100_000 + "]" * 100_000
    return {
        "image_decompression_bomb": (terra("bomb", "bomb.png"), "claims more than"),
        "image_9000x9000": (terra("big", "big.png"), "9000x9000 pixels"),
        "image_not_an_image": (terra("text", "text.png"), "cannot be read as an image"),
        "image_fifo": (terra("fifo", "pipe.png"), "is a FIFO, not a regular file"),
        "folder_with_a_fifo": (terra("fifo_folder", "with_fifo"), "is a FIFO, not a regular file"),
        "image_missing": (terra("missing", "missing.png"), "does not exist"),
        "path_absolute_outside": (terra("absolute", str(h.outside)), "lies outside"),
        "path_dotdot_outside": (terra("dotdot", os.path.relpath(h.outside, h.root)), "lies outside"),
        "path_home": (terra("home", "~/frame.png"), "lies outside"),
        "glob_outside": (terra("glob", "../*/frame.png"), "lies outside"),
        "actbench_path_outside": (actbench_line(scenes, "act_outside", context_frames=[str(h.outside)] * 3),
                                  "lies outside"),
        "trajectory_file_deep": (terra("traj_deep", "straight", trajectory="deep.json"), "too deeply"),
        "trajectory_file_fifo": (terra("traj_fifo", "straight", trajectory="pipe.json"), "a FIFO"),
        "trajectory_file_65_mib": (terra("traj_huge", "straight", trajectory="huge.json"), "65 MiB"),
        "line_nested_100000_deep": ('{"sample_id": "deep_line", "context": "straight", "actions": ' + deep + "}",
                                    "too deeply"),
        "line_number_1e400": ('{"sample_id": "inf", "context": "straight", "trajectory": {"x": [0, 1e400], '
                              '"y": [0, 0]}}', "1e400"),
        "line_nan": ('{"sample_id": "nan", "context": "straight", "actions": NaN}', "NaN"),
        "line_400_digit_seed": ('{"sample_id": "digits", "context": "straight", "manoeuvre": "stop", "seed": '
                                + "9" * 400 + "}", "400 digits"),
        "line_67_mib": (json.dumps({"sample_id": "big_line", "context": "straight", "pad": "x" * (67 << 20)}),
                        "MiB, more than the 64 MiB"),
        "seed_2**63": (terra("seed", "straight", manoeuvre="stop", seed=2**63), "seed must be a whole number"),
        "num_frames_10**9": (terra("frames", "straight", num_frames=10**9, manoeuvre="stop"), "num_frames must be"),
        "num_frames_1e9": (terra("frames_f", "straight", num_frames=1e9, manoeuvre="stop"), "num_frames must be"),
        "speed_1e308": (terra("speed", "straight", manoeuvre={"name": "straight", "speed_kmh": 1e308}), "speed_kmh"),
        "actions_1e6_m": (terra("metres", "straight", actions=[[[1e6, 0.0, 0.45]] * 6] * 5), "metres"),
        "sample_id_dotdot": (terra("../evil", "straight"), "cannot name a file"),
        "sample_id_separator": (terra("a/b", "straight"), "cannot name a file"),
        "sample_id_empty": (terra("", "straight"), "cannot name a file"),
        "sample_id_control": (terra("tab\tid", "straight"), "cannot name a file"),
        "sample_id_bool": (terra(True, "straight"), "integer or a string"),
        "sample_id_surrogate": ('{"sample_id": "\\ud800", "context": "straight", "manoeuvre": "stop"}',
                                "lone surrogate"),
        "sample_id_too_long": (terra("n" * 300, "straight"), "too long"),
        "sample_id_duplicate": (terra("ok_terra", "straight"), "duplicate sample_id 'ok_terra'"),
    }


@pytest.mark.slow
def test_bad_samples_fail_alone_before_generation(scenes, hostile, tmp_path):
    cases = bad_sample_lines(scenes, hostile)
    lines = [actbench_line(scenes, "ok_act"), terra_line(scenes, "ok_terra")] + [line for line, _ in cases.values()]
    samples = hostile.jsonl / "bad.jsonl"
    samples.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    result = rollout(f"samples={samples}", f"image_root={hostile.root}", f"output.dir={out}", "max_concurrent=2",
                     cwd=tmp_path / "cwd")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and f"2 succeeded, {len(cases)} failed" in result.stdout, result.stdout
    assert len(without_route_notice(result.stderr)) == len(cases), result.stderr[-3000:]  # a line a failure, no bars
    records = read_manifest(out / "manifest.jsonl")
    assert len(records) == len(lines)
    by_line = {r["line"]: r for r in records}
    for number, (case, (_, expected)) in enumerate(cases.items(), start=3):
        record = by_line[number]
        assert record["status"] == "failed" and record["stage"] in ("parse", "input"), (case, record)
        error = record["error"]
        assert expected in error and "\n" not in error and len(error) <= 500, (case, error)
        assert "maximum recursion depth" not in error and "Traceback" not in error, (case, error)
        assert f"failed: {error}" in result.stderr or f"{error}; skipping the line" in result.stderr, case
    statuses = [r["status"] for r in records]  # every failure was recorded before any sample was generated
    assert statuses.index("ok") > max(i for i, s in enumerate(statuses) if s == "failed")
    names = sorted(os.listdir(out))
    assert names == sorted(["ok_act.mp4", "ok_act.json", "ok_terra.mp4", "ok_terra.json", "manifest.jsonl",
                            "manifest.summary.json", MARKER]), names
    for sample_id in ("ok_act", "ok_terra"):
        assert iio.imread(out / f"{sample_id}.mp4", index=None).shape[0] == TOTAL
        assert json.loads((out / f"{sample_id}.json").read_text())["batch"]["complete"]
    assert list((tmp_path / "cwd").iterdir()) == []


# ---------------------------------------------------------------------------------------------- the lock


def many_samples(scenes: dict, folder: Path, count: int) -> Path:
    samples = folder / f"samples_{count}.jsonl"
    samples.write_text("".join(terra_line(scenes, f"s{i}", manoeuvre="straight") + "\n" for i in range(count)))
    return samples


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def ok_records(manifest: Path) -> list[dict]:
    return [r for r in read_manifest(manifest) if r["status"] == "ok"] if manifest.is_file() else []


@pytest.mark.slow
def test_a_second_run_into_the_same_folder_exits_2_at_once_and_the_first_completes(scenes, hostile, tmp_path):
    samples, out = many_samples(scenes, hostile.jsonl, 4), tmp_path / "out"
    args = [sys.executable, "-m", APP, *fast_args(), f"samples={samples}", f"image_root={hostile.root}",
            f"output.dir={out}", "max_concurrent=1"]
    first = subprocess.Popen(args, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: f'"pid": {first.pid}' in read_text(out / ".manifest.lock"), first, "the lock")
        started = time.monotonic()
        second = rollout(f"samples={samples}", f"image_root={hostile.root}", f"output.dir={out}", cwd=tmp_path / "cwd",
                         wrapper=TORCH_PROBE)
        line = one_error_line(second)
        assert f"is in use by another run (pid {first.pid} on host " in line and "output.dir" in line, line
        assert second.stdout.strip() == "torch imported: False" and time.monotonic() - started < 30
        stdout, stderr = first.communicate(timeout=300)
    finally:
        first.kill()
    assert first.returncode == 0 and without_route_notice(stderr) == [], stderr
    assert "4 succeeded, 0 failed, 0 skipped" in stdout
    records = read_manifest(out / "manifest.jsonl")
    assert sorted(r["sample_id"] for r in records) == [f"s{i}" for i in range(4)]
    assert {r["status"] for r in records} == {"ok"}
    assert sorted(os.listdir(out)) == sorted([f"s{i}.{ext}" for i in range(4) for ext in ("mp4", "json")]
                                             + ["manifest.jsonl", "manifest.summary.json", MARKER])  # no lock file


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_a_killed_holder_frees_the_lock(tmp_path):
    manifest = tmp_path / "out" / "manifest.jsonl"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom terra.core.lock import output_lock\n"
         f"with output_lock({str(manifest)!r}):\n    print('held', flush=True)\n    time.sleep(600)\n"],
        cwd=ROOT, env=ENV, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(TerraInputError, match=f"pid {holder.pid} on host .* lock file .manifest.lock"):
            with output_lock(manifest):
                pass
    finally:
        holder.kill()  # SIGKILL: the kernel drops the lock, the lock file stays
        holder.wait()
    assert (tmp_path / "out" / ".manifest.lock").exists()
    with output_lock(manifest) as path:
        assert json.loads(path.read_text())["pid"] == os.getpid()
    assert list((tmp_path / "out").iterdir()) == []


# ---------------------------------------------------------------------------------------------- interrupts


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_mid_run_stops_with_one_line_and_a_consistent_manifest_then_resumes(signum, scenes, hostile,
                                                                                       tmp_path):
    count = 6
    samples, out = many_samples(scenes, hostile.jsonl, count), tmp_path / "out"
    manifest = out / "manifest.jsonl"
    args = [sys.executable, "-m", APP, *fast_args(), f"samples={samples}", f"image_root={hostile.root}",
            f"output.dir={out}", "max_concurrent=1", "output.formats=[mp4,png]"]
    proc = spawn_interruptible(args, cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        wait_for(lambda: ok_records(manifest), proc, "a finished sample")
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, (proc.returncode, stderr)
    assert without_route_notice(stderr) == [f"terra-rollout: interrupted by {signal.Signals(signum).name}"], stderr
    raw = manifest.read_text().splitlines()
    records = [json.loads(line) for line in raw]  # every line a whole record
    assert 1 <= len(records) < count and {r["status"] for r in records} == {"ok"}
    assert len({r["sample_id"] for r in records}) == len(records)
    done = {r["sample_id"] for r in records}
    expected = {f for r in records for f in r["files"]} | {"manifest.jsonl", "manifest.summary.json", MARKER}
    assert set(os.listdir(out)) == expected  # the finished samples' files, no partial ones, no lock file
    for sample_id in done:
        assert len(list((out / f"{sample_id}_frames").glob("frame_*.png"))) == TOTAL
    assert not [p for p in out.rglob("*") if TEMP_NAME.match(p.name) or p.name.endswith(".tmp")]
    summary = json.loads((out / "manifest.summary.json").read_text())
    assert summary["exit_code"] == 128 + signum and summary["interrupted_by"] == signal.Signals(signum).name
    assert summary["counts"]["ok"] == len(records)

    rerun = subprocess.run(args, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    final = read_manifest(manifest)
    assert sorted(r["sample_id"] for r in final) == sorted(f"s{i}" for i in range(count))
    assert {r["sample_id"] for r in final if r["status"] == "skipped"} == done
    assert {r["status"] for r in final} == {"ok", "skipped"}
    summary = json.loads((out / "manifest.summary.json").read_text())
    assert summary["exit_code"] == 0 and "interrupted_by" not in summary


# ---------------------------------------------------------------------------------------------- the manifest


def test_manifest_records_from_many_threads_are_whole_lines(tmp_path):
    manifest = Manifest(tmp_path / "manifest.jsonl")
    payload = "x" * 20_000  # longer than a pipe buffer: a spliced write would show

    def add(thread: int) -> None:
        for i in range(100):
            manifest.add({"thread": thread, "i": i, "payload": payload})

    threads = [threading.Thread(target=add, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    manifest.close()
    manifest.add({"late": True})  # after close (a helper thread finishing after an interrupt): dropped
    lines = (tmp_path / "manifest.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 800 and sorted((r["thread"], r["i"]) for r in records) == [
        (t, i) for t in range(8) for i in range(100)]


def test_a_gpu_out_of_memory_is_recorded_with_the_setting_that_frees_the_gpu():
    import torch

    detail = ("CUDA out of memory. Tried to allocate 216.00 MiB. GPU 0 has a total capacity of 79.18 GiB of which "
              "72.56 MiB is free. " + "Of the allocated memory 1.2 GiB is allocated by PyTorch. " * 12)
    line = sample_error(torch.OutOfMemoryError(detail))
    assert len(line) == MAX_ERROR_CHARS and "\n" not in line  # one line, the detail cut, the fix kept
    assert line.startswith("the GPU ran out of memory: lower backend.options.gpu_memory_utilization (vLLM's share "
                           "beside the engine), writer_threads or max_concurrent (torch.OutOfMemoryError: CUDA out "
                           "of memory. Tried to allocate 216.00 MiB.")
    assert sample_error(RuntimeError("CUDA error: an illegal memory access")) == (
        "RuntimeError: CUDA error: an illegal memory access")  # other GPU errors keep their own text


def test_a_write_cut_short_leaves_the_next_record_whole(tmp_path, monkeypatch):
    manifest = Manifest(tmp_path / "manifest.jsonl")
    manifest.add({"n": 1})
    real_write = os.write
    calls = []

    def full_disk(fd, data):  # half the record reaches the disk, then it is full
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, bytes(data[: len(data) // 2]))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(TerraInputError, match=r"cannot write .*manifest\.jsonl \(No space left on device\); free disk"):
        manifest.add({"n": 2, "pad": "y" * 100})
    monkeypatch.setattr(os, "write", real_write)
    manifest.add({"n": 3})
    manifest.close()
    assert [r["n"] for r in read_manifest(tmp_path / "manifest.jsonl")] == [1, 3]  # the torn line is skipped
    assert [r["n"] for r in manifest.records] == [1, 2, 3]  # counted all the same
    assert re.fullmatch(r'\{"n": 1\}\n\{"n": 2, "pad": "y+\n\{"n": 3\}\n',
                        (tmp_path / "manifest.jsonl").read_text())


def test_the_lock_is_taken_once_and_refuses_a_second_holder_in_this_process_too(tmp_path):
    manifest = tmp_path / "out" / "manifest.jsonl"
    refused = []

    def acquire_again() -> None:
        with pytest.raises(TerraInputError, match=f"in use by another run \\(pid {os.getpid()} ") as err:
            with output_lock(manifest):
                pass
        refused.append(str(err.value))

    with output_lock(manifest) as path:
        acquire_again()  # the same thread: no re-entry (a run takes its lock once)
        thread = threading.Thread(target=acquire_again)
        thread.start()
        thread.join()
        assert path.exists()
    assert len(refused) == 2 and not (tmp_path / "out").exists()  # the folder it made is gone with the lock


def test_mp4_without_an_ffmpeg_that_runs_exits_2_before_generating(hostile, tmp_path, monkeypatch):
    """A run asked for MP4 where ffmpeg cannot run (here a file that is no program) would generate every rollout
    and fail every write: it stops at the settings check instead."""
    stub = tmp_path / "ffmpeg"
    stub.write_text("not a program")
    monkeypatch.setitem(ENV, "IMAGEIO_FFMPEG_EXE", str(stub))
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    line = one_error_line(rollout(f"samples={hostile.good}", f"image_root={hostile.root}", f"output.dir={out}",
                                  "output.formats=[mp4]", cwd=cwd, timeout=120))
    assert line.startswith("terra-rollout: error: MP4 output needs an ffmpeg") and "IMAGEIO_FFMPEG_EXE" in line, line
    assert not out.exists() and list(cwd.iterdir()) == []


def test_samples_write_over_nothing_of_the_users_and_resume_whatever_the_paths_typed(scenes, hostile, tmp_path):
    """A sample whose file name is a user's file, or whose context lies in output.dir, fails alone; a rerun with
    image_root typed absolute instead of relative finds the finished sample complete (fingerprints of resolved
    paths)."""
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    out.mkdir()
    (out / "mine.mp4").write_bytes(b"the user's video")
    shutil.copytree(scenes["straight"]["folder"], out / "context")
    actions = scenes["straight"]["actions"]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in [
        {"sample_id": "rel", "context": "straight", "actions": actions},
        {"sample_id": "mine", "context": "straight", "actions": actions},
        {"sample_id": "inside", "context": str(out / "context"), "actions": actions}]))
    cwd.mkdir()
    runs = [rollout(f"samples={samples}", f"image_root={root}", f"output.dir={out}",
                    "allow_paths_outside_image_root=true", cwd=cwd)
            for root in (os.path.relpath(hostile.root, cwd), hostile.root)]
    for result, counts in zip(runs, ("1 succeeded, 2 failed, 0 skipped", "0 succeeded, 2 failed, 1 skipped")):
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
        assert counts in result.stdout, result.stdout
        assert ("output.dir holds 'mine.mp4', which the sample would overwrite and which the toolkit did not write "
                "there") in result.stderr
        assert f"output.dir={out} holds the context {out / 'context'}" in result.stderr
    assert (out / "mine.mp4").read_bytes() == b"the user's video" and (out / "rel.mp4").is_file()
    assert sorted(p.name for p in (out / "context").iterdir()) == sorted(
        p.name for p in Path(scenes["straight"]["folder"]).iterdir())
