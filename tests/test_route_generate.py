"""``terra-generate`` with a route model: a built-in manoeuvre drives a scene of the synthetic world, so each frame is
drawn with the road of that scene ahead of its pose (no setting to remember), whether ``manoeuvre=`` names it or a
trajectory file does; the video's codes are the backend's rollout given those routes, and differ from the rollout
without a route."""

from __future__ import annotations

import json

import numpy as np
import pytest

from terra.config.sampling import SamplingConfig
from terra.generation.backends import model_backend
from terra.generation.rollout import RolloutRequest
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.sim import builtin_context, builtin_road
from terra.tokenizer.lfq import LFQTokenizer
from terra.contract.routes import route_distances
from terra.core.errors import TerraInputError
from tests.conftest import TINY_ROUTES, tiny_route_model
from tests.test_cli import terra_generate
from tests.test_route_files import FRAMES, models, run_generate  # noqa: F401  (models: the fixture)

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
    pipeline = WorldModelPipeline(tokenizer, model_backend(str(model_dir)))
    context = pipeline.encode(images[:2])
    greedy = SamplingConfig(temperature=0)
    routed = RolloutRequest(context, actions, 3, seed=4, routes=scene.route(poses, TINY_ROUTES))
    routeless = RolloutRequest(context, actions, 3, seed=4)
    with_route, without = pipeline.backend.generate([routed, routeless], greedy, progress=False)
    np.testing.assert_array_equal(codes[2:], with_route)
    assert not np.array_equal(with_route, without)


def test_a_manoeuvre_file_over_the_builtin_frames_drives_them_as_manoeuvre_does(models, tmp_path, monkeypatch):
    """``{"manoeuvre": ...}`` as a file over the built-in frames: the same scene, frames, actions and road as
    ``manoeuvre=`` with the same settings (before, the file's run got straight-driving frames and no route); the
    file's own road, where it gives one, is told instead."""
    spec = {"name": "curve_left", "radius_m": 40}
    trajectory = tmp_path / "curve.json"
    trajectory.write_text(json.dumps({"manoeuvre": spec}))
    [from_file] = run_generate(models, "route_model", trajectory, tmp_path / "file", monkeypatch, "seed=3")
    [named] = run_generate(models, "route_model", None, tmp_path / "named", monkeypatch, "seed=3",
                           "manoeuvre=curve_left", "manoeuvre_params.radius_m=40")
    scene, poses = builtin_road("curve_left", FRAMES, 3, {"radius_m": 40.0})
    np.testing.assert_array_equal(from_file.routes, scene.route(poses, TINY_ROUTES))
    np.testing.assert_array_equal(from_file.routes, named.routes)
    np.testing.assert_array_equal(from_file.actions, named.actions)
    np.testing.assert_array_equal(from_file.context, named.context)  # the same frames, encoded
    road = tmp_path / "road.json"
    road.write_text(json.dumps({"manoeuvre": spec, "road": [[-20.0, 0.0], [200.0, 0.0]]}))
    [own] = run_generate(models, "route_model", road, tmp_path / "own", monkeypatch, "seed=3")
    np.testing.assert_allclose(own.routes[0, :, :2], np.stack([route_distances(4), np.zeros(4)], 1), atol=1e-4)


def test_a_road_given_as_null_tells_no_route_not_the_scenes_road(models, tmp_path, monkeypatch):
    """``"road": null`` is documented as "no route": the built-in scene's road is not told in its place, and the
    sidecar says no route was told."""
    trajectory = tmp_path / "none.json"
    trajectory.write_text(json.dumps({"manoeuvre": "curve_left", "road": None}))
    [request] = run_generate(models, "route_model", trajectory, tmp_path / "out", monkeypatch, "seed=3")
    assert request.routes is None
    [sidecar] = (tmp_path / "out").rglob("rollout.json")
    record = json.loads(sidecar.read_text())["rollouts"][0]
    assert (record["route"], record["route_source"], record["ego_routes"]) == (False, None, None)


