"""Batch rollouts (terra.batch, terra-rollout) on the shipped demo models with the Transformers backend.

Resume after SIGKILL, per-sample failures with exit code 1, sharding. Kept small (two generated frames, a few
samples, one torch thread) so the file runs in about a minute on two shared CPU cores.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from terra.batch import BatchConfig, check_config, plan_batch, read_manifest, run_batch, shard_indices
from terra.config.sampling import DRAW_RULE
from terra.core.atomic import MARKER
from terra.core.errors import TerraInputError
from terra.inputs.samples import read_samples

ROOT = Path(__file__).resolve().parents[2]
APP = "terra.apps.rollout"  # terra-rollout
NUM_CONTEXT = 3
NUM_FRAMES = 2
TOTAL = NUM_CONTEXT + NUM_FRAMES
TEMP_NAME = re.compile(r"^\..*\.tmp(\.[^.]*)?$")


@pytest.fixture(scope="module")
def scenes(tmp_path_factory) -> dict:
    """Context PNGs of two synthetic-world clips (folder ``root``) with their trajectories and actions."""
    from terra.sim import Scene, make_clip

    root = tmp_path_factory.mktemp("rollout_images")
    scenes = {}
    for seed, manoeuvre in enumerate(["curve_left", "straight"]):
        clip = make_clip(Scene.generate(seed), manoeuvre, TOTAL + 1, 144, 256)
        folder = root / manoeuvre
        folder.mkdir()
        for t in range(NUM_CONTEXT):
            iio.imwrite(folder / f"{t:02d}.png", clip.frames[t])
        scenes[manoeuvre] = {
            "files": [f"{manoeuvre}/{t:02d}.png" for t in range(NUM_CONTEXT)], "folder": str(folder),
            "instruction_trajs": np.round(clip.instruction_trajs, 3).tolist(),
            "actions": np.round(clip.actions, 4).tolist(),
        }
    scenes["root"] = str(root)
    return scenes


def actbench_line(scenes: dict, sample_id, name: str = "curve_left", **extra) -> str:
    scene = scenes[name]
    return json.dumps({"sample_id": sample_id, "label": f"{name}/test", "context_frames": scene["files"],
                       "instruction_trajs": scene["instruction_trajs"], **extra})


def terra_line(scenes: dict, sample_id, name: str = "straight", **trajectory) -> str:
    trajectory = trajectory or {"actions": scenes[name]["actions"]}
    return json.dumps({"sample_id": sample_id, "context": scenes[name]["folder"], **trajectory})


def mixed_lines(scenes: dict, count: int) -> list[str]:
    forms = [
        lambda i: actbench_line(scenes, f"s{i}"),
        lambda i: terra_line(scenes, f"s{i}"),
        lambda i: terra_line(scenes, f"s{i}", manoeuvre={"name": "curve_right", "speed_kmh": 25}),
    ]
    return [forms[i % len(forms)](i) for i in range(count)]


def script_args(samples: Path, out: Path, scenes: dict, *extra: str) -> list[str]:
    return [sys.executable, "-m", APP, f"samples={samples}", f"output.dir={out}", f"image_root={scenes['root']}",
            "backend=hf", "device=cpu", f"num_frames={NUM_FRAMES}", f"num_context={NUM_CONTEXT}", "num_threads=1",
            "progress=false", *extra]


def script_env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def check_outputs(out: Path, ids: list[str], formats=("mp4", "gif")) -> None:
    """Every sample has complete videos (TOTAL frames) and a sidecar; nothing else but the manifest is there."""
    expected = {f"{i}.{ext}" for i in ids for ext in (*formats, "json")} | {"manifest.jsonl", "manifest.summary.json",
                                                                           MARKER}  # what the toolkit wrote there
    names = set(os.listdir(out))
    assert names == expected, (sorted(names - expected), sorted(expected - names))
    assert not [n for n in names if TEMP_NAME.match(n)]
    for sample_id in ids:
        for ext in formats:
            frames = iio.imread(out / f"{sample_id}.{ext}", index=None)
            assert frames.shape == (TOTAL, 144, 256, 3), (sample_id, ext, frames.shape)
        sidecar = json.loads((out / f"{sample_id}.json").read_text())
        assert sidecar["sample_id"] == sample_id
        assert sidecar["batch"]["complete"] and sidecar["batch"]["frames"] == TOTAL
        assert isinstance(sidecar["engine_options"], dict)  # what the engine ran with (the configuration: "config")
        assert sidecar["num_generated"] == NUM_FRAMES and sorted(sidecar["files"]) == sorted(
            f"{sample_id}.{ext}" for ext in formats)


def statuses(records: list[dict]) -> dict:
    return {r["sample_id"]: r["status"] for r in records}


@pytest.mark.slow
def test_resume_after_sigkill(tmp_path, scenes):
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(mixed_lines(scenes, 5)) + "\n")
    ids = [f"s{i}" for i in range(5)]
    out = tmp_path / "out"
    manifest = out / "manifest.jsonl"
    args = script_args(samples, out, scenes, "output.formats=[mp4,gif]")

    # One rollout at a time, killed once the first sample is recorded as done.
    proc = subprocess.Popen([*args, "max_concurrent=1"], cwd=ROOT, env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (manifest.is_file() and any(r["status"] == "ok" for r in read_manifest(manifest))):
            assert proc.poll() is None, f"finished before it could be killed:\n{proc.stdout.read().decode()}"
            assert time.monotonic() < deadline, "no sample finished in time"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    first = statuses(read_manifest(manifest))
    done = {i for i, s in first.items() if s == "ok"}
    assert 1 <= len(done) < len(ids)
    untouched = {i: (out / f"{i}.mp4").stat().st_mtime_ns for i in done}
    # A writer killed mid-file (here on another node) leaves a temporary next to its target; the rerun removes it.
    (out / ".s4.node-2-4242.k1lled_0.tmp.mp4").write_bytes(b"partial")

    rerun = subprocess.run([*args, "max_concurrent=4"], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                           timeout=240)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    records = read_manifest(manifest)
    assert sorted(r["sample_id"] for r in records) == ids  # each sample exactly once
    final = statuses(records)
    assert {i for i, s in final.items() if s == "skipped"} >= done
    assert set(final.values()) <= {"ok", "skipped"}
    assert f"{list(final.values()).count('ok')} succeeded, 0 failed, " in rerun.stdout
    check_outputs(out, ids)
    assert all((out / f"{i}.mp4").stat().st_mtime_ns == t for i, t in untouched.items())  # not regenerated
    seeds = {r["sample_id"]: r["seed"] for r in records}
    assert seeds == {f"s{i}": i for i in range(5)}  # seed + line index, whichever run made it
    summary = json.loads((out / "manifest.summary.json").read_text())
    assert summary["exit_code"] == 0 and summary["counts"]["failed"] == 0


@pytest.mark.slow
def test_failures_are_recorded_and_the_rest_succeeds(tmp_path, scenes):
    lines = [
        actbench_line(scenes, 0),
        '{"sample_id": 1, "context_frames": ["a.png"',  # line 2: malformed JSON
        actbench_line(scenes, 2, context_frames=["curve_left/00.png", "curve_left/missing.png"]),
        terra_line(scenes, 3, actions=[[0.0, 1.0, 0.45]] * 6),  # wrong shape
        "",
        terra_line(scenes, 5, manoeuvre="straight"),
    ]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    run = subprocess.run(script_args(samples, out, scenes, "max_concurrent=4"), cwd=ROOT, env=script_env(),
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "2 succeeded, 3 failed, 0 skipped" in run.stdout
    assert "line 2: malformed JSON" in run.stderr and "missing.png" in run.stderr
    records = read_manifest(out / "manifest.jsonl")
    assert len(records) == 5
    by_line = {r["line"]: r for r in records}
    assert by_line[2]["status"] == "failed" and by_line[2]["stage"] == "parse" and by_line[2]["sample_id"] is None
    assert by_line[2]["error"].startswith("line 2: malformed JSON")
    assert by_line[3]["status"] == "failed" and by_line[3]["stage"] == "input" and "missing.png" in by_line[3]["error"]
    assert by_line[4]["status"] == "failed" and "[frames, 6, 3]" in by_line[4]["error"]
    assert all("\n" not in r["error"] for r in records if r["error"])
    assert by_line[1]["status"] == by_line[6]["status"] == "ok" and by_line[1]["seconds"] > 0
    assert sorted(os.listdir(out)) == sorted(["0.mp4", "0.json", "5.mp4", "5.json", "manifest.jsonl",
                                              "manifest.summary.json", MARKER])
    for sample_id in (0, 5):
        assert iio.imread(out / f"{sample_id}.mp4", index=None).shape[0] == TOTAL


def test_shards_cover_every_line_once(tmp_path, scenes):
    lines = mixed_lines(scenes, 7)
    lines[3] = "not json"
    lines.insert(5, "")
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(lines) + "\n")
    wanted = [n for n, line in enumerate(lines, start=1) if line.strip()]
    for num_shards in range(1, 5):
        seen = []
        for shard in range(num_shards):
            assert shard_indices(len(lines), shard, num_shards) == list(range(shard, len(lines), num_shards))
            config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), shard_index=shard,
                                 num_shards=num_shards, image_root=scenes["root"])
            the_plan = plan_batch(config.spec())
            seen += [s.line for s in the_plan.samples]
            assert len(the_plan.to_run) + len(the_plan.failed) == len(the_plan.samples)
        assert sorted(seen) == wanted, num_shards


def test_config_errors_raise_before_any_work(tmp_path, scenes):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(actbench_line(scenes, 0) + "\n")
    # a sample that can run: the settings are checked against the model too (a batch of refused samples stops first)
    good = dict(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"], num_frames=2)
    for bad, message in [
        (dict(shard_index=2, num_shards=2), "shard_index=2"),
        (dict(max_concurrent=0), "max_concurrent"),
        (dict(writer_threads=0), "output.writer_threads"),
        (dict(naming="nope"), "naming"),
        (dict(video_pattern="video.{ext}"), "{sample_id}"),
        (dict(formats=["avi"]), "output.formats"),
        (dict(samples=str(tmp_path / "missing.jsonl")), "does not exist"),
        (dict(resize="squash"), "tokenizer.resize 'squash'"),
        (dict(zero_embed_code_0="no"), "model.zero_embed_code_0 must be true or false"),
        (dict(overlap=16), "model.overlap=16 does not fit a window of 16 frames"),  # the demo model's window
        (dict(max_concurrent="all"), "max_concurrent must be a whole number"),
        (dict(memory="8GiB"), "unknown memory '8GiB'; choose one of: full, auto, 16GiB, 24GiB"),
        (dict(executor="dask"), "unknown executor 'dask'; choose one of: local, ray"),
        (dict(executor="ray", ray={"num_actor": 2}), "unknown ray setting(s) ['num_actor']"),
        (dict(executor="ray", ray={"max_retries": -1}), "ray.max_retries must be a whole number from 0 to 100"),
        (dict(executor="ray", ray={"cpus_per_actor": 0}), "ray.cpus_per_actor must be a number above 0"),
        (dict(executor="ray", ray={"runtime_env": "env.yaml"}), "ray.runtime_env must be a mapping"),
        (dict(executor="ray", ray={"log_to_driver": "yes"}), "ray.log_to_driver must be true or false"),
    ]:
        with pytest.raises(TerraInputError, match=re.escape(message)):
            config = BatchConfig(**{**good, **bad})
            check_config(config)
            run_batch(config)
    assert not (tmp_path / "out").exists()
    assert [s.error for s in read_samples(samples)] == [None]


def test_the_memory_preset_reaches_the_run(tmp_path):
    """The Python API takes ``memory`` as terra-rollout's ``memory=`` does (terra/config/memory.py)."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"))
    assert config.spec().run.memory == "full"
    assert dataclasses.replace(config, memory="16GiB").spec().run.memory == "16GiB"


