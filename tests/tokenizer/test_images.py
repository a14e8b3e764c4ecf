"""Image loading: files, folders, globs, videos, arrays; resize + center crop or straight resize; one-line errors."""

from __future__ import annotations

import imageio.v3 as iio
import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

from terra.core.errors import TerraInputError
from terra.tokenizer.images import frames_to_tensor, load_frames, load_images


def solid(color, size=(20, 40)) -> np.ndarray:
    return np.broadcast_to(np.array(color, np.uint8), (*size, 3)).copy()


def test_center_crop_keeps_the_middle_and_scales_to_unit_range(tmp_path):
    wide = solid((0, 0, 255), (40, 120))
    wide[:, 40:80] = (255, 0, 0)  # only the middle third is red
    Image.fromarray(wide).save(tmp_path / "wide.png")
    out = load_images(tmp_path / "wide.png", (16, 16))
    assert out.shape == (1, 3, 16, 16) and out.dtype == torch.float32
    assert torch.allclose(out[0, :, 2:-2, 2:-2], torch.tensor([1.0, -1.0, -1.0])[:, None, None], atol=0.02)


def test_stretch_resizes_straight_and_crop_stays_the_default(tmp_path):
    """``stretch`` (Terra's tokenizer configs) is PIL's bicubic resize to the size, aspect ratio not kept."""
    picture = np.random.default_rng(0).integers(0, 256, (30, 100, 3), np.uint8)  # 10:3, not the target's 16:9
    Image.fromarray(picture).save(tmp_path / "wide.png")
    stretched = load_frames(tmp_path / "wide.png", (18, 32), resize="stretch")
    expected = np.array(Image.fromarray(picture).resize((32, 18), Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(stretched[0], expected)
    torch.testing.assert_close(load_images(tmp_path / "wide.png", (18, 32), resize="stretch"),
                               frames_to_tensor(expected[None]))
    cropped = np.asarray(ImageOps.fit(Image.fromarray(picture), (32, 18), method=Image.Resampling.BICUBIC))
    np.testing.assert_array_equal(load_frames(tmp_path / "wide.png", (18, 32))[0], cropped)  # the default
    assert np.abs(cropped.astype(int) - expected.astype(int)).mean() > 10  # the two modes differ here


def test_unknown_resize_mode_is_one_line(tmp_path):
    Image.fromarray(solid((10, 20, 30))).save(tmp_path / "frame.png")
    with pytest.raises(TerraInputError) as err:
        load_images(tmp_path / "frame.png", (8, 8), resize="squash")
    text = str(err.value)
    assert "'squash'" in text and "crop" in text and "stretch" in text and "\n" not in text


def test_folder_glob_list_video_and_arrays(tmp_path):
    folder = tmp_path / "frames"
    folder.mkdir()
    for i, value in enumerate([30, 10, 20]):
        Image.fromarray(solid((value,) * 3)).save(folder / f"{i:02d}.png")
    (folder / "notes.txt").write_text("not an image, ignored by folder listing")
    values = lambda frames: [int(f[0, 0, 0]) for f in frames]  # noqa: E731
    assert values(load_frames(folder, (8, 8))) == [30, 10, 20]  # sorted by name
    assert values(load_frames(str(folder / "*.png"), (8, 8), last_n=2)) == [10, 20]
    assert values(load_frames([folder / "01.png", folder / "00.png"], (8, 8))) == [10, 30]
    video = np.stack([solid((v,) * 3, (16, 16)) for v in (0, 80, 160, 240)])
    iio.imwrite(tmp_path / "clip.mp4", video, fps=10, codec="libx264", macro_block_size=1)
    frames = load_frames(tmp_path / "clip.mp4", (8, 8), last_n=2)
    assert frames.shape == (2, 8, 8, 3) and np.allclose(values(frames), [160, 240], atol=6)
    assert load_frames(video, (8, 8)).shape == (4, 8, 8, 3)
    grey = tmp_path / "grey.png"
    Image.fromarray(np.full((10, 10), 200, np.uint8), "L").save(grey)
    assert load_frames(grey, (4, 4))[0, 0, 0].tolist() == [200, 200, 200]


def make_bad_inputs(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "text.png").write_text("hello, I am not a PNG")
    Image.fromarray(np.full((8, 8), 4000, np.uint16)).save(tmp_path / "depth16.png")
    (tmp_path / "broken.mp4").write_bytes(b"\x00" * 64)
    return {
        "not an image": (tmp_path / "text.png", "cannot be read as an image"),
        "16-bit": (tmp_path / "depth16.png", "pixel mode"),
        "two channels": (np.zeros((4, 4, 2), np.uint8), "not RGB"),
        "float array": (np.zeros((4, 4, 3), np.float32), "uint8"),
        "empty folder": (tmp_path / "empty", "holds no images"),
        "empty glob": (str(tmp_path / "*.jpg"), "matches no files"),
        "missing": (tmp_path / "missing.png", "does not exist"),
        "broken video": (tmp_path / "broken.mp4", "cannot be read as a video"),
        "nothing": ([], "no images given"),
    }


@pytest.mark.parametrize("case", ["not an image", "16-bit", "two channels", "float array", "empty folder",
                                  "empty glob", "missing", "broken video", "nothing"])
def test_bad_inputs_raise_one_line_errors(tmp_path, case):
    source, message = make_bad_inputs(tmp_path)[case]
    with pytest.raises(TerraInputError) as err:
        load_images(source, (8, 8))
    text = str(err.value)
    assert message in text and "\n" not in text
    if not isinstance(source, (np.ndarray, list)):
        assert str(source) in text  # the error names the input