def test_a_road_that_ends_ahead_is_said_per_frame_and_in_one_line(models, tmp_path, monkeypatch, capsys):
    """A road ending 42 m past the start: the frames from which it ends within 40 m ahead are told no route (not 4
    points stacked on its end); the sidecar says each frame's verdict and stdout how many frames got one."""
    trajectory = tmp_path / "short.json"
    trajectory.write_text(json.dumps({"manoeuvre": "straight", "road": [[-20.0, 0.0], [42.0, 0.0]]}))
    [request] = run_generate(models, "route_model", trajectory, tmp_path / "out", monkeypatch, "seed=3")
    told = np.isfinite(request.routes).all(axis=(1, 2)).tolist()
    assert told == [True, True, True, False, False]
    [sidecar] = (tmp_path / "out").rglob("rollout.json")
    record = json.loads(sidecar.read_text())["rollouts"][0]
    assert record["route"] is True and record["route_told"] == ["told"] * 3 + ["road ended"] * 2
    assert record["ego_routes"][3:] == [None, None]
    assert "terra-generate: route told in 3 of 5 frames: 2 road ended" in capsys.readouterr().out


def test_road_path_or_inline_tells_every_frame_its_route_and_a_bad_one_stops_before_any_model(models, tmp_path,
                                                                                             monkeypatch):
    """``road=`` takes a road file (here a CSV with a byte-order mark), AlpaSim's map or inline JSON, in the drive's
    world frame (a manoeuvre's: from the origin heading +x); a road off the drive is one line, before any model
    loads, saying how far the nearest lane was and at what heading."""
    road = tmp_path / "road.csv"
    road.write_bytes(b"\xef\xbb\xbfx,y\n-20,0\n200,0\n")
    for value in (str(road), "[[-20, 0], [200, 0]]"):
        [request] = run_generate(models, "route_model", None, tmp_path / f"out{len(value)}", monkeypatch,
                                 "manoeuvre=straight", f"road='{value}'")
        np.testing.assert_allclose(request.routes[..., 0], np.broadcast_to(route_distances(4), (FRAMES, 4)),
                                   atol=1e-3)
        np.testing.assert_allclose(request.routes[..., 1], 0.0, atol=1e-3)
    loads = []
    monkeypatch.setattr("terra.tokenizer.load_tokenizer", lambda *a, **k: loads.append(a))
    monkeypatch.setattr("terra.run.resolve_run", lambda *a, **k: loads.append(a))  # torch, the model's config
    with pytest.raises(TerraInputError) as err:
        run_generate(models, "route_model", None, tmp_path / "bad", monkeypatch, "manoeuvre=straight",
                     "road='[[5, -20], [5, 200]]'")
    assert not loads
    assert "no frame's pose lies on a lane" in str(err.value) and "the nearest lane is 5.0 m away, heading 90 " \
        "degrees off the car's" in str(err.value), str(err.value)


def test_a_bad_road_beside_context_frames_stops_before_the_tokenizer_or_the_frames_load(models, tmp_path,
                                                                                        monkeypatch):
    """``context=`` frames of the user's own: a road off the drive is still one line before anything loads; a good
    one tells every frame its route."""
    from PIL import Image

    context = tmp_path / "frames"
    context.mkdir()
    for t in range(3):
        Image.new("RGB", (64, 64), (90, 90, 90 + t)).save(context / f"{t}.png")
    [request] = run_generate(models, "route_model", None, tmp_path / "good", monkeypatch, f"context={context}",
                             "manoeuvre=straight", "road='[[-20, 0], [200, 0]]'")
    assert np.isfinite(request.routes).all()
    loads = []
    monkeypatch.setattr("terra.tokenizer.load_tokenizer", lambda *a, **k: loads.append(a))
    monkeypatch.setattr("terra.inputs.load_context", lambda *a, **k: loads.append(a))
    monkeypatch.setattr("terra.run.resolve_run", lambda *a, **k: loads.append(a))
    with pytest.raises(TerraInputError) as err:
        run_generate(models, "route_model", None, tmp_path / "bad", monkeypatch, f"context={context}",
                     "manoeuvre=straight", "road='[[5, -20], [5, 200]]'")
    assert not loads
    assert "the nearest lane is 5.0 m away, heading 90 degrees off the car's" in str(err.value), str(err.value)