def test_zero_embed_code_0_and_resize_are_part_of_the_fingerprint(tmp_path, scenes):
    """Both change a sample's codes, so finished samples made with the other value are generated again."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text(actbench_line(scenes, 0) + "\n")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"])
    fingerprints = {plan_batch(dataclasses.replace(config, **change).spec()).items[0].fingerprint
                    for change in ({}, {"zero_embed_code_0": True}, {"resize": "stretch"})}
    assert len(fingerprints) == 3
    again = dataclasses.replace(config).spec()
    assert plan_batch(again).items[0].fingerprint in fingerprints  # stable for equal settings


def test_decoding_is_not_part_of_the_fingerprint(tmp_path, scenes):
    """Speculative and sequential decoding give the same codes for the same seed (terra/generation/speculative.py),
    so a run resumed with other decoding settings keeps its finished samples; the temperature does count."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text(actbench_line(scenes, 0) + "\n")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"])
    fingerprints = {plan_batch(dataclasses.replace(config, sampling=sampling).spec()).items[0].fingerprint
                    for sampling in ({}, {"decoding": "sequential"}, {"decoding": "speculative", "draft_tokens": 7})}
    assert len(fingerprints) == 1
    warmer = dataclasses.replace(config, sampling={"temperature": 0.5})
    assert plan_batch(warmer.spec()).items[0].fingerprint not in fingerprints


