"""Synthetic clips as driving logs (terra/sim/logs.py): ``terra-make-dataset format=driving_logs`` writes what
``terra-prepare-logs`` reads, every clip used, with the clips' own frames and actions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from terra.core.atomic import MARKER
from terra.core.errors import TerraInputError
from terra.sim import random_clip
from terra.sim.logs import CLIP_RECORD, LOGS_META_FILE, write_driving_logs
from terra.training.shards import read_index, read_shard

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
IDS = ["night-1-00000", "night-1-00001", "night-1-00002"]


def script(name: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", f"terra.apps.{name}", *args], cwd=cwd, env=ENV,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def logs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("logs")
    done = script("make_dataset", "format=driving_logs", "out_dir=logs", "num_clips=3", "num_frames=3",
                  "domain=night", "seed=1", "workers=2", cwd=root)
    assert done.returncode == 0, done.stderr
    assert "wrote 3 clips x 3 frames at 144x256 (night) as driving logs to logs" in done.stdout
    return root / "logs"


def test_the_logs_hold_each_clips_frames_times_and_trajectory(logs):
    assert sorted(p.name for p in logs.iterdir()) == sorted([*IDS, LOGS_META_FILE, MARKER])  # no temporaries
    meta = json.loads((logs / LOGS_META_FILE).read_text())
    assert (meta["domain"], meta["seed"], meta["num_clips"], meta["format"]) == ("night", 1, 3, "driving_logs")
    for i, clip_id in enumerate(IDS):
        clip = random_clip(np.random.default_rng([1, i]), 3, 144, 256, domain="night")
        folder = logs / clip_id
        assert sorted(p.name for p in folder.iterdir()) == [  # the marker: what the toolkit wrote there
            CLIP_RECORD, MARKER, "frame_000.png", "frame_001.png", "frame_002.png", "road.json", "timestamps.txt",
            "trajectory.csv"]
        assert json.loads((folder / CLIP_RECORD).read_text()) == {  # what a rerun compares (tests/sim/test_reruns.py)
            "index": i, "num_frames": 3, "height": 144, "width": 256, "seed": 1, "domain": "night",
            "recipe": "manoeuvres", "road": "road.json"}
        frames = np.stack([np.asarray(Image.open(folder / f"frame_{t:03d}.png")) for t in range(3)])
        np.testing.assert_array_equal(frames, clip.frames)
        assert (folder / "timestamps.txt").read_text().split() == ["0.0", "0.1", "0.2"]
        rows = np.loadtxt(folder / "trajectory.csv", delimiter=",", skiprows=1)
        assert rows[0, 0] == 0.0 and rows[-1, 0] >= 0.2 + 3.0 - 1e-9  # 3 s of poses past the last frame
        np.testing.assert_allclose(np.interp(np.arange(3) / 10, rows[:, 0], rows[:, 1]), clip.poses[:, 0], atol=1e-9)
        assert meta["clips"][i] == {"id": clip_id, "manoeuvre": clip.manoeuvre, "scene_seed": clip.seed,
                                    "start_s": clip.start_s, "speed_kmh": clip.speed_kmh, "scene_length_m": 600.0}


def test_prepare_driving_logs_uses_every_clip_with_its_own_actions(logs):
    done = script("prepare_logs", f"logs={logs}", "output_dir=shards", "device=cpu", "progress=false",
                  cwd=logs.parent)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "3 clips used" in done.stdout and "0 skipped" in done.stdout
    seen = {}
    index = read_index(logs.parent / "shards")
    for entry in index.shards:
        _, actions, _ = read_shard(logs.parent / "shards", index, entry)
        start = 0
        for clip in entry.clips:
            seen[clip.id] = actions[start:start + clip.frames]
            start += clip.frames
    assert sorted(seen) == IDS
    for i, clip_id in enumerate(IDS):
        expected = random_clip(np.random.default_rng([1, i]), 3, 36, 64, domain="night").actions
        np.testing.assert_array_equal(seen[clip_id], expected)


def test_a_rerun_finishes_an_interrupted_run_and_refuses_a_finished_folder(tmp_path):
    out = write_driving_logs(tmp_path / "logs", 2, 2, 36, 64, seed=4, progress=False)
    kept = (out / "day-4-00000" / "frame_000.png").stat().st_mtime_ns
    with pytest.raises(TerraInputError, match="already holds driving logs"):
        write_driving_logs(out, 2, 2, 36, 64, seed=4, progress=False)
    (out / LOGS_META_FILE).unlink()  # as if interrupted before the last clip: one clip folder is missing
    shutil.rmtree(out / "day-4-00001")
    write_driving_logs(out, 2, 2, 36, 64, seed=4, progress=False)
    assert (out / "day-4-00000" / "frame_000.png").stat().st_mtime_ns == kept  # kept, not rendered again
    assert sorted(p.name for p in (out / "day-4-00001").iterdir())[2] == "frame_000.png"


@pytest.mark.parametrize("overrides, match", [
    (["domain=dusk"], "unknown domain 'dusk'; choose one of: day, night"),
    (["format=mp4"], "unknown format 'mp4'; choose one of: shards, driving"),
    (["recipe=long_drives", "num_frames=100000000"], "num_frames must be a whole number from 1 to 10000 (got "
                                                     "100000000); e.g. num_frames=25"),
    (["num_clips=nan"], "num_clips must be a whole number from 1 to 10000000 (got nan)"),
    (["format=driving_logs", "num_frames=30.7"], "num_frames must be a whole number from 1 to 10000 (got 30.7)"),
    (["compress=maybe"], "compress must be true or false (got 'maybe')"),
    (["out_dir=null"], "no out_dir given; pass out_dir=DIR"),
])
def test_make_dataset_bad_settings_are_one_line_and_exit_code_2(tmp_path, overrides, match):
    done = script("make_dataset", "out_dir=out", "num_clips=1", *overrides, cwd=tmp_path)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and match in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_dataset_sizes_have_ranges_and_a_writer_holds_at_most_8_gib(tmp_path):
    """Every size has its range; the frames a writer renders before writing them (a shard of clips_per_shard clips,
    or one clip folder) are bounded, so a long drive at a large size is refused before anything is rendered."""
    from terra.sim.dataset import write_dataset

    cases = [
        (lambda: write_dataset(tmp_path / "a", 64, 10_000, 144, 256, progress=False),
         "a shard of 64 clips of 10000 frames at 144x256 is 65.9 GiB of frames held in memory while it is written, "
         "more than 8 GiB; lower clips_per_shard, num_frames, height or width"),
        (lambda: write_driving_logs(tmp_path / "a", 1, 10_000, 1080, 1920, progress=False),
         "a clip of 10000 frames at 1080x1920 is 57.9 GiB"),
        (lambda: write_dataset(tmp_path / "a", 1, 2, 4097, 64, progress=False), "height must be a whole number from 8"),
        (lambda: write_dataset(tmp_path / "a", 1, 2, 36, 64, workers=1.5, progress=False), "workers must be a whole"),
        (lambda: write_dataset(tmp_path / "a", 1, 2, 36, 64, clips_per_shard=0, progress=False), "clips_per_shard"),
        (lambda: write_driving_logs(tmp_path / "a", True, 2, 36, 64, progress=False), "num_clips must be a whole"),
    ]
    for call, message in cases:
        with pytest.raises(TerraInputError) as err:
            call()
        assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "a").exists()
