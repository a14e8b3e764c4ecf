"""decoder/: batched code decoding, GIF/MP4/PNG/grid writers (read back), atomic writes, overlays, sidecar."""

from __future__ import annotations

import json

import imageio.v2 as iio2
import imageio.v3 as iio
import numpy as np
import pytest
import torch

from terra.decoder import (
    codes_to_frames, draw_trajectory, mark_frames, tile_grid, write_gif, write_grid, write_mp4, write_png_sequence,
    write_sidecar, write_video,
)
from terra.decoder.frames import images_to_uint8
from terra.decoder.overlay import CONTEXT_COLOR, GENERATED_COLOR
from terra.decoder.writers import mp4_command
from terra.core.errors import TerraInputError
from terra.inputs.actions import actions_for_manoeuvre
from terra.tokenizer import LFQTokenizer
from terra.core.atomic import atomic_path

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


def random_frames(t=7, h=30, w=42, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (t, h, w, 3), dtype=np.uint8)


def test_codes_to_frames_batches_match_one_pass():
    torch.manual_seed(0)
    tok = LFQTokenizer({"encoder_decoder_config": {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "z_channels": 5},
                        "image_size": [16, 24]}).eval()
    codes = torch.randint(0, 32, (5, 8, 12))
    frames = codes_to_frames(tok, codes.numpy().reshape(5, -1), batch_size=2)
    assert frames.shape == (5, 16, 24, 3) and frames.dtype == np.uint8
    expected = images_to_uint8(tok.decode(codes))
    assert np.array_equal(frames, expected)
    with pytest.raises(TerraInputError):
        codes_to_frames(tok, np.full((1, 8, 12), 32))


def test_a_batch_the_device_cannot_hold_is_decoded_in_halves(monkeypatch):
    """A writer decoding beside a vLLM engine that holds most of the GPU: out of memory costs smaller calls, not the
    rollout; only a single frame that does not fit is an error."""
    torch.manual_seed(0)
    tok = LFQTokenizer({"encoder_decoder_config": {"ch": 32, "ch_mult": [1, 2], "num_res_blocks": 1, "z_channels": 5},
                        "image_size": [16, 24]}).eval()
    codes = torch.randint(0, 32, (7, 8, 12))
    expected = codes_to_frames(tok, codes, batch_size=7)
    decode, sizes = tok.decode, []

    def short_of_memory(chunk: torch.Tensor) -> torch.Tensor:
        sizes.append(len(chunk))
        if len(chunk) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.12 GiB")
        return decode(chunk)

    monkeypatch.setattr(tok, "decode", short_of_memory)
    assert np.array_equal(codes_to_frames(tok, codes, batch_size=8), expected)
    assert sizes == [7, 4, 2, 2, 3, 2, 1]  # 7 did not fit: 4 (in 2 + 2) and 3 (in 2 + 1)
    sizes.clear()
    assert np.array_equal(codes_to_frames(tok, codes, batch_size=2), expected) and sizes == [2, 2, 2, 1]
    sizes.clear()

    def no_memory(chunk: torch.Tensor) -> torch.Tensor:
        sizes.append(len(chunk))
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 0.16 GiB")

    monkeypatch.setattr(tok, "decode", no_memory)
    with pytest.raises(torch.OutOfMemoryError):
        codes_to_frames(tok, codes[:3])
    assert sizes == [3, 2, 1]  # halved down to one frame, which still did not fit


def test_gif_reads_back_with_count_size_fps_and_loop(tmp_path):
    frames = random_frames()
    path = write_gif(tmp_path / "out.gif", frames, fps=10)
    back = iio.imread(path, index=None)
    meta = iio.immeta(path)
    assert back.shape[:3] == (7, 30, 42)
    assert meta["duration"] == 100 and meta["loop"] == 0  # 10 fps
    assert [p.name for p in tmp_path.iterdir()] == ["out.gif"]  # no temporary file left


def test_frames_are_quantised_as_terras_to_np_images():
    """Terra's generate.py: clamp to [-1, 1], (x + 1) / 2, times 255, astype(uint8), a floor; rounding (the old rule)
    would make about half of all values one level brighter."""
    images = torch.tensor([-3.0, -1.0, -0.999, 0.0, 0.0039, 0.5, 0.99, 1.0, 2.0]).reshape(1, 1, 3, 3).repeat(1, 3, 1, 1)
    levels = images_to_uint8(images)[0, :, :, 0].ravel().tolist()
    assert levels == [0, 0, 0, 127, 127, 191, 253, 255, 255]  # 127.5 → 127, 191.25 → 191, 253.7 → 253
    noise = torch.rand(4, 3, 18, 32, generator=torch.Generator().manual_seed(0)) * 2.2 - 1.1
    unit = (np.clip(noise.permute(0, 2, 3, 1).numpy(), -1, 1) + 1) / 2  # Terra's steps, in numpy float32
    terra = (255 * unit).astype(np.uint8)
    assert np.array_equal(images_to_uint8(noise), terra)
    rounded = np.round((np.clip(noise.permute(0, 2, 3, 1).numpy(), -1, 1) + 1) * 127.5)
    assert 0.4 < float(np.mean(rounded != terra)) < 0.6  # the rule matters: the old rounding differs half the time


def test_mp4_reads_back_with_count_macro_block_size_and_fps(tmp_path):
    frames = random_frames(t=9, h=31, w=45)  # scaled up to multiples of 16, as imageio's writer does
    path = write_mp4(tmp_path / "out.mp4", frames, fps=12)
    reader = iio2.get_reader(path, format="FFMPEG")
    meta = reader.get_meta_data()
    assert reader.count_frames() == 9 and meta["size"] == (48, 32) and meta["fps"] == 12
    assert meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p")
    reader.close()


