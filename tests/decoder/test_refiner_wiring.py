"""decoder=refiner wired into the toolkit: ``terra.refiner`` checks, ``WorldModelPipeline.refine``, ``terra-generate``
end to end with a tiny random refiner, and diffusers staying unimported unless the refiner is used."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

pytest.importorskip("diffusers", reason="the refiner needs diffusers (pip install '.[refiner]')")

from terra.decoder.refiner import TINY, load_refiner  # noqa: E402
from terra.batch import BatchConfig, check_config, run_batch  # noqa: E402
from terra.core.errors import TerraInputError  # noqa: E402
from terra.pipeline import RolloutResult, WorldModelPipeline  # noqa: E402
from terra.config.spec import RunSpec, check_decoder_name  # noqa: E402
from terra.refiner import check_decoder  # noqa: E402
from tests.batch.test_batch import NUM_CONTEXT, actbench_line, demo_pipeline, scenes  # noqa: E402,F401 (fixtures)
from tests.decoder.test_refiner import tiny_file, tiny_tokenizer  # noqa: E402,F401 (fixtures)
from tests.test_cli import TERRA_GENERATE, terra_generate  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread
ROOT = Path(__file__).resolve().parents[2]


def checked_decoder(decoder: str, node: dict | None):
    """terra/refiner.py's check of a run whose spec asks for ``decoder`` with the refiner block ``node``, on
    the CPU (the name checked as terra/config/spec.py checks it)."""
    spec = RunSpec("world_model", "tokenizer", device="cpu", decoder=check_decoder_name(decoder),
                   refiner=dict(node or {}))
    return check_decoder(spec)


def test_tokenizer_and_refiner_settings_are_checked_before_loading(tiny_file, tmp_path):
    assert checked_decoder("tokenizer", None) is None
    (tmp_path / "notes.pt").write_text("not weights")
    (tmp_path / "cut.pt").write_bytes(tiny_file.read_bytes()[:4096])
    settings = checked_decoder("refiner", {"path": str(tiny_file), "preset": "tiny", "num_steps": 2, "device": None,
                                            "arithmetic": "float32"})
    assert settings.path == tiny_file and settings.config.num_steps == 2 and settings.device.type == "cpu"
    assert settings.config.arithmetic == "float32"
    cases = {
        "unknown": ("bogus", {}, "decoder='bogus' is unknown"),
        "an old name's value": ("framewise", {}, "decoder='framewise' is unknown; use decoder=tokenizer"),
        "no weights": ("refiner", {"path": None}, "add terra_root=/path/to/Terra"),
        "no weights at a toy size": ("refiner", {"path": None, "preset": "tiny"},
                                     r"^decoder=refiner with refiner.preset=tiny needs a refiner file of that size: "
                                     r"refiner.path=/path/to/refiner_model.pt \(random weights for a test"),
        "missing file": ("refiner", {"path": str(tmp_path / "x.pt"), "preset": "tiny"}, "not found"),
        "not weights": ("refiner", {"path": str(tmp_path / "notes.pt"), "preset": "tiny"},
                        "notes.pt are not a whole PyTorch checkpoint"),
        "a truncated file": ("refiner", {"path": str(tmp_path / "cut.pt"), "preset": "tiny"},
                             "no zip archive: truncated"),
        "cpu": ("refiner", {"path": str(tiny_file), "preset": "terra"}, "needs a CUDA GPU"),
        "bad setting": ("refiner", {"path": str(tiny_file), "preset": "tiny", "guidance": "x"}, "guidance 'x'"),
        "bad arithmetic": ("refiner", {"path": str(tiny_file), "preset": "tiny", "arithmetic": "bf16"},
                           r"arithmetic 'bf16' is unknown; choose one of \['published', 'float32'\]"),
    }
    for name, (decoder, node, message) in cases.items():
        with pytest.raises(TerraInputError, match=message) as err:
            checked_decoder(decoder, node)
        assert "\n" not in str(err.value), name


def test_pipeline_refine_replaces_frames_and_adds_timings(tiny_file):
    tokenizer = tiny_tokenizer()
    pipeline = WorldModelPipeline(tokenizer, backend=None)
    codes = np.random.default_rng(0).integers(0, 32, (6, 8, 12))
    request = type("Request", (), {"seed": 7})()
    result = RolloutResult(request, codes, np.zeros((6, 16, 24, 3), np.uint8), 3, {"generate_s": 1.0})
    [refined] = pipeline.refine([result], load_refiner(tiny_file, "tiny", device="cpu"))
    assert refined.frames.shape == (6, TINY.height, TINY.width, 3)
    assert {"generate_s", "refine_unet_s", "refine_total_s"} <= set(refined.timings)


def test_only_the_refiner_imports_diffusers():
    code = ("import sys, terra.decoder, terra.decoder.refiner, terra.apps.generate, terra.pipeline, terra.refiner, "
            "terra.outputs; "
            "assert 'diffusers' not in sys.modules, 'diffusers imported'; "
            "import terra.decoder.refiner.model; assert 'diffusers' in sys.modules")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(not TERRA_GENERATE.exists(), reason="terra-generate is not installed next to this Python")
def test_terra_generate_writes_refined_videos(tiny_file, tmp_path):
    out = tmp_path / "out"
    result = terra_generate(tmp_path / "cwd", "backend=hf", "device=cpu", "num_frames=2", "decoder=refiner",
                            f"refiner.path={tiny_file}", "refiner.preset=tiny", "output.formats=[mp4]",
                            f"output.dir={out}")
    assert result.returncode == 0, result.stderr
    frames = iio.imread(out / "rollout.mp4")
    assert frames.shape == (5, TINY.height, TINY.width, 3)  # 3 context + 2 generated, at the refiner's size
    sidecar = json.loads((out / "rollout.json").read_text())
    assert sidecar["config"]["decoder"] == "refiner" and sidecar["config"]["refiner"]["arithmetic"] == "published"
    assert "psnr_db_per_generated_frame" not in sidecar["rollouts"][0]  # ground truth is at the tokenizer's size

    result = terra_generate(tmp_path / "cwd", "backend=hf", "device=cpu", "decoder=refiner", f"output.dir={out}2")
    assert result.returncode == 2 and "refiner weights" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out2").exists()


def test_benchmark_script_reports_the_split_and_unet_throughput(tmp_path):
    from tests.conftest import load_script

    out = tmp_path / "bench.json"
    report = load_script("bench/benchmark_refiner").main(["--preset", "tiny", "--device", "cpu", "--dtype", "float32",
                                                    "--frames", "5,8", "--out", str(out)])
    assert json.loads(out.read_text()) == report and not report["full_size"]
    five, eight = report["cases"]
    assert five["output_shape"] == [5, TINY.height, TINY.width, 3] and eight["passes"] == [[0, 5], [3, 8]]
    assert eight["unet_calls"] == 2 * TINY.num_steps and eight["unet_tflop"] > five["unet_tflop"] > 0
    assert set(eight["split_s"]) == {"token_decode_s", "cond_encode_s", "unet_s", "temporal_decode_s", "total_s"}


def test_a_batch_names_the_snapshot_without_refiner_weights_as_terra_generate_does(tmp_path):
    """A batch's run spec comes from run_spec, the function terra-generate uses, so terra_root reaches the error
    line."""
    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    config = BatchConfig(samples=str(samples), output_dir="unused", device="cpu", decoder="refiner",
                         refiner={"path": None}, terra_root=str(tmp_path))
    run = config.spec().run
    assert run.terra_root == str(tmp_path)
    with pytest.raises(TerraInputError, match=f"Terra's refiner weights \\(terra_root={tmp_path} gives none\\)"):
        check_decoder(run)


def test_batch_rollouts_write_refined_videos(tmp_path, tiny_file, scenes, demo_pipeline):
    samples = tmp_path / "samples.jsonl"
    samples.write_text(actbench_line(scenes, 0))
    out = tmp_path / "out"
    config = BatchConfig(samples=str(samples), output_dir=str(out), image_root=scenes["root"], backend="hf",
                         num_frames=1, num_context=NUM_CONTEXT, progress=False, decoder="refiner",
                         refiner={"path": str(tiny_file), "preset": "tiny", "num_steps": 2})
    check_config(config)
    assert run_batch(config, pipeline=demo_pipeline).counts["ok"] == 1
    assert iio.imread(out / "0.mp4").shape == (NUM_CONTEXT + 1, TINY.height, TINY.width, 3)
    assert run_batch(config, pipeline=demo_pipeline).counts["skipped"] == 1
    float32 = dataclasses.replace(config, refiner={**config.refiner, "arithmetic": "float32"})
    assert run_batch(float32, pipeline=demo_pipeline).counts["ok"] == 1  # another arithmetic: made again
    tokenizer = run_batch(dataclasses.replace(config, decoder="tokenizer"), pipeline=demo_pipeline)
    assert tokenizer.counts["ok"] == 1  # another decoder: the sample is made again, at the tokenizer's size
    assert iio.imread(out / "0.mp4").shape[1:3] == tuple(demo_pipeline.tokenizer.image_size)
    with pytest.raises(TerraInputError, match="not found"):  # checked before the run, complete samples or not
        run_batch(dataclasses.replace(config, refiner={"path": str(tmp_path / "x.pt"), "preset": "tiny"}),
                  pipeline=demo_pipeline)
