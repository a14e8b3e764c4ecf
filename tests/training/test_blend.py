"""terra-blend: a fine-tune blended with its starting checkpoint, base + weight * (tuned - base)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from terra.config.sampling import SamplingConfig
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from tests.conftest import one_error_line, tiny_model

ROOT = Path(__file__).resolve().parents[2]
APP = "terra.apps.blend"  # terra-blend


def blend(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", APP, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny world model and a 'fine-tune' of it: the same architecture, every weight moved."""
    root = tmp_path_factory.mktemp("blend")
    base, tuned = tiny_model(seed=0), tiny_model(seed=0)
    with torch.no_grad():
        for param in tuned.parameters():
            param.add_(torch.randn_like(param) * 0.1)
    base.save_pretrained(root / "base")
    tuned.save_pretrained(root / "tuned")
    return root / "base", root / "tuned"


def test_the_blend_lies_on_the_line_from_base_to_tuned(pair, tmp_path):
    base_dir, tuned_dir = pair
    base, tuned = weights(base_dir), weights(tuned_dir)
    for weight in (0, 0.25, 1):
        out = tmp_path / f"w{weight}"
        done = blend(f"base={base_dir}", f"tuned={tuned_dir}", f"weight={weight}", f"output_dir={out}", "dtype=float32",
                     cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"wrote {out}: {len(tuned)} tensors" in done.stdout
        blended = weights(out)
        assert blended.keys() == tuned.keys()
        for name, value in blended.items():
            expected = base[name] + weight * (tuned[name] - base[name])
            torch.testing.assert_close(value, expected, rtol=0, atol=1e-6)
        if weight in (0, 1):  # the ends are the two models exactly
            reference = base if weight == 0 else tuned
            assert all(torch.equal(blended[n], reference[n]) for n in blended)
    # the default: bfloat16 files, and a world model every backend loads
    out = tmp_path / "bf16"
    assert blend(f"base={base_dir}", f"tuned={tuned_dir}", "weight=0.5", f"output_dir={out}",
                 cwd=tmp_path).returncode == 0
    assert {v.dtype for v in weights(out).values()} == {torch.bfloat16}
    backend = model_backend(str(out), device="cpu", dtype=torch.float32)
    layout = backend.layout
    context = np.random.default_rng(0).integers(0, layout.codebook_size, (2, layout.image_tokens))
    actions = np.zeros((3, layout.action_tokens, 3), dtype=np.float32)
    codes = backend.generate([RolloutRequest(context, actions, 2, seed=0)], SamplingConfig(temperature=0),
                             progress=False)[0]
    assert codes.shape == (2, layout.image_tokens)


@pytest.mark.parametrize("settings, message", [
    (["weight=1.5"], "weight must be a number from 0 to 1"),
    (["tuned=/nonexistent"], "tuned=/nonexistent has no config.json"),
    (["output_dir=BASE"], "is the base model's folder ("),
    (["output_dir=PARENT"], "holds the base model's folder "),
    (["output_dir=NOTES"], "holds files the toolkit did not write ('todo.txt'), which writing there would delete"),
    (["tuned=OTHER"], "base and tuned are not one architecture (config.json: hidden_size 128 vs 32"),
    (["alpha=0.5"], "unknown setting 'alpha'; `terra-blend --cfg job` lists the settings"),
], ids=["weight", "missing", "into-base", "over-base", "over-files", "architecture", "unknown"])
def test_bad_settings_are_one_line_and_write_nothing(pair, tmp_path, settings, message):
    base_dir, tuned_dir = pair
    other = tmp_path / "other"
    tiny_model(seed=1, hidden_size=32, intermediate_size=64).save_pretrained(other)
    notes = tmp_path / "notes"  # a folder of the user's that the blend must not replace
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    args = {"base": str(base_dir), "tuned": str(tuned_dir), "weight": "0.8", "output_dir": str(tmp_path / "out")}
    for setting in settings:
        key, value = setting.split("=", 1)
        args[key] = {"BASE": str(base_dir), "PARENT": str(base_dir.parent), "NOTES": str(notes),
                     "OTHER": str(other)}.get(value, value)
    done = blend(*(f"{k}={v}" for k, v in args.items()), cwd=tmp_path)
    one_error_line(done, "terra-blend", message)
    assert not (tmp_path / "out").exists() and (notes / "todo.txt").read_text() == "keep me"
    assert (base_dir / "config.json").is_file() and (tuned_dir / "config.json").is_file()
