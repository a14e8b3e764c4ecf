"""Which decoder an image reaches: a client's bytes only PNG's or JPEG's, a context frame's file only those of the
formats context frames take (PNG, JPEG, BMP, WebP, TIFF; GIF as a video), each chosen by the file's first bytes.
Pillow's EPS decoder runs Ghostscript: a fake ``gs`` that leaves a mark shows it is never reached."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import EpsImagePlugin, Image

from terra.core.errors import TerraInputError
from terra.tokenizer.images import image_file_size, image_from_bytes, load_frames

EPS = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\n0 0 moveto 16 16 lineto stroke\nshowpage\n"


@pytest.fixture
def ghostscript(tmp_path, monkeypatch) -> Path:
    """A fake Ghostscript that Pillow's EPS decoder would run; the path of the mark it leaves when run."""
    mark = tmp_path / "ghostscript-ran"
    gs = tmp_path / "gs"
    gs.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    gs.chmod(0o755)
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", str(gs))
    return mark


def encoded(kind: str, size=(12, 20)) -> bytes:
    buffer = io.BytesIO()
    picture = np.random.default_rng(0).integers(0, 256, (*size, 3), np.uint8)
    Image.fromarray(picture).save(buffer, format=kind)
    return buffer.getvalue()


def refusal(function, *args) -> str:
    with pytest.raises(TerraInputError) as err:
        function(*args)
    text = str(err.value)
    assert "\n" not in text and "cannot be read as" in text
    return text


def test_a_clients_image_is_png_or_jpeg_and_nothing_else_reaches_a_decoder(ghostscript):
    for kind in ("PNG", "JPEG"):
        assert image_from_bytes(encoded(kind), "upload").size == (20, 12)
    for kind in ("GIF", "BMP", "TIFF", "WEBP", "PPM"):
        assert "pass a PNG or JPEG file" in refusal(image_from_bytes, encoded(kind), "upload")
    refusal(image_from_bytes, EPS, "upload")
    refusal(image_from_bytes, b"\x89PNG\r\n\x1a\n" + EPS, "upload")  # PNG's magic, then garbage
    refusal(image_from_bytes, b"\xff\xd8\xff" + b"\x00" * 40, "upload")
    assert not ghostscript.exists()


def test_context_files_take_their_formats_and_never_reach_eps(tmp_path, ghostscript):
    for kind, suffix in (("PNG", "png"), ("JPEG", "jpg"), ("BMP", "bmp"), ("WEBP", "webp"), ("TIFF", "tif")):
        (tmp_path / f"frame.{suffix}").write_bytes(encoded(kind))
        assert load_frames(tmp_path / f"frame.{suffix}", (8, 8)).shape == (1, 8, 8, 3), kind
    for name in ("eps.png", "eps.jpg", "eps.tif", "eps.gif", "eps.avi", "eps.mp4"):
        (tmp_path / name).write_bytes(EPS)
        assert str(tmp_path / name) in refusal(load_frames, tmp_path / name, (8, 8)), name
    (tmp_path / "gif.png").write_bytes(encoded("GIF"))  # a GIF is a video, never a context image
    refusal(load_frames, tmp_path / "gif.png", (8, 8))
    with (tmp_path / "eps.png").open("rb") as fh:  # the batch's check of a sample's image header
        refusal(image_file_size, fh, "eps.png")
    with (tmp_path / "frame.webp").open("rb") as fh:
        assert image_file_size(fh, "frame.webp") == (20, 12)
    assert not ghostscript.exists()


def test_a_gif_video_is_still_read(tmp_path):
    frames = [Image.fromarray(np.full((16, 16, 3), value, np.uint8)) for value in (0, 120, 240)]
    frames[0].save(tmp_path / "clip.gif", save_all=True, append_images=frames[1:], duration=100)
    read = load_frames(tmp_path / "clip.gif", (8, 8))
    assert read.shape == (3, 8, 8, 3) and [int(f[0, 0, 0]) for f in read] == [0, 120, 240]
