"""A rerun of ``terra-make-dataset`` into the folder a killed run left (terra/sim/dataset.py): the shards and clip
folders made with the rerun's settings are kept (not rendered again), the killed run's others are removed with one
line, the folder's ``meta.json`` / ``clips.json`` lists exactly what it holds, and a folder the toolkit did not write
is refused and left as it was.

A kill is simulated deterministically: the writer of one shard or clip folder stops the run once N are written
(``workers=1`` writes them in this process, in order).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import terra.sim.dataset as dataset
import terra.sim.logs as logs
from terra.core.atomic import MARKER
from terra.core.errors import TerraInputError
from terra.sim import random_clip
from terra.sim.clips import Drive
from terra.sim.dataset import META_FILE, ClipDataset, write_dataset
from terra.sim.logs import CLIP_RECORD, LOGS_META_FILE, write_driving_logs

H, W = 16, 24


class Killed(BaseException):
    """The run's end at a kill (no handler of the writers catches it)."""


def kill_after(monkeypatch, module, name: str, count: int) -> None:
    """Make ``module.name``, the writer of one output, stop the run once ``count`` outputs are written."""
    write, written = getattr(module, name), []

    def writer(*args):
        if len(written) == count:
            raise Killed
        written.append(args[0])
        return write(*args)

    monkeypatch.setattr(module, name, writer)


@pytest.fixture
def renders(monkeypatch) -> list[int]:
    """The frames of every clip rendered from now on (a kept output renders none)."""
    rendered, render = [], Drive.render

    def counted(self, num_frames, height, width):
        rendered.append(num_frames)
        return render(self, num_frames, height, width)

    monkeypatch.setattr(Drive, "render", counted)
    return rendered


def killed_shards(out: Path, monkeypatch, **settings) -> None:
    """A shards run of 8 clips, one a shard, killed after 3 shards."""
    with monkeypatch.context() as patch:
        kill_after(patch, dataset, "_write_shard", 3)
        with pytest.raises(Killed):
            write_dataset(out, 8, 2, H, W, clips_per_shard=1, progress=False, **settings)
    assert sorted(p.name for p in out.glob("shard-*")) == [f"shard-0000{k}.npz" for k in range(3)]


def check_dataset(out: Path, num_clips: int, num_frames: int, seed: int = 0) -> None:
    """``meta.json`` lists exactly the shards in the folder, and every clip is the one its settings draw."""
    meta = json.loads((out / META_FILE).read_text())
    assert sorted(p.name for p in out.glob("shard-*")) == [s["file"] for s in meta["shards"]]
    data = ClipDataset(out)
    assert len(data) == num_clips and data.num_frames == num_frames
    for i, clip in enumerate(data):
        expected = random_clip(np.random.default_rng([seed, i]), num_frames, H, W)
        np.testing.assert_array_equal(clip.frames, expected.frames)
        assert (clip.manoeuvre, clip.start_s) == (expected.manoeuvre, expected.start_s)


def test_a_shards_run_killed_after_3_of_8_and_rerun_with_1_clip_keeps_only_its_shard(tmp_path, monkeypatch,
                                                                                    renders, capsys):
    out = tmp_path / "ds"
    killed_shards(out, monkeypatch)
    renders.clear()
    write_dataset(out, 1, 2, H, W, clips_per_shard=1, progress=False)
    assert renders == []  # shard 0 holds the rerun's one clip, made with its settings: kept
    assert sorted(os.listdir(out)) == [MARKER, META_FILE, "shard-00000.npz"]
    check_dataset(out, 1, 2)
    assert capsys.readouterr().err == (f"terra-make-dataset: removed 2 shards that an earlier run left in {out} (2 "
                                       "that this run does not write)\n")


def test_a_shards_rerun_with_other_settings_redoes_the_shards(tmp_path, monkeypatch, renders, capsys):
    out = tmp_path / "ds"
    killed_shards(out, monkeypatch)
    renders.clear()
    write_dataset(out, 3, 3, H, W, clips_per_shard=2, progress=False)
    assert renders == [3, 3, 3]
    assert sorted(p.name for p in out.glob("shard-*")) == ["shard-00000.npz", "shard-00001.npz"]
    check_dataset(out, 3, 3)
    assert capsys.readouterr().err == (f"terra-make-dataset: removed 3 shards that an earlier run left in {out} (2 "
                                       "made with other end, num_frames, start; 1 that this run does not write)\n")


def test_a_shards_rerun_with_the_same_settings_keeps_the_finished_shards(tmp_path, monkeypatch, renders, capsys):
    out = tmp_path / "ds"
    killed_shards(out, monkeypatch, seed=3)
    renders.clear()
    write_dataset(out, 8, 2, H, W, clips_per_shard=1, seed=3, progress=False)
    assert renders == [2] * 5  # the 5 shards the killed run did not write
    check_dataset(out, 8, 2, seed=3)
    assert capsys.readouterr().err == ""