@pytest.mark.parametrize("settings, expected", [
    ({}, "ae0165e0f7a94404ec899003df1cd77f"),
    ({"sampling": {"temperature": 0.5, "top_k": 10}, "resize": "stretch", "zero_embed_code_0": True,
      "formats": ["gif", "mp4"], "fps": 5, "mark_context": True, "default_manoeuvre": "straight"},
     "fdb9b7129535773f1dcfee66ed3749d3"),
    ({"decoder": "refiner", "refiner": {"preset": "fast", "num_steps": 4}}, "2db12e6fbd28cf823b568648b155733e"),
])
def test_a_samples_fingerprint_is_the_one_it_had_before_the_rule_moved(tmp_path, settings, expected):
    """The batch's fingerprints start from the run's rule (terra/config/spec.py, ``RunSpec.output_settings`` and
    ``fingerprint``) and are byte for byte those of the releases before it, so a resumed run keeps its samples. The
    values changed since: with the draw rule (``DRAW_RULE``: the Transformers backend's noise became a hash of seed,
    frame, position and code), whose files a resumed run draws again rather than mixing two rules; and when they came
    to cover the content of the files a sample reads and the checkpoints' digests (here made-up digests), so that a
    sample made from other inputs or by another model or tokenizer is made again."""
    from terra.batch import made_from
    from terra.config.spec import fingerprint

    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"sample_id": "s0", "context_frames": ["a.png", "b.png", "c.png"],
                                   "manoeuvre": "curve_left"}) + "\n")
    [sample] = read_samples(samples)
    spec = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), **settings).spec()
    checkpoints = {"world_model": "cd" * 16, "tokenizer": "ef" * 16}
    assert fingerprint(made_from(spec, sample, 7, 12, ["ab" * 32] * 3, checkpoints)) == expected


