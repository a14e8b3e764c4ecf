"""Finding, matching, decoding and preprocessing the videos to score (terra/scoring/videos.py)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from terra.core.errors import TerraInputError
from terra.decoder.writers import write_mp4
from terra.scoring.samples import BenchSample
from terra.scoring.videos import VideoClips, collate, decode_last, find_videos, match_videos, preprocess, resize_size


def touch(folder, *names):
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_videos_are_matched_by_the_number_ending_their_stem(tmp_path):
    folder = touch(tmp_path / "v", "NUSCENES_ACTION_000123.mp4", "a_b_7.mp4", "x_08.mp4",
                   ".NUSCENES_ACTION_000001.ab.tmp.mp4", "notes.txt", "sidecar_5.json")
    (folder / "sub").mkdir()
    touch(folder / "sub", "deep_9.mp4")
    assert find_videos(folder) == {123: folder / "NUSCENES_ACTION_000123.mp4", 7: folder / "a_b_7.mp4",
                                   8: folder / "x_08.mp4"}


@pytest.mark.parametrize("names, reason", [
    (["NUSCENES_ACTION_000123.mp4", "rollout.mp4"], "rollout.mp4 is not named <name>_<sample_id>.mp4"),
    (["123.mp4"], "is not named <name>_<sample_id>.mp4"),
    (["a_12.mp4", "b_012.mp4"], "videos a_12.mp4 and b_012.mp4 both end in sample id 12"),
])
def test_badly_named_videos_are_one_line(tmp_path, names, reason):
    with pytest.raises(TerraInputError, match=reason):
        find_videos(touch(tmp_path / "v", *names))


def test_a_fifo_is_no_video(tmp_path):
    folder = touch(tmp_path / "v")
    os.mkfifo(folder / "a_1.mp4")
    with pytest.raises(TerraInputError, match="is not a regular file"):
        find_videos(folder)


def test_samples_without_video_are_listed(tmp_path):
    samples = [BenchSample(i, "starting", np.zeros((1, 2)), {}) for i in (1, 2, 3)]
    videos = {2: tmp_path / "x_2.mp4"}
    assert match_videos(samples[1:2], videos, tmp_path) == [tmp_path / "x_2.mp4"]
    with pytest.raises(TerraInputError, match=r"2 of 3 samples have no video in .* \(first: sample 1, 3; expected e.g. "
                                              r"NUSCENES_ACTION_000001.mp4\)"):
        match_videos(samples, videos, tmp_path)


def test_the_last_frames_are_decoded(tmp_path):
    frames = np.zeros((6, 16, 32, 3), np.uint8)  # multiples of 16: imageio's encoding keeps the size
    frames[:, :, :, 0] = np.arange(6)[:, None, None] * 40  # red level tells the frame
    write_mp4(tmp_path / "a_1.mp4", frames)
    last = np.stack([frame.to_ndarray(format="rgb24") for frame in decode_last(tmp_path / "a_1.mp4", 4)])
    assert last.shape == (4, 16, 32, 3) and last.dtype == np.uint8
    assert np.abs(last[..., 0].mean(axis=(1, 2)) - [80, 120, 160, 200]).max() < 6  # H.264 is lossy
    with pytest.raises(TerraInputError, match=r"a_1.mp4 has 6 frames; scoring needs at least 7"):
        decode_last(tmp_path / "a_1.mp4", 7)
    (tmp_path / "b_2.mp4").write_bytes((tmp_path / "a_1.mp4").read_bytes()[:200])
    with pytest.raises(TerraInputError, match=r"b_2.mp4 cannot be decoded"):
        decode_last(tmp_path / "b_2.mp4", 4)


def test_preprocessing_resizes_like_torchvision_then_crops_the_centre():
    assert resize_size((224, 224)) == (256, 256) and resize_size((32, 32)) == (37, 37)
    frames = np.random.default_rng(0).integers(0, 256, (3, 288, 512, 3), dtype=np.uint8)
    clip = preprocess(frames, (224, 224))
    assert clip.shape == (3, 3, 224, 224) and clip.dtype == torch.uint8
    # torchvision's Resize((256, 256)) of a uint8 tensor: bilinear with antialias on floats, rounded; crop at 16
    image = torch.from_numpy(frames[1]).permute(2, 0, 1)[None].float()
    resized = torch.nn.functional.interpolate(image, (256, 256), mode="bilinear", antialias=True).round()
    assert torch.equal(clip[:, 1], resized[0, :, 16:240, 16:240].to(torch.uint8))
    flat = preprocess(np.full((2, 50, 70, 3), 77, np.uint8), (32, 32))
    assert flat.shape == (3, 2, 32, 32) and bool((flat == 77).all())


def test_bad_videos_come_back_as_error_lines(tmp_path):
    write_mp4(tmp_path / "a_1.mp4", np.zeros((3, 16, 16, 3), np.uint8))
    clips = VideoClips([tmp_path / "a_1.mp4", tmp_path / "a_1.mp4"], 2, (8, 8))
    good = clips[0]
    assert good[0] == 0 and good[1].shape == (3, 2, 8, 8) and good[2] is None
    indices, frames, errors = collate([good, clips[1]])
    assert indices == [0, 1] and frames.shape == (2, 3, 2, 8, 8) and errors == []
    short = VideoClips([tmp_path / "a_1.mp4"], 5, (8, 8))[0]
    assert short[1] is None and "has 3 frames" in short[2]
    assert collate([good, short])[1:] == (None, [short[2]])