def killed_logs(out: Path, monkeypatch, **settings) -> None:
    """A driving-logs run of 4 clips of 2 frames, killed after 2 clip folders."""
    with monkeypatch.context() as patch:
        kill_after(patch, logs, "_write_clip", 2)
        with pytest.raises(Killed):
            write_driving_logs(out, 4, 2, H, W, progress=False, **settings)
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["day-0-00000", "day-0-00001"]


def check_logs(out: Path, num_clips: int, num_frames: int, recipe: str = "manoeuvres") -> None:
    """``clips.json`` lists exactly the clip folders, each of ``num_frames`` frames made with the run's settings."""
    meta = json.loads((out / LOGS_META_FILE).read_text())
    folders = sorted(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert [clip["id"] for clip in meta["clips"]] == folders and len(folders) == num_clips
    assert (meta["num_frames"], meta["recipe"]) == (num_frames, recipe)
    for i, name in enumerate(folders):
        frames = sorted((out / name).glob("frame_*.png"))
        assert len(frames) == num_frames and np.asarray(Image.open(frames[0])).shape == (H, W, 3)
        record = json.loads((out / name / CLIP_RECORD).read_text())
        assert (record["index"], record["num_frames"], record["recipe"]) == (i, num_frames, recipe)
    assert not [p for p in out.iterdir() if p.name.endswith((".tmp", ".old"))]


@pytest.mark.parametrize("settings, said", [
    ({"num_frames": 3}, "2 made with other num_frames"),
    ({"num_clips": 1, "recipe": "long_drives"}, "1 made with other recipe; 1 that this run does not write"),
])
def test_a_driving_logs_rerun_with_other_settings_removes_the_killed_runs_clip_folders(tmp_path, monkeypatch, renders,
                                                                                      capsys, settings, said):
    out = tmp_path / "logs"
    killed_logs(out, monkeypatch)
    renders.clear()
    run = {"num_clips": 4, "num_frames": 2, "recipe": "manoeuvres", **settings}
    write_driving_logs(out, run["num_clips"], run["num_frames"], H, W, recipe=run["recipe"], progress=False)
    if run["recipe"] == "manoeuvres":
        assert renders == [run["num_frames"]] * run["num_clips"]  # none kept
    check_logs(out, run["num_clips"], run["num_frames"], run["recipe"])
    assert capsys.readouterr().err == (f"terra-make-dataset: removed 2 clip folders that an earlier run left in {out} "
                                       f"({said})\n")


def test_a_driving_logs_rerun_with_the_same_settings_keeps_the_finished_clips(tmp_path, monkeypatch, renders, capsys):
    out = tmp_path / "logs"
    killed_logs(out, monkeypatch)
    kept = (out / "day-0-00000" / "frame_000.png").stat().st_mtime_ns
    renders.clear()
    write_driving_logs(out, 4, 2, H, W, progress=False)
    assert renders == [2, 2]  # clips 2 and 3 only
    assert (out / "day-0-00000" / "frame_000.png").stat().st_mtime_ns == kept
    check_logs(out, 4, 2)
    assert capsys.readouterr().err == ""


def test_a_folder_the_toolkit_did_not_write_is_refused_and_left(tmp_path, monkeypatch):
    out = tmp_path / "logs"
    killed_logs(out, monkeypatch)
    (out / "my_drive").mkdir()
    (out / "my_drive" / "frame_000.png").write_bytes(b"mine")
    with pytest.raises(TerraInputError) as err:
        write_driving_logs(out, 1, 3, H, W, progress=False)
    assert str(err.value) == (f"out_dir={out} holds 'my_drive', which terra-make-dataset did not write and which would "
                              "be mistaken for its clip folders; move it away or choose another out_dir")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "day-0-00000", "day-0-00001", "my_drive"]  # nothing removed, the stale folders neither
    assert (out / "my_drive" / "frame_000.png").read_bytes() == b"mine"
    shards = tmp_path / "ds"
    killed_shards(shards, monkeypatch)
    os.replace(shards / "shard-00002.npz", shards / "shard-00009.npz")  # a name the killed run did not write
    with pytest.raises(TerraInputError, match=re.escape("holds 'shard-00009.npz', which this run would overwrite and "
                                                        "which the toolkit did not write there")):
        write_dataset(shards, 1, 2, H, W, progress=False)
    assert (shards / "shard-00009.npz").is_file() and (shards / "shard-00001.npz").is_file()