@pytest.mark.parametrize("height, width", [(288, 512), (144, 256), (31, 45)])  # Terra's, the demo's, scaled
def test_mp4_is_what_terras_imageio_writer_writes(tmp_path, height, width):
    """Terra's generate.py writes with imageio.get_writer(path, fps=10) and imageio-ffmpeg's defaults: the same
    frames give the same file (same ffmpeg binary), so the decoded pixels ACT-Bench's estimator sees are equal."""
    rng = np.random.default_rng(height)
    frames = np.cumsum(rng.integers(0, 9, (6, height, width, 3)), axis=2).astype(np.uint8)  # gradients, some noise
    ours = write_mp4(tmp_path / "ours.mp4", frames, fps=10)
    writer = iio2.get_writer(tmp_path / "terra.mp4", fps=10)
    for frame in frames:
        writer.append_data(frame)
    writer.close()
    decoded = [iio.imread(path, plugin="pyav") for path in (ours, tmp_path / "terra.mp4")]
    assert decoded[0].shape == (6, -(-height // 16) * 16, -(-width // 16) * 16, 3)
    assert np.array_equal(decoded[0], decoded[1])
    assert ours.read_bytes() == (tmp_path / "terra.mp4").read_bytes()
    assert "-crf" not in mp4_command("ffmpeg", width, height, 10, "x.mp4")  # x264's default, as imageio's


def test_png_sequence_is_complete_and_exact(tmp_path):
    write_png_sequence(tmp_path / "seq", random_frames(t=6, seed=1))
    frames = random_frames(t=4, seed=2)
    paths = write_png_sequence(tmp_path / "seq", frames)  # a shorter rerun removes leftover frames
    assert sorted(p.name for p in (tmp_path / "seq").iterdir()) == [f"frame_{i:05d}.png" for i in range(4)]
    assert np.array_equal(np.stack([iio.imread(p) for p in paths]), frames)
    assert write_video(tmp_path / "seq2", frames) == tmp_path / "seq2" and len(list((tmp_path / "seq2").iterdir())) == 4


def test_interrupted_write_leaves_no_file_under_the_final_name(tmp_path):
    target = tmp_path / "video.mp4"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half a video")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    write_gif(tmp_path / "a.gif", random_frames(t=2))
    before = (tmp_path / "a.gif").read_bytes()
    with pytest.raises(TerraInputError):
        write_gif(tmp_path / "a.gif", np.zeros((2, 4, 4), np.uint8))  # bad frames: the old file stays
    assert (tmp_path / "a.gif").read_bytes() == before
    with pytest.raises(TerraInputError):
        write_video(tmp_path / "x.avi", random_frames(t=2))


def test_grid_tiles_rollouts_and_holds_last_frames(tmp_path):
    a, b, c = random_frames(t=5, seed=3), random_frames(t=3, seed=4), random_frames(t=5, seed=5)
    grid = tile_grid([a, b, c], columns=2, gap=2)
    assert grid.shape == (5, 2 * 30 + 2, 2 * 42 + 2, 3)
    assert np.array_equal(grid[:, :30, :42], a) and np.array_equal(grid[4, :30, 44:], b[-1])
    assert np.array_equal(grid[:, 32:, :42], c) and not grid[:, 32:, 44:].any()
    path = write_grid(tmp_path / "grid.gif", [a, b, c], fps=5, columns=3)
    assert iio.imread(path, index=None).shape[:3] == (5, 30, 3 * 42 + 2 * 4)


def test_context_and_generated_frames_are_marked():
    frames = np.full((4, 40, 60, 3), 128, np.uint8)
    marked = mark_frames(frames, num_context=2)
    assert tuple(marked[0, -1, 30]) == CONTEXT_COLOR and tuple(marked[3, -1, 30]) == GENERATED_COLOR
    assert not np.array_equal(marked[0, :15, :40], marked[3, :15, :40])  # different labels
    assert np.array_equal(frames[0], np.full((40, 60, 3), 128))  # input untouched


def test_trajectory_inset_mirrors_for_left_and_right():
    frames = np.zeros((3, 60, 90, 3), np.uint8)
    left = draw_trajectory(frames, actions_for_manoeuvre("curve_left", 3))
    right = draw_trajectory(frames, actions_for_manoeuvre("curve_right", 3))
    green = lambda f: (f[..., 1] > 200) & (f[..., 0] < 150)  # noqa: E731
    cols_left, cols_right = np.nonzero(green(left[0]))[1], np.nonzero(green(right[0]))[1]
    assert cols_left.size and cols_right.size
    assert cols_left.mean() < cols_right.mean()  # y is to the left: a left curve bends left in the inset
    assert not left[0, :30, :40].any()  # the inset stays in the bottom-right corner


def test_sidecar_is_plain_json(tmp_path):
    actions = actions_for_manoeuvre("straight", 2)
    path = write_sidecar(tmp_path / "run.json", config={"fps": 10, "out": tmp_path}, seed=7, actions=actions,
                         timings={"generate": 1.5}, num_frames=np.int64(2))
    data = json.loads(path.read_text())
    assert data["seed"] == 7 and data["num_frames"] == 2 and data["timings_s"] == {"generate": 1.5}
    assert np.allclose(np.array(data["actions"]), actions) and data["config"]["out"] == str(tmp_path)
