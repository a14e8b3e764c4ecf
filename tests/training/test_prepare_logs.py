"""terra-prepare-logs on synthetic driving logs made here (terra/inputs/driving_logs.py: the rules).

Three good clips, each run through the script as a subprocess with the demo tokenizer on the CPU: PNG frames at
12 Hz with ``timestamps.txt`` and CSV poses on the same clock, an MP4 at 20 fps with JSON poses, PNG frames at
10 Hz with a per-frame actions ``.npy``. The shards must hold exactly the nearest frames at each 10 Hz tick,
encoded as the tokenizer encodes them after the crop of tokenizer/resize.py, and the actions ``load_actions``
computes for those frames. Then: a rerun writes nothing, another tokenizer is refused, bad clips are skipped
with one line each, bad settings end with one line and exit code 2 before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import av
import imageio.v3 as iio
import numpy as np
import pytest
from PIL import Image

from terra.core.atomic import MARKER
from terra.core.errors import TerraInputError
from terra.inputs.actions import load_actions
from terra.inputs.driving_logs import Resampled, resample
from terra.tokenizer import load_tokenizer
from terra.tokenizer.images import frames_to_tensor, load_frames
from terra.tokenizer.resize import fit_frame
from terra.training.prepare_logs import clip_score
from terra.training.shards import read_index, read_shard
from tests.conftest import one_error_line

ROOT = Path(__file__).resolve().parents[2]
APP = "terra.apps.prepare_logs"  # terra-prepare-logs
DEMO_TOKENIZER = ROOT / "terra" / "assets" / "demo" / "tokenizer"
SIZE = (144, 256)  # the demo tokenizer's frames; the logs' frames are larger and get cropped
PROG = "terra-prepare-logs"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
BATCH = 4  # frames per tokenizer call in the runs (and in the expected encodings)


def prepare(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", APP, *args, "device=cpu", f"batch_size={BATCH}"], cwd=cwd,
                          env=ENV, capture_output=True, text=True, timeout=300)


def scene(count: int, seed: int, size: tuple[int, int] = (160, 288)) -> np.ndarray:
    """uint8 ``[count, H, W, 3]``: smooth moving colour bands (video-friendly) plus a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size[0], 0:size[1]].astype(np.float32)
    frames = [np.stack([127 + 120 * np.sin(xx / (9 + c * 3) + i * 0.4 + c + seed) * np.cos(yy / 17) for c in range(3)],
                       -1) + rng.normal(0, 4, (*size, 3)) for i in range(count)]
    return np.clip(frames, 0, 255).astype(np.uint8)


def write_pngs(folder: Path, frames: np.ndarray) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"{i:05d}.png" for i in range(len(frames))]
    for path, frame in zip(paths, frames):
        Image.fromarray(frame).save(path)
    return paths


