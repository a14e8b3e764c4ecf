"""decoder/: batched code decoding, GIF/MP4/PNG/grid writers (read back), atomic writes, overlays, sidecar."""

from __future__ import annotations

import json

import imageio.v2 as iio2
import imageio.v3 as iio
import numpy as np
import pytest
import torch

from decoder import (
    codes_to_frames, draw_trajectory, mark_frames, tile_grid, write_gif, write_grid, write_mp4, write_png_sequence,
    write_sidecar, write_video,
)
from decoder.overlay import CONTEXT_COLOR, GENERATED_COLOR
from terra.config.checks import TerraInputError
from terra.inputs.actions import actions_for_manoeuvre
from tokenizer import LFQTokenizer
from tokenizer.atomic import atomic_path

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
    expected = ((tok.decode(codes) + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
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


def test_mp4_reads_back_with_count_even_size_and_fps(tmp_path):
    frames = random_frames(t=9, h=31, w=45)  # odd sizes are padded to even
    path = write_mp4(tmp_path / "out.mp4", frames, fps=12)
    reader = iio2.get_reader(path, format="FFMPEG")
    meta = reader.get_meta_data()
    assert reader.count_frames() == 9 and meta["size"] == (46, 32) and meta["fps"] == 12
    assert meta["codec"] == "h264" and meta["pix_fmt"].startswith("yuv420p")
    reader.close()


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