def test_renamed_settings_keep_the_fingerprints(tmp_path):
    """decoder= (was decoding=) and sampling.draft_tokens (was block_size) renamed settings, not what shapes a
    sample: the fingerprinted settings are the words of the fingerprints written before (decoder=refiner as
    "decoding": "refiner", draft_tokens left out), so a finished sample is not made again for a rename."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    refiner = {"path": "refiner_model.pt", "preset": "tiny", "num_steps": 2, "guidance": "published",
               "arithmetic": "published"}
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), decoder="refiner", refiner=refiner,
                         sampling={"temperature": 0.9, "decoding": "speculative", "draft_tokens": 8})
    assert config.spec().generation_settings() == {
        "num_context": 3, "overlap": 3, "zero_embed_code_0": False, "resize": "crop",
        "sampling": {"temperature": 0.9, "top_k": 0, "top_p": 1.0, "rule": DRAW_RULE},
        "formats": ["mp4"], "fps": 10.0, "mark_context": False, "overlay_trajectory": False, "save_codes": False,
        "default_manoeuvre": None,
        "decoding": "refiner", "refiner": {"preset": "tiny", "num_steps": 2, "guidance": "published",
                                           "arithmetic": "published"}}
    tokenizer = dataclasses.replace(config, decoder="tokenizer").spec().generation_settings()
    assert "decoding" not in tokenizer and "decoder" not in tokenizer and "refiner" not in tokenizer


def test_the_draw_rule_is_part_of_the_fingerprint(tmp_path, scenes, monkeypatch):
    """Samples drawn by another noise rule (an earlier release's) are made again on resume, never kept beside
    samples of this rule."""
    import terra.config.sampling

    samples = tmp_path / "samples.jsonl"
    samples.write_text(actbench_line(scenes, 0) + "\n")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"])
    before = plan_batch(config.spec()).items[0].fingerprint
    monkeypatch.setattr(terra.config.sampling, "DRAW_RULE", "an earlier rule")
    assert plan_batch(config.spec()).items[0].fingerprint != before


@pytest.fixture(scope="module")
def demo_pipeline(single_thread):
    from terra.pipeline import WorldModelPipeline

    pipeline = WorldModelPipeline.from_pretrained("demo", backend="hf", device="cpu")
    yield pipeline
    pipeline.close()


@pytest.mark.slow
def test_two_shards_with_actbench_names(tmp_path, scenes, demo_pipeline):
    samples = tmp_path / "act_bench.jsonl"
    samples.write_text("\n".join(actbench_line(scenes, i, ["curve_left", "straight"][i % 2]) for i in range(4)))
    out = tmp_path / "videos"
    runs = []
    for shard in range(2):
        config = BatchConfig(samples=str(samples), output_dir=str(out), image_root=scenes["root"], backend="hf",
                             num_frames=1, num_context=NUM_CONTEXT, naming="actbench", shard_index=shard,
                             num_shards=2, progress=False)
        runs.append(run_batch(config, pipeline=demo_pipeline))
    assert [r.exit_code for r in runs] == [0, 0]
    assert [sorted(r["sample_id"] for r in run.records) for run in runs] == [[0, 2], [1, 3]]
    assert runs[1].manifest.name == "manifest.shard-1-of-2.jsonl"
    videos = sorted(out.glob("*.mp4"))
    # ACT-Bench's scorer takes the sample id from the "_<digits>" suffix of each *.mp4 in the folder.
    assert [int(re.search(r"_(\d+)$", v.stem).group(1)) for v in videos] == [0, 1, 2, 3]
    assert all(iio.imread(v, index=None).shape[0] == NUM_CONTEXT + 1 for v in videos)
    again = run_batch(config, pipeline=demo_pipeline)  # shard 1 again: complete, nothing generated
    assert again.counts == {"ok": 0, "failed": 0, "skipped": 2} and again.exit_code == 0
    longer = run_batch(dataclasses.replace(config, num_frames=2), pipeline=demo_pipeline)  # other settings: redone
    assert longer.counts == {"ok": 2, "failed": 0, "skipped": 0}
    assert iio.imread(out / "NUSCENES_ACTION_000003.mp4", index=None).shape[0] == NUM_CONTEXT + 2
    assert iio.imread(out / "NUSCENES_ACTION_000002.mp4", index=None).shape[0] == NUM_CONTEXT + 1  # shard 0's


def test_a_kept_sample_cut_short_or_swapped_is_made_again(tmp_path, scenes, demo_pipeline, capsys):
    """A finished sample's video cut to 64 bytes, or another sample's video in its place: the rerun makes it again,
    in one line saying why, and keeps the whole one."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(terra_line(scenes, f"s{i}") for i in range(2)) + "\n")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"],
                         backend="hf", num_frames=1, num_context=NUM_CONTEXT, progress=False, formats=("mp4", "png"))
    assert run_batch(config, pipeline=demo_pipeline).counts["ok"] == 2
    assert run_batch(config, pipeline=demo_pipeline).counts["skipped"] == 2  # whole: kept, PNG folders too
    first, second = tmp_path / "out" / "s0.mp4", tmp_path / "out" / "s1.mp4"
    whole = second.read_bytes()
    first.write_bytes(first.read_bytes()[:64])
    capsys.readouterr()
    again = run_batch(config, pipeline=demo_pipeline)
    assert again.counts == {"ok": 1, "failed": 0, "skipped": 1}
    assert "terra-rollout: 1 sample redone: its files are not whole" in capsys.readouterr().err
    assert iio.imread(first, index=None).shape[0] == NUM_CONTEXT + 1 and second.read_bytes() == whole
    second.write_bytes(first.read_bytes())  # a foreign video of the right form
    assert run_batch(config, pipeline=demo_pipeline).counts == {"ok": 1, "failed": 0, "skipped": 1}


def test_a_run_shows_generated_frames_and_samples_written(tmp_path, scenes, demo_pipeline, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: bars (none off one: terra/core/progress.py)
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(mixed_lines(scenes, 3)) + "\n")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"],
                         backend="hf", num_frames=NUM_FRAMES, num_context=NUM_CONTEXT, progress=True)
    assert run_batch(config, pipeline=demo_pipeline).exit_code == 0
    err = capsys.readouterr().err
    assert "generated frames: 100%" in err and f"| {3 * NUM_FRAMES}/{3 * NUM_FRAMES} [" in err and "frame/s" in err
    assert "samples written: 100%" in err and "| 3/3 [" in err and "ok=3, failed=0" in err
