"""``terra-score`` end to end on the tiny estimator and small synthetic videos (tests/scoring/
conftest.py): the files ACT-Bench writes, metrics equal to a plain numpy computation from ``results.jsonl``, and
bad input ending with exit code 2, one line on stderr and nothing written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from terra.core.errors import TerraInputError
from terra.scoring.report import COLUMNS
from terra.scoring.run import score
from terra.scoring.settings import ScoringSettings, scoring_settings
from tests.scoring.conftest import APP, ENV, SAMPLE_IDS, copy_inputs, run_score

SUMMARY_KEYS = {"number_of_samples": None, "number_of_samples_per_action_class": None,
                "instruction_fidelity": {"recall", "accuracy"},
                "action_fidelity": {"ADE_per_cond_class", "ADE", "FDE_per_cond_class", "FDE"}}


@pytest.fixture(scope="module")
def scored(inputs, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("scored") / "results"
    return run_score(inputs, out, "batch_size=4", cwd=out.parent), out


def test_the_script_writes_actbenchs_files(scored):
    result, out = scored
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert sorted(p.name for p in out.iterdir()) == [".terra-output.json", "confusion_matrix.png", "results.jsonl",
                                                     "summary.json"]  # the marker: what the toolkit wrote
    summary = json.loads((out / "summary.json").read_text())
    keys = {k: (set(v) if isinstance(v, dict) and SUMMARY_KEYS[k] else None) for k, v in summary.items()}
    assert keys == SUMMARY_KEYS
    assert summary["number_of_samples"] == len(SAMPLE_IDS)  # the row of another class is left out
    assert list(summary["instruction_fidelity"]["recall"]) == sorted(summary["instruction_fidelity"]["recall"])
    assert len(summary["action_fidelity"]["ADE_per_cond_class"]) == 9
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["sample_id"] for r in rows] == SAMPLE_IDS and all(tuple(r) == COLUMNS for r in rows)
    assert all(len(r["estimated_traj"]) == 44 and r["estimated_traj"][0] == [0.0, 0.0] for r in rows)
    assert Path(rows[0]["video_path"]).name == f"NUSCENES_ACTION_{SAMPLE_IDS[0]:06d}.mp4"
    assert (out / "confusion_matrix.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"ACT-Bench score of {len(SAMPLE_IDS)} samples (1 rows of other classes left out, 1 videos of no " \
           "scored sample" in result.stdout
    assert f"instruction accuracy {summary['instruction_fidelity']['accuracy'] * 100:.2f} %" in result.stdout


def test_metrics_equal_numpy_on_the_written_results(scored):
    _, out = scored
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    estimated = np.array([r["estimated_traj"] for r in rows])
    reference = np.array([r["reference_traj_transformed"] for r in rows])
    assert np.array_equal(reference[:, :, 0], -np.array([r["reference_traj"] for r in rows])[:, :44, 1])
    distance = np.linalg.norm(estimated - reference, axis=-1)
    assert np.allclose([r["ade"] for r in rows], distance.mean(axis=1), rtol=1e-12)
    assert np.allclose([r["fde"] for r in rows], distance[:, -1], rtol=1e-12)
    correct = np.array([r["cond_class"] == r["estimated_class"] for r in rows])
    assert summary["instruction_fidelity"]["accuracy"] == pytest.approx(correct.mean(), rel=1e-12)
    assert summary["action_fidelity"]["ADE"] == pytest.approx(distance.mean(), rel=1e-12)
    assert summary["action_fidelity"]["FDE"] == pytest.approx(distance[:, -1].mean(), rel=1e-12)
    for label, recall in summary["instruction_fidelity"]["recall"].items():
        members = [r for r in rows if r["cond_label"] == label]
        expected = np.mean([r["estimated_label"] == label for r in members]) if members else "N/A"
        assert recall == (pytest.approx(expected) if members else expected)


def test_the_same_videos_score_the_same_in_process_with_a_worker(inputs, scored, tmp_path, capsys, monkeypatch):
    """Decoding in a DataLoader worker and another batch size change nothing. On a terminal the run says what it
    is doing before each long stage (loading the estimator, then the videos under their bar)."""
    _, out = scored
    settings = ScoringSettings(videos=inputs.videos, samples=(inputs.samples,), estimator=inputs.estimator,
                               output_dir=tmp_path / "again", batch_size=3, num_workers=1, device="cpu")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    again = score(settings)
    err = capsys.readouterr().err
    assert f"terra-score: loading the estimator from {inputs.estimator} ..." in err
    assert f"scoring {len(SAMPLE_IDS)} videos on cpu (1 decoding workers)" in err
    assert f"{len(SAMPLE_IDS)}/{len(SAMPLE_IDS)}" in err  # the bar over the videos
    first = json.loads((out / "summary.json").read_text())
    assert again.metrics.accuracy == first["instruction_fidelity"]["accuracy"]
    assert again.metrics.ade == pytest.approx(first["action_fidelity"]["ADE"], rel=1e-6)
    assert [p.name for p in again.paths] == ["summary.json", "results.jsonl", "confusion_matrix.png"]


# ------------------------------------------------------------------------------------------------- bad input


def spoil(case: str, copy) -> str:
    """Spoil ``copy`` (tests/scoring/conftest.py: copy_inputs) as ``case`` says; returns text the error names."""
    video = copy.videos / f"NUSCENES_ACTION_{SAMPLE_IDS[5]:06d}.mp4"
    if case == "missing video":
        video.unlink()
        return f"1 of {len(SAMPLE_IDS)} samples have no video"
    if case == "short video":  # the sixth of nine: a later batch, after some were estimated
        frames = np.zeros((40, 48, 80, 3), np.uint8)
        video.unlink()
        from terra.decoder.writers import write_mp4

        write_mp4(video, frames)
        return f"{video} has 40 frames; scoring needs at least 44"
    if case == "wrong naming":
        (copy.videos / "rollout.mp4").symlink_to(video)
        return "rollout.mp4 is not named <name>_<sample_id>.mp4"
    if case == "row without reference_traj":
        rows = [json.loads(line) for line in copy.samples.read_text().splitlines()]
        del rows[2]["reference_traj"]
        copy.samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return f"line 3: sample {SAMPLE_IDS[2]} has no reference_traj"
    weights = copy.estimator / "model.safetensors"
    data = weights.read_bytes()
    weights.unlink()
    if case == "foreign weights":
        weights.write_bytes(data.replace(b"squeeze_linear", b"squeeze_layers"))  # same lengths: a valid file
        return "is not ACT-Bench's VideoActionEstimator: 2 unmatched tensors (first: squeeze_layers.bias"
    if case in ("nan weights", "int32 weights"):
        tensors = safetensors.torch.load(data)
        name = "classifier.3.weight"
        if case == "nan weights":
            tensors[name][1, 2] = float("nan")
        else:
            tensors[name] = tensors[name].int()
        safetensors.torch.save_file(tensors, weights)
        return (f"estimator weights {weights}: tensor {name} holds "
                + ("1 NaN or infinite value(s) of" if case == "nan weights" else "torch.int32 numbers where floating"))
    if case == "pickle that runs code":
        torch.save({"state_dict": RunsCode()}, copy.estimator / "pytorch_model.bin")
        return ("cannot be read (a pickle that would run code, refused: Trying to load unsupported GLOBAL "
                "posix.system whose module posix is blocked.)")
    assert case == "truncated weights"
    weights.write_bytes(data[: len(data) // 3])
    return "cannot be read"


class RunsCode:
    """What a malicious checkpoint holds: unpickling it would run a shell command."""

    def __reduce__(self):
        return os.system, ("echo unpickled",)


CASES = ["missing video", "short video", "wrong naming", "row without reference_traj", "foreign weights",
         "truncated weights", "nan weights", "int32 weights", "pickle that runs code"]


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_and_writes_nothing(inputs, tmp_path, case):
    copy = copy_inputs(inputs, tmp_path / "inputs")
    expected = spoil(case, copy)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("old")  # a previous run's file stays as it was
    settings = ScoringSettings(videos=copy.videos, samples=(copy.samples,), estimator=copy.estimator,
                               output_dir=out, batch_size=2, num_workers=int(case == "short video"), device="cpu")
    with pytest.raises(TerraInputError) as err:
        score(settings)
    assert expected in str(err.value) and "\n" not in str(err.value), str(err.value)
    assert [p.name for p in out.iterdir()] == ["summary.json"] and (out / "summary.json").read_text() == "old"


@pytest.mark.parametrize("case", ["short video", "wrong naming"])
def test_the_script_exits_2_with_one_line(inputs, tmp_path, case):
    copy = copy_inputs(inputs, tmp_path / "inputs")
    expected = spoil(case, copy)
    result = run_score(copy, tmp_path / "out", "num_workers=1", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("terra-score: error: "), result.stderr
    assert expected in result.stderr
    assert not (tmp_path / "out").exists()  # stdout, a log here, has the stages' lines alone (terra/core/progress.py)
    assert all(line.startswith("terra-score: ") and "error" not in line for line in result.stdout.splitlines())


@pytest.mark.parametrize("overrides, message", [
    ([], "no videos given; pass videos=DIR"),
    (["videos=/nonexistent"], "videos='/nonexistent' is not a folder"),
    (["videos=.", "estimator=.", "samples=missing.jsonl"], "samples file missing.jsonl does not exist"),
    (["videos=.", "estimator=.", "samples=empty"], "samples folder empty has no *.jsonl file"),
    (["videos=.", "estimator=.", "samples=s.jsonl"], "no output_dir given"),
    (["videos=v", "estimator=e", "samples=s.jsonl", "output_dir=o", "batch_size=0"], "batch_size must be a whole"),
    (["videos=v", "estimator=e", "samples=s.jsonl", "output_dir=o", "device=gpu"], "device='gpu' is not a device"),
    (["videos=v", "estimator=e", "samples=s.jsonl", "output_dir=o", "dtype=float16"], "unknown dtype 'float16'"),
    # the output folder (terra/config/output_dir.py): apart from the inputs, replacing only the toolkit's files
    (["videos=v", "estimator=e", "samples=in/results.jsonl", "output_dir=in"], "holds the samples in/results.jsonl"),
    (["videos=v", "estimator=e", "samples=in", "output_dir=in"], "is the samples (in), which the run reads"),
    (["videos=v", "estimator=e", "samples=s.jsonl", "output_dir=v/scores"], "lies inside the videos folder v"),
    (["videos=v", "estimator=e", "samples=s.jsonl", "output_dir=p"], "holds a folder 'summary.json' where the run"),
    (["videos=v", "estimator=e", "samples=s.jsonl", "output_dir=/proc"], "is not on a disk"),
])
def test_settings_are_checked_before_anything_loads(tmp_path, monkeypatch, overrides, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.jsonl").write_text("")
    for folder in ("empty", "v", "e", "in", "p/summary.json"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "in" / "results.jsonl").write_text("")
    cfg = {"videos": None, "samples": None, "estimator": None, "output_dir": None, "batch_size": 16,
           "num_workers": 8, "device": "auto", "dtype": "auto", "num_threads": None, "progress": True,
           "dry_run": False}
    cfg.update(dict(o.split("=", 1) for o in overrides))
    cfg["batch_size"] = int(cfg["batch_size"])
    with pytest.raises(TerraInputError) as err:
        scoring_settings(cfg)
    assert message in str(err.value)


def test_an_unknown_setting_exits_2_before_torch(tmp_path):
    result = subprocess.run([sys.executable, "-m", APP, "+score=true"], cwd=tmp_path, env=ENV, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "unknown setting 'score'" in result.stderr and list(tmp_path.iterdir()) == []


def test_the_settings_check_loads_no_torch():
    code = "import sys, terra.scoring.settings; assert 'torch' not in sys.modules, 'torch was imported'"
    result = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------------------- dry run


def dry_run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", APP, "dry_run=true", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


def test_a_dry_run_checks_videos_and_estimator_without_weights_or_output(inputs, tmp_path):
    result = dry_run(f"videos={inputs.videos}", f"samples={inputs.samples}", f"estimator={inputs.estimator}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and list(tmp_path.iterdir()) == []  # no output_dir needed, nothing written
    lines = result.stdout.splitlines()
    assert lines[0] == "terra-score dry run: ready to score"
    assert lines[1].startswith(f"estimator: {inputs.estimator} has model.safetensors (not loaded); 44 frames")
    assert f"samples: {len(SAMPLE_IDS)} of 9 classes in {inputs.samples} (1 rows of other classes left out" in lines[2]
    assert lines[3].startswith(f"videos: {len(SAMPLE_IDS)} of {len(SAMPLE_IDS)} samples' videos in {inputs.videos}, "
                               f"{len(SAMPLE_IDS)} with at least 44 frames; 1 videos of no scored sample")


def test_a_dry_run_lists_what_is_missing_and_points_to_the_measure_without_weights(inputs, tmp_path, bench):
    copy = copy_inputs(inputs, tmp_path / "spoiled")
    (copy.videos / f"NUSCENES_ACTION_{SAMPLE_IDS[0]:06d}.mp4").unlink()
    short = copy.videos / f"NUSCENES_ACTION_{SAMPLE_IDS[1]:06d}.mp4"
    short.unlink()
    bench.write_mp4(short, bench.synthetic_frames(30, 48, 80, seed=1))  # 30 frames: the estimator scores 44
    broken = copy.videos / f"NUSCENES_ACTION_{SAMPLE_IDS[2]:06d}.mp4"
    broken.unlink()  # a hard link to the shared input: replaced, not written into
    broken.write_bytes(b"not a video")
    result = dry_run(f"videos={copy.videos}", f"samples={copy.samples}", cwd=tmp_path)  # no estimator at all
    assert result.returncode == 2
    assert result.stderr == "terra-score: error: the dry run found 4 problem(s), listed above\n"
    head = result.stdout.splitlines()[0]
    assert head.startswith("terra-score dry run: not ready, 4 problem(s): no estimator (not given): hf download "
                           "turing-motors/ACT-Estimator --local-dir ACT-Estimator; ")
    assert f"1 samples have no video (first: sample {SAMPLE_IDS[0]}; expected e.g. NUSCENES_ACTION_" in head
    assert f"1 videos are shorter than the 44 frames the estimator scores (first: {short.name} (30 frames))" in head
    assert f"1 videos cannot be read (first: video {broken} cannot be read (" in head, head
    assert "terra-evaluate measures a world model against the synthetic world" in result.stdout