def write_csv(path: Path, t: np.ndarray, extra: str = "") -> None:
    """Poses of a gentle left curve at 8 m/s: x, y, yaw at times ``t`` (relative to ``t[0]``)."""
    s = t - t[0]
    rows = [",".join(repr(float(v)) for v in (ti, 8 * si, 0.3 * si * si, np.arctan2(0.6 * si, 8.0)))
            for ti, si in zip(t, s)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("t,x,y,yaw\n" + "\n".join(rows) + "\n" + extra)


def nearest(times: np.ndarray) -> np.ndarray:
    """Index of the frame nearest each 10 Hz tick from the first frame's time to the last's."""
    ticks = times[0] + np.arange(int(np.floor((times[-1] - times[0]) * 10 + 1e-6)) + 1) / 10
    return np.abs(times[None, :] - ticks[:, None]).argmin(1)


def encode(tokenizer, frames: np.ndarray) -> np.ndarray:
    return tokenizer.encode(frames_to_tensor(frames), batch_size=BATCH).numpy()


def expected_split(ids: list[str], val_fraction: float = 0.05) -> dict[str, str]:
    """The documented rule: val when SHA-256(id)[:8] / 2^64 < val_fraction; with no val clip among >= 2, the
    clip of the smallest fraction."""
    score = {i: int.from_bytes(hashlib.sha256(i.encode()).digest()[:8], "big") / 2**64 for i in ids}
    split = {i: "val" if score[i] < val_fraction else "train" for i in ids}
    if "val" not in split.values() and len(ids) >= 2:
        split[min(ids, key=score.get)] = "val"
    return split


@pytest.fixture(scope="module")
def tokenizer(single_thread):
    return load_tokenizer(DEMO_TOKENIZER)  # one thread, as the runs (OMP_NUM_THREADS=1)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """Synthetic logs of three good clips → shards (module docstring); what each clip should hold."""
    root = tmp_path_factory.mktemp("prepare")
    logs, expect = root / "logs", {}
    # 1. PNGs at 12 Hz on an absolute clock (timestamps.txt) + CSV poses at 20 Hz from 1 s before the first frame
    clip = logs / "frames_12hz_csv"
    times = 100.0 + np.arange(30) / 12
    paths = write_pngs(clip, scene(30, 1))
    (clip / "timestamps.txt").write_text("\n".join(repr(float(t)) for t in times) + "\n")
    pose_t = np.arange(1980, 2090) / 20  # 99.0 .. 104.45 s
    write_csv(clip / "trajectory.csv", pose_t)
    write_csv(root / "from_first_frame.csv", pose_t)  # the same poses, rows from the first frame's time on
    rows = (root / "from_first_frame.csv").read_text().splitlines()
    (root / "from_first_frame.csv").write_text("\n".join(rows[:1] + rows[21:]) + "\n")
    picked = nearest(times)
    expect[clip.name] = ("images", [paths[i] for i in picked], load_actions(root / "from_first_frame.csv", len(picked)))
    # 2. an MP4 at 20 fps (its own timestamps) + JSON poses at 10 Hz, taken from the first frame on
    clip = logs / "video_json"
    clip.mkdir()
    iio.imwrite(clip / "drive.mp4", scene(30, 2), fps=20, codec="libx264")
    t = 5.0 + np.arange(16) / 10
    (clip / "trajectory.json").write_text(json.dumps({"trajectory": {
        "t": t.tolist(), "x": (6 * (t - 5)).tolist(), "y": (-0.2 * (t - 5) ** 2).tolist()}}))
    expect[clip.name] = ("video", list(range(0, 30, 2)), load_actions(clip / "trajectory.json", 15))
    # 3. PNGs at the default 10 Hz + one action per frame (.npy, any name: the folder's only trajectory file)
    clip = logs / "frames_10hz_actions"
    paths = write_pngs(clip, scene(12, 3))
    actions = np.random.default_rng(3).uniform(-20, 20, (12, 6, 3)).astype(np.float32)
    np.save(clip / "per_frame.npy", actions)
    expect[clip.name] = ("images", paths, actions)
    (logs / "notes.txt").write_text("files beside the clip folders are not read\n")
    (logs / ".cache").mkdir()  # hidden folders are no clips

    result = prepare(f"logs={logs}", f"output_dir={root / 'shards'}", "shard_clips=2", cwd=root)
    assert result.returncode == 0, result.stderr
    return root, result, expect


def clips_in(folder: Path) -> dict[str, tuple[str, np.ndarray, np.ndarray]]:
    """``{id: (split, codes, actions)}`` of every clip of a shard folder."""
    out = {}
    index = read_index(folder)
    for entry in index.shards:
        codes, actions, routes = read_shard(folder, index, entry)
        assert routes is None  # driving logs carry no routes
        start = 0
        for clip in entry.clips:
            out[clip.id] = (entry.split, codes[start:start + clip.frames], actions[start:start + clip.frames])
            start += clip.frames
    return out


def test_the_shards_hold_the_resampled_frames_codes_and_actions(prepared, tokenizer):
    root, result, expect = prepared
    assert result.stderr == ""
    clips = clips_in(root / "shards")
    assert {k: len(v[1]) for k, v in clips.items()} == {"frames_12hz_csv": 25, "video_json": 15,
                                                        "frames_10hz_actions": 12}
    for clip_id, (kind, frames, actions) in expect.items():
        if kind == "images":
            pixels = load_frames(frames, SIZE, resize="crop")
        else:
            with av.open(str(root / "logs" / clip_id / "drive.mp4")) as container:
                decoded = [f.to_image() for f in container.decode(container.streams.video[0])]
            pixels = np.stack([fit_frame(decoded[i], SIZE, resize="crop") for i in frames])
        _, codes, stored = clips[clip_id]
        np.testing.assert_array_equal(codes, encode(tokenizer, pixels), err_msg=clip_id)
        np.testing.assert_array_equal(stored, actions, err_msg=clip_id)


def test_a_clip_reports_each_tokenized_batch(prepared, tokenizer):
    """The frames bar of a run moves within a long clip: tokenize_clip reports every batch it encodes."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from terra.training.prepare_logs import tokenize_clip

    root, _, _ = prepared
    spec = SimpleNamespace(batch_size=5, resize="crop", frame_rate_hz=10.0, min_frames=2, routes="road")
    batches: list[int] = []
    with ThreadPoolExecutor(2) as pool:
        codes, _, _ = tokenize_clip(root / "logs" / "frames_10hz_actions", tokenizer, spec, pool, batches.append)
    assert batches == [5, 5, 2] and len(codes) == 12


def test_the_index_and_the_split_by_clip(prepared):
    root, result, _ = prepared
    index = json.loads((root / "shards" / "index.json").read_text())
    assert {k: index[k] for k in ("version", "codebook_size", "grid", "image_size", "frame_rate_hz", "tokenizer")} == {
        "version": 3, "codebook_size": 1024, "grid": [9, 16], "image_size": [144, 256], "frame_rate_hz": 10.0,
        "tokenizer": str(DEMO_TOKENIZER.resolve())}
    split = expected_split(["frames_10hz_actions", "frames_12hz_csv", "video_json"])
    frames = {"frames_12hz_csv": 25, "video_json": 15, "frames_10hz_actions": 12}
    expected_shards, counters = [], {"train": 0, "val": 0}
    for name in ("train", "val"):  # clips in name order, up to shard_clips=2 per shard of their split
        ids = sorted(i for i in split if split[i] == name)
        for start in range(0, len(ids), 2):
            group = ids[start:start + 2]
            expected_shards.append((name, f"{name}-{counters[name]:05d}.safetensors", group))
            counters[name] += 1
    got = [(e["split"], e["file"], [c["id"] for c in e["clips"]]) for e in index["shards"]]
    assert sorted(got) == sorted(expected_shards)
    assert all(c["frames"] == frames[c["id"]] for e in index["shards"] for c in e["clips"])
    assert sorted(p.name for p in (root / "shards").iterdir()) == sorted(["index.json", MARKER,
                                                                          *(f for _, f, _ in got)])
    train, val = (sum(v == s for v in split.values()) for s in ("train", "val"))
    assert result.stdout.strip().splitlines()[-1] == (
        f"{PROG}: 3 clips used ({train} train, {val} val; 52 frames written), 0 skipped, 0 already done; "
        f"{root / 'shards'} holds {train} train and {val} val clips in {len(got)} shards")


def test_a_rerun_skips_finished_clips_and_writes_nothing(prepared):
    root, _, _ = prepared
    before = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (root / "shards").iterdir()}
    result = prepare(f"logs={root / 'logs'}", f"output_dir={root / 'shards'}", "shard_clips=2", cwd=root)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert "0 clips used (0 train, 0 val; 0 frames written), 0 skipped, 3 already done" in result.stdout
    assert {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in (root / "shards").iterdir()} == before


def test_a_rerun_redoes_the_clips_whose_files_changed_or_whose_shard_was_cut_and_refuses_a_foreign_index(
        prepared, tmp_path):
    """A clip's trajectory changed in place: that clip alone is made again, said in one line. A listed shard cut to
    100 bytes: its clips are made again, not kept as done. Another folder's index.json: refused in one line."""
    root, _, _ = prepared
    shutil.copytree(root / "logs", tmp_path / "logs")
    shutil.copytree(root / "shards", tmp_path / "shards")
    args = [f"logs={tmp_path / 'logs'}", f"output_dir={tmp_path / 'shards'}", "shard_clips=2"]
    actions = np.random.default_rng(4).uniform(-20, 20, (12, 6, 3)).astype(np.float32)
    np.save(tmp_path / "logs" / "frames_10hz_actions" / "per_frame.npy", actions)
    result = prepare(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr == f"{PROG}: 1 clip redone: the clip's files changed\n"
    assert "1 clips used" in result.stdout and "2 already done" in result.stdout
    clips = clips_in(tmp_path / "shards")
    assert sorted(clips) == ["frames_10hz_actions", "frames_12hz_csv", "video_json"]
    assert np.allclose(clips["frames_10hz_actions"][2], actions, atol=1e-4)
    shard = tmp_path / "shards" / read_index(tmp_path / "shards").shards[0].file
    cut = [c.id for c in read_index(tmp_path / "shards").shards[0].clips]
    shard.write_bytes(shard.read_bytes()[:100])
    result = prepare(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"{PROG}: {len(cut)} clip{'s' * (len(cut) > 1)} redone: their shard {shard.name} "
                                    "cannot be read")
    assert f"{len(cut)} clips used" in result.stdout and sorted(clips_in(tmp_path / "shards")) == sorted(clips)
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    index["index_id"] = "another folder's"
    (tmp_path / "shards" / "index.json").write_text(json.dumps(index))
    result = prepare(*args, cwd=tmp_path)
    assert result.returncode == 2 and one_error_line(result, PROG, "is not the index its shards were written with")


def test_another_tokenizer_into_the_same_output_is_refused(prepared, tmp_path):
    root, _, _ = prepared
    shutil.copytree(DEMO_TOKENIZER, tmp_path / "other_tokenizer")
    before = (root / "shards" / "index.json").read_bytes()
    result = prepare(f"logs={root / 'logs'}", f"output_dir={root / 'shards'}",
                     f"tokenizer.path={tmp_path / 'other_tokenizer'}", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.startswith(f"{PROG}: error: output_dir={root / 'shards'} holds shards of another tokenizer"), line
    assert (root / "shards" / "index.json").read_bytes() == before


def test_bad_clips_are_skipped_with_one_line_each(tmp_path):
    logs, ten = tmp_path / "logs", np.arange(10) / 10
    write_pngs(logs / "good", scene(10, 4))
    write_csv(logs / "good" / "trajectory.csv", ten)
    paths = write_pngs(logs / "bad_png", scene(10, 5))
    paths[4].write_bytes(b"\x89PNG\r\n\x1a\n this is no image")
    write_csv(logs / "bad_png" / "trajectory.csv", ten)
    (logs / "truncated_mp4").mkdir()
    iio.imwrite(logs / "truncated_mp4" / "drive.mp4", scene(20, 6), fps=10, codec="libx264")
    data = (logs / "truncated_mp4" / "drive.mp4").read_bytes()
    (logs / "truncated_mp4" / "drive.mp4").write_bytes(data[: len(data) // 2])
    write_csv(logs / "truncated_mp4" / "trajectory.csv", np.arange(20) / 10)
    write_pngs(logs / "no_trajectory", scene(10, 7))
    write_pngs(logs / "too_short", scene(1, 8))
    write_csv(logs / "too_short" / "trajectory.csv", ten)
    write_pngs(logs / "short_trajectory", scene(20, 9))
    write_csv(logs / "short_trajectory" / "trajectory.csv", np.arange(6) / 10)
    write_pngs(logs / "nan_poses", scene(10, 10))
    write_csv(logs / "nan_poses" / "trajectory.csv", ten, extra="1.0,nan,0,0\n")

    result = prepare(f"logs={logs}", f"output_dir={tmp_path / 'shards'}", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    reasons = {"bad_png": "cannot be read as an image", "truncated_mp4": "the file is truncated or damaged",
               "no_trajectory": "has no trajectory file", "too_short": "fewer than min_frames=2",
               "short_trajectory": "give poses for the whole clip", "nan_poses": "NaN"}
    lines = result.stderr.strip().splitlines()
    assert len(lines) == len(reasons), result.stderr
    for line, (clip, reason) in zip(lines, sorted(reasons.items())):
        assert line.startswith(f"{PROG}: skipped clip {clip}: ") and reason in line, line
    assert "1 clips used (1 train, 0 val; 10 frames written), 6 skipped" in result.stdout
    assert [c.id for e in read_index(tmp_path / "shards").shards for c in e.clips] == ["good"]
    assert sorted(p.name for p in (tmp_path / "shards").iterdir()) == [MARKER, "index.json", "train-00000.safetensors"]


def test_the_val_clip_of_a_run_without_one_is_a_usable_clip(tmp_path):
    """No clip falls under val_fraction by its hash: the usable clip of the smallest hash becomes val, not the
    unusable clip whose hash is smaller still."""
    names = sorted((f"drive{i}" for i in range(40) if clip_score(f"drive{i}") >= 0.05), key=clip_score)[:3]
    bad, first, second = names
    logs, ten = tmp_path / "logs", np.arange(10) / 10
    for seed, name in enumerate(names):
        write_pngs(logs / name, scene(10, seed))
    for name in (first, second):
        write_csv(logs / name / "trajectory.csv", ten)  # the bad clip has no trajectory
    result = prepare(f"logs={logs}", f"output_dir={tmp_path / 'shards'}", cwd=tmp_path)
    assert result.returncode == 0 and f"skipped clip {bad}: " in result.stderr, result.stderr
    assert "2 clips used (1 train, 1 val; 20 frames written), 1 skipped" in result.stdout
    splits = {c.id: e.split for e in read_index(tmp_path / "shards").shards for c in e.clips}
    assert splits == {first: "val", second: "train"}


def test_misplaced_times_and_odd_clip_names_get_the_right_one_line(tmp_path):
    logs, ten = tmp_path / "logs", np.arange(10) / 10
    write_pngs(logs / "good", scene(10, 4))
    write_csv(logs / "good" / "trajectory.csv", ten)
    for clip, times in (("swapped", ten[[0, 1, 2, 4, 3, 5, 6, 7, 8, 9]]), ("milliseconds", ten * 1000)):
        write_pngs(logs / clip, scene(10, 5))
        (logs / clip / "timestamps.txt").write_text("".join(f"{float(t)!r}\n" for t in times))
        write_csv(logs / clip / "trajectory.csv", ten)
    write_pngs(logs / "two\nlines", scene(10, 6))  # no trajectory: skipped, and named on one line

    result = prepare(f"logs={logs}", f"output_dir={tmp_path / 'shards'}", cwd=tmp_path)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3 and not any("dropped frames" in line for line in lines), result.stderr
    assert lines[0].startswith(f"{PROG}: skipped clip milliseconds: ") and "looks like milliseconds" in lines[0]
    assert lines[1].startswith(f"{PROG}: skipped clip swapped: ") and (
        "times must increase in the images' file-name order, but 00004.png is at 0.3 s, not after 00003.png at "
        "0.4 s") in lines[1], lines[1]
    assert lines[2].startswith(f"{PROG}: skipped clip 'two\\nlines': has no trajectory file"), lines[2]
    assert "1 clips used" in result.stdout


@pytest.fixture
def settings_case(tmp_path):
    logs = tmp_path / "logs"
    write_pngs(logs / "clip", scene(3, 0))
    write_csv(logs / "clip" / "trajectory.csv", np.arange(3) / 10)
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "index.json").write_text("{}")  # the user's, not a shard index this toolkit wrote
    (tmp_path / "empty_logs").mkdir()
    return tmp_path


@pytest.mark.parametrize("args, message", [
    (["output_dir=out"], "no logs given; pass logs=DIR"),
    (["logs=missing", "output_dir=out"], "logs=missing is not a folder"),
    (["logs=empty_logs", "output_dir=out"], "logs=empty_logs holds no clip folders"),
    (["logs=logs"], "no output_dir given"),
    (["logs=logs", "output_dir=a_file/shards"], "output folder a_file/shards is not writable"),
    (["logs=logs", "output_dir=logs/shards"], "lies inside the logs folder logs, which the run reads"),
    (["logs=logs", "output_dir=busy"], "holds 'index.json', which this run would overwrite and which the toolkit"),
    (["logs=logs", "output_dir=out", "val_fraction=0.9"], "val_fraction must be a number from 0 to 0.5"),
    (["logs=logs", "output_dir=out", "min_frames=1"], "min_frames must be a whole number from 2 to 10000"),
    (["logs=logs", "output_dir=out", "device=banana"], "device='banana' is not a device"),
    (["logs=logs", "output_dir=out", "tokenizer.resize=squash"], "unknown tokenizer.resize 'squash'"),
    (["logs=logs", "output_dir=out", "model=terra_v1"], "tokenizer=terra_v1 needs Terra's weights"),
    (["logs=logs", "output_dir=out", "+shards=3"], "unknown setting 'shards'"),
])
def test_bad_settings_are_one_line_and_write_nothing(settings_case, args, message):
    before = sorted(p.relative_to(settings_case) for p in settings_case.rglob("*"))
    result = subprocess.run([sys.executable, "-m", APP, *args], cwd=settings_case, env=ENV, capture_output=True,
                            text=True, timeout=120)
    one_error_line(result, PROG, message)
    assert sorted(p.relative_to(settings_case) for p in settings_case.rglob("*")) == before


def test_resampling_picks_the_nearest_frame_and_refuses_gaps():
    kept = Resampled()
    times = np.arange(13) / 12  # 12 Hz: ticks 0.0 .. 1.0 s
    assert list(resample(zip(times, "abcdefghijklm"), kept)) == list("abcefghiklm")
    assert kept.indices == [0, 1, 2, 4, 5, 6, 7, 8, 10, 11, 12] and kept.source_frames == 13
    np.testing.assert_allclose(kept.times, np.arange(11) / 10)
    with pytest.raises(TerraInputError, match="no frame within 0.06 s of 0.10 s into the clip"):
        list(resample(zip(np.arange(5) / 5, range(5)), Resampled()))  # 5 Hz
    with pytest.raises(TerraInputError, match="frame times must increase"):
        list(resample(zip([0.0, 0.1, 0.1], range(3)), Resampled()))
