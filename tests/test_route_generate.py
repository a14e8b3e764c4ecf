"""``terra-generate`` with a route model: a built-in manoeuvre drives a scene of the synthetic world, so each frame is
drawn with the road of that scene ahead of its pose (no setting to remember); the video's codes are the backend's
rollout given those routes, and differ from the rollout without a route."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.config.sampling import SamplingConfig
from terra.generation.hf_backend import HFBackend
from terra.generation.rollout import RolloutRequest
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.sim import builtin_context, builtin_road
from terra.tokenizer.lfq import LFQTokenizer
from tests.conftest import TINY_ROUTES, tiny_route_model
from tests.test_cli import terra_generate

pytestmark = pytest.mark.slow


def test_a_builtin_manoeuvre_gives_a_route_model_its_scenes_road(tmp_path):
    model_dir, tokenizer_dir = tmp_path / "world_model", tmp_path / "tokenizer"
    tiny_route_model().save_pretrained(model_dir)
    tokenizer = LFQTokenizer(TINY_TOKENIZER)
    tokenizer.save_pretrained(tokenizer_dir)
    result = terra_generate(tmp_path / "cwd", f"model.world_model={model_dir}", f"tokenizer.path={tokenizer_dir}",
                            "backend=hf", "device=cpu", "manoeuvre=curve_left", "num_frames=3", "seed=4",
                            "sampling.temperature=0", "num_context=2", "output.formats=[gif]")
    assert result.returncode == 0, result.stderr
    [sidecar] = (tmp_path / "cwd").glob("outputs/*/*/rollout.json")
    codes = np.asarray(json.loads(sidecar.read_text())["rollouts"][0]["codes"]).reshape(5, -1)

    images, actions = builtin_context("curve_left", 5, (64, 64), 4, {})
    scene, poses = builtin_road("curve_left", 5, 4, {})
    pipeline = WorldModelPipeline(tokenizer, HFBackend(str(model_dir)))
    context = pipeline.encode(images[:2])
    greedy = SamplingConfig(temperature=0)
    routed = RolloutRequest(context, actions, 3, seed=4, routes=scene.route(poses, TINY_ROUTES))
    routeless = RolloutRequest(context, actions, 3, seed=4)
    with_route, without = pipeline.backend.generate([routed, routeless], greedy, progress=False)
    np.testing.assert_array_equal(codes[2:], with_route)
    assert not np.array_equal(with_route, without)
