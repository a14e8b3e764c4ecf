"""terra-evaluate on a tiny held-out set, and the shipped demo models loading and generating on the CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.config.assets import register_resolvers
from terra.core.errors import TerraInputError
from terra.evaluation import measure
from terra.evaluation.run import format_table, run
from terra.evaluation.settings import EvaluateSpec, evaluate_spec
from terra.sim import Scene, make_clip

register_resolvers()  # the resolvers conf/ uses: ${terra_asset:...}

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "terra" / "assets" / "demo"



def eval_config(out: Path, *overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("evaluate", overrides=[
            f"out_dir={out}", "quality.num_clips=2", "horizon=2", "adherence.num_cases=1",
            "device=cpu", "progress=false", *overrides])


def eval_spec(out: Path, *overrides: str) -> EvaluateSpec:
    return evaluate_spec(eval_config(out, *overrides))


def test_tiny_evaluation_writes_a_complete_report(tmp_path, monkeypatch):
    from terra.pipeline import WorldModelPipeline

    asked = []  # every rollout the evaluation asks of the (route) demo model
    generate = WorldModelPipeline.generate
    monkeypatch.setattr(WorldModelPipeline, "generate",
                        lambda self, requests, *args, **kw: asked.extend(requests) or generate(self, requests, *args,
                                                                                               **kw))
    report = run(eval_spec(tmp_path))
    # the demo route model is told each clip's road at every frame's pose, 8 points, and the adherence pair's
    # rollouts (one context, two commands) the roads ahead of their own poses
    assert report["routes"] is True and len(asked) == 2 + 2 * 2  # 2 quality clips, 2 pairs of one case
    assert all(r.routes.shape == (3 + 2, 8, 3) and np.isfinite(r.routes).all() for r in asked)
    assert np.abs(asked[2].routes[-1] - asked[3].routes[-1]).max() > 0.01
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved == {k: v for k, v in report.items() if k != "path"}
    assert report["backend"] == "HFBackend" and report["num_context"] == 3 and report["image_size"] == [144, 256]
    assert report["domain"] == "day"

    quality = report["quality"]
    assert quality["num_clips"] == 2 and quality["horizon"] == 2 and len(quality["clips"]) == 2
    for key in ("psnr", "tokenizer_psnr", "copy_last_psnr"):
        assert len(quality[key]["mean"]) == 2 and all(5.0 < v < 60.0 for v in quality[key]["mean"])
    for key in ("ssim", "tokenizer_ssim"):
        assert all(0.0 < v <= 1.0 for v in quality[key]["mean"])
    assert quality["tokenizer_psnr"]["overall"] > 20.0  # the trained tokenizer, not random weights
    assert quality["target_frames"] == 2
    assert quality["mean_psnr_target_frames"] == pytest.approx(quality["psnr"]["overall"], abs=1e-3)
    assert quality["scene_seeds"][0] >= 10_000_000
    assert set(quality["by_manoeuvre"]) == {"straight", "curve_left"}  # manoeuvres cycled in MANOEUVRES order

    adherence = report["adherence"]
    assert adherence["horizons"] == [2]  # 4, 7, 10 are beyond the horizon: the last frame is used
    assert set(adherence["pairs"]) == {"curve_left/curve_right", "accelerate/decelerate"}
    for key, pair in adherence["pairs"].items():
        assert pair["num_cases"] == 1 and 0.0 <= pair["accuracy_pct"] <= 100.0
        (case,) = pair["cases"]
        assert set(case["rollouts"]) == set(key.split("/"))
        for rollout in case["rollouts"].values():
            assert set(rollout["psnr_to"]) == {*key.split("/"), "straight"}
            assert rollout["matched"] in key.split("/")
        assert case["correct"] == all(r["matched"] == n for n, r in case["rollouts"].items())
    assert set(adherence["pairs"]["curve_left/curve_right"]["cases"][0]["params"]) == {"radius_m"}
    assert set(report["targets"]) == {"mean_psnr_db", "direction_accuracy_pct"}
    assert all(isinstance(t["passed"], bool) for t in report["targets"].values())
    table = format_table(report)
    assert "curve_left/curve_right" in table and "target direction_accuracy_pct" in table


def test_a_night_evaluation_says_so_in_its_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # on a terminal: the stages' lines and the bars
    report = run(eval_spec(tmp_path, "domain=night", "adherence.num_cases=0", "progress=true"))
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["domain"] == "night" and saved["quality"]["num_clips"] == 2 and "adherence" not in saved
    assert saved["quality"]["scene_seeds"][0] >= 10_000_000
    assert "2 held-out night clips" in format_table(report)
    err = capsys.readouterr().err
    assert "terra-evaluate: HFBackend on cpu loaded in " in err
    assert "terra-evaluate: phase 1 of 1, frame quality: rendering 2 held-out clips, then their rollouts ..." in err
    assert ("terra-evaluate: frame quality: decoding the 2 rollouts and the tokenizer's reconstructions of their true "
            "frames, then scoring them ...") in err  # after the bar: the decoding is no silence
    assert re.search(rf"terra-evaluate: frame quality: done in \d+s, kept in {re.escape(str(tmp_path))}/quality.json\n",
                     err)
    assert "generating (transformers)" in err and "4/4" in err  # the generation bar: 2 clips x 2 frames


def test_both_measurements_draw_the_same_drives_lit_by_the_domain(tmp_path):
    day, night = (eval_spec(tmp_path, "adherence.pairs=[[curve_left,curve_right]]", f"domain={domain}")
                  for domain in ("day", "night"))
    (day_clip,), (night_clip,) = (measure.quality_clips(spec, [12_345_678], (36, 64)) for spec in (day, night))
    (day_case,), (night_case,) = (measure.adherence_cases(spec, [12_345_678], (36, 64)) for spec in (day, night))
    for a, b in [(day_clip, night_clip), *((day_case.clips[n], night_case.clips[n]) for n in day_case.clips)]:
        assert (a.domain, b.domain) == ("day", "night")
        np.testing.assert_array_equal(a.poses, b.poses)
        np.testing.assert_array_equal(a.actions, b.actions)
        assert b.frames.mean() < 0.6 * a.frames.mean()


def test_held_out_scenes_skip_the_training_scenes():
    train = measure.training_scene_seeds(0, 50)
    assert len(train) == 50
    first = sorted(train)[0]
    seeds = measure.held_out_seeds(first - 1, 3, train)
    assert first not in seeds and seeds[0] == first - 1 and len(set(seeds)) == 3


def test_adherence_contexts_are_shared_and_the_commands_differ(tmp_path):
    spec = eval_spec(tmp_path, "adherence.pairs=[[curve_left,curve_right]]", "horizon=4")
    (case,) = measure.adherence_cases(spec, [12_345_678], (36, 64))
    left, right, straight = (case.clips[n] for n in ("curve_left", "curve_right", "straight"))
    np.testing.assert_array_equal(left.frames[:3], right.frames[:3])  # one context for both commands
    np.testing.assert_allclose(left.poses[:3], straight.poses[:3], atol=1e-9)
    assert left.poses[-1, 2] > straight.poses[-1, 2] + 0.02 > right.poses[-1, 2] + 0.04  # yaw: left turns left
    assert np.abs(left.actions[2:] - right.actions[2:]).max() > 0.5


@pytest.mark.parametrize("override, match", [
    ("horizon=0", "horizon"),
    ("num_context=0", "num_context must be a whole number"),  # run_spec's check (terra/config/spec.py)
    ("num_threads=0", "num_threads must be a whole number"),
    ("sampling.top_p=0", "sampling.top_p"),
    ("adherence.pairs=[[curve_left,fly]]", "unknown manoeuvre 'fly'"),
    ("quality.manoeuvres=[straight,hover]", "unknown manoeuvre 'hover'"),
    ("quality.manoeuvres=3", "quality.manoeuvres must be a manoeuvre, a list of them or null"),
    ("adherence.pairs=[[curve_left,curve_left]]", "two different manoeuvres"),
    ("adherence.pairs=7", "adherence.pairs must be a list of pairs"),
    ("adherence.pairs=[] adherence.num_cases=1", "adherence.pairs is empty"),
    ("adherence.horizons=[4,0]", "adherence.horizons must be a whole number from 1 to 1000"),
    ("adherence.radius_m=[40,20]", "adherence.radius_m"),
    ("quality.speed_kmh=[15,300]", "quality.speed_kmh must be a number from 0 to 250"),
    ("quality.num_clips=0 adherence.num_cases=0", "nothing to evaluate"),
    ("domain=dusk", "unknown domain 'dusk'; choose one of: day, night"),
    ("targets.mean_psnr_db=101", "targets.mean_psnr_db"),
    ("out_dir=null", "no out_dir given; pass out_dir=DIR"),
])
def test_bad_settings_raise_one_line_errors(tmp_path, override, match):
    cfg = eval_config(tmp_path, *override.split())
    with pytest.raises(TerraInputError, match=match) as err:
        evaluate_spec(cfg)
    assert "\n" not in str(err.value) and not (tmp_path / "report.json").exists()


def test_a_spec_holds_the_checked_values(tmp_path):
    spec = eval_spec(tmp_path, "quality.manoeuvres=curve_left", "adherence.horizons=null", "num_threads=auto")
    assert spec.quality.manoeuvres == ("curve_left",) and spec.adherence.horizons == ()
    assert spec.adherence.pairs == (("curve_left", "curve_right"), ("accelerate", "decelerate"))
    assert spec.adherence.params == {"radius_m": (20.0, 40.0), "accel_mps2": (2.0, 4.0), "change_s": (1.5, 3.0)}
    assert spec.run.num_context == 3 and spec.num_frames == 5 and spec.run.sampling.temperature == 0.0
    assert spec.rollouts_in_flight == 4  # adherence: 1 case x 2 pairs x 2 rollouts, in one generate call
    assert isinstance(spec.run.num_threads, int) and spec.run.num_threads >= 1  # auto: run_spec's rule
    assert spec.output.path == tmp_path and spec.output.names == ("report.json", "quality.json", "adherence.json")
    assert not list(tmp_path.iterdir())  # claimed, nothing written


def test_a_bad_setting_is_one_line_naming_it_before_torch_loads(tmp_path):
    code = ("import sys, terra.apps.evaluate\n"
            f"sys.argv = ['terra-evaluate', 'quality.speed_kmh=[60,15]', 'out_dir={tmp_path / 'eval'}']\n"
            "try:\n    terra.apps.evaluate.main()\n"
            "except SystemExit as exit:\n    assert exit.code == 2, exit.code\n"
            "assert 'torch' not in sys.modules, 'torch imported before the check'\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "terra-evaluate: error: quality.speed_kmh must satisfy 0 < low <= high (got [60.0, 15.0])"]
    assert list(tmp_path.iterdir()) == []


def test_the_context_must_fit_the_window_of_the_model_built_or_passed_in(tmp_path):
    from terra.pipeline import WorldModelPipeline

    spec = eval_spec(tmp_path, "num_context=16", "adherence.num_cases=0")  # the demo model's window: 16 frames
    with pytest.raises(TerraInputError, match="num_context=16 does not fit a window of 16 frames; use at most 15"):
        run(spec)  # resolve_run reads config.json before the model loads
    pipeline = WorldModelPipeline.from_pretrained(device="cpu", backend="hf")
    with pytest.raises(TerraInputError, match="num_context=16 does not fit a window of 16 frames"):
        run(spec, pipeline)
    report = run(eval_spec(tmp_path, "adherence.num_cases=0"), pipeline)
    assert report["backend"] == "HFBackend" and report["quality"]["num_clips"] == 2
    assert json.loads((tmp_path / "report.json").read_text())["quality"] == report["quality"]


def test_shipped_demo_models_load_and_generate_on_cpu():
    from transformers import AutoModelForCausalLM

    import terra.models  # noqa: F401  (registers llama_action with the Auto classes)
    from terra.config.sampling import SamplingConfig
    from terra.generation.backends import model_backend
    from terra.generation.rollout import RolloutRequest
    from terra.models import LlamaActionForCausalLM
    from terra.pipeline import WorldModelPipeline
    from terra.tokenizer import load_tokenizer

    model = AutoModelForCausalLM.from_pretrained(str(DEMO / "world_model"), dtype=torch.float32)
    assert isinstance(model, LlamaActionForCausalLM)
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (256, 6, 4)
    assert (cfg.num_image_patches, cfg.num_spatio_embeddings, cfg.num_temporal_embeddings) == (144, 158, 16)
    assert (cfg.num_action_tokens, cfg.num_route_tokens) == (6, 8)  # a route model (MODEL_CARD.md)
    assert 5.6e6 < sum(p.numel() for p in model.parameters()) < 5.8e6
    tokenizer = load_tokenizer(str(DEMO / "tokenizer"))
    assert tuple(tokenizer.image_size) == (144, 256) and tuple(tokenizer.grid_shape) == (9, 16)
    assert tokenizer.codebook_size == 1024

    clip = make_clip(Scene.generate(12_000_000), "straight", 3, 144, 256, start_s=15.0)
    pipeline = WorldModelPipeline(tokenizer, model_backend(model), "cpu")
    codes = pipeline.encode(torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1)
    assert codes.shape == (3, 9, 16) and codes.min() >= 0 and codes.max() < 1024
    [result] = pipeline.generate([RolloutRequest(codes[:2], clip.actions, 1, seed=0)], SamplingConfig(0.9),
                                 progress=False)
    assert result.codes.shape == (3, 9, 16) and result.frames.shape == (3, 144, 256, 3)
    assert result.frames.dtype == np.uint8 and result.codes.max() < 1024
    # A trained pair: the predicted frame resembles the real one far better than noise would.
    from terra.metrics import psnr

    assert psnr(result.frames[2:], clip.frames[2:])[0] > 15.0
