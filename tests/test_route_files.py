"""Routes in trajectory files (docs/generate.md, "Routes"): a JSON trajectory's ``routes`` reach the requests of a
route model as the file gives them, read and checked once where the file enters and before any model loads; a bad
route is one line (exit 2 from ``terra-generate``); a model without route slots runs without them and says so; the
docs' example is read as the docs say.

The models are tiny (:func:`tests.conftest.tiny_route_model`, K = 4 route slots, and :func:`tests.conftest.tiny_model`,
none) with the tiny LFQ tokenizer whose 8x8 codes fit them, so a run takes about a second.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import terra.apps.generate
import terra.config.files
import terra.generation.actions
import terra.generation.routes
import terra.inputs.actions
from terra.core.errors import TerraInputError
from terra.generation.routes import route_distances
from terra.inputs.requests import trajectory_inputs
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from terra.tokenizer import LFQTokenizer
from tests.conftest import TINY_ROUTES, one_error_line, tiny_model, tiny_route_model
from tests.test_check_once import calls

ROOT = Path(__file__).resolve().parents[1]
NUM_CONTEXT, NUM_FRAMES = 3, 2
FRAMES = NUM_CONTEXT + NUM_FRAMES  # routes a rollout takes: one per frame

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """``route_model`` (K = 4), ``plain_model`` (no route slots) and the ``tokenizer`` that fits both, saved."""
    root = tmp_path_factory.mktemp("route_files")
    tiny_route_model().save_pretrained(root / "route_model")
    tiny_model().save_pretrained(root / "plain_model")
    torch.manual_seed(0)
    LFQTokenizer(TINY_TOKENIZER).save_pretrained(root / "tokenizer")
    return root


def bending_routes(frames: int = FRAMES, points: int = TINY_ROUTES) -> np.ndarray:
    """``[frames, K, 2]`` y, x: a road bending left ever more sharply, a different route for every frame."""
    s = route_distances(points).astype(np.float64)
    return np.stack([np.stack([0.002 * (t + 1) * s**2, s], axis=1) for t in range(frames)])


def write_trajectory(path: Path, routes, **form) -> Path:
    path.write_text(json.dumps({**(form or {"manoeuvre": "straight"}), "routes": np.asarray(routes).tolist()}))
    return path


def generate_cfg(models: Path, model: str, trajectory: Path, *extra: str):
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("generate", overrides=[
            "backend=hf", "device=cpu", "num_threads=1", f"num_frames={NUM_FRAMES}", f"trajectory={trajectory}",
            f"model.world_model={models / model}", f"tokenizer.path={models / 'tokenizer'}", *extra])


def run_generate(models: Path, model: str, trajectory: Path, out: Path, monkeypatch, *extra: str) -> list:
    """Run ``terra-generate`` in this process; return the requests the pipeline was given."""
    given: list = []
    generate = WorldModelPipeline.generate

    def recording(self, requests, *args, **kwargs):
        given.extend(requests)
        return generate(self, requests, *args, **kwargs)

    monkeypatch.setattr(WorldModelPipeline, "generate", recording)
    terra.apps.generate.run(terra.apps.generate.generate_spec(generate_cfg(models, model, trajectory, *extra)), out)
    return given


@pytest.mark.parametrize("values", [2, 3])
def test_a_route_model_s_requests_carry_the_file_s_routes_read_and_checked_once(models, tmp_path, monkeypatch,
                                                                                values):
    routes = bending_routes()
    if values == 3:  # [y, x, s]: the distances written out
        routes = np.concatenate([routes, np.broadcast_to(route_distances(TINY_ROUTES)[:, None], (FRAMES, 4, 1))], -1)
    trajectory = write_trajectory(tmp_path / "bend.json", routes)
    with calls(terra.inputs.actions.read_trajectory_file, terra.config.files.read_input_text,
               terra.generation.actions.validate_actions, terra.generation.routes.validate_routes) as counts:
        requests = run_generate(models, "route_model", trajectory, tmp_path / "out", monkeypatch, "num_samples=2")
    assert counts == {"read_trajectory_file": 1, "read_input_text": 1, "validate_actions": 1, "validate_routes": 1}
    assert len(requests) == 2
    for request in requests:
        assert request.routes.shape == (FRAMES, TINY_ROUTES, 3) and request.routes.dtype == np.float32
        np.testing.assert_allclose(request.routes[..., :2], bending_routes(), rtol=1e-6)
        np.testing.assert_allclose(request.routes[..., 2], np.broadcast_to(route_distances(4), (FRAMES, 4)))
    sidecar = json.loads((tmp_path / "out" / "rollout.json").read_text())
    assert [r["route"] for r in sidecar["rollouts"]] == [True, True]


def test_a_control_without_routes_gives_requests_without_a_route(models, tmp_path, monkeypatch):
    """Control: the same run with the file's routes left out has none (the routes above came from the file)."""
    trajectory = tmp_path / "straight.json"
    trajectory.write_text(json.dumps({"manoeuvre": "straight"}))
    [request] = run_generate(models, "route_model", trajectory, tmp_path / "out", monkeypatch)
    assert request.routes is None
    assert json.loads((tmp_path / "out" / "rollout.json").read_text())["rollouts"][0]["route"] is False


def test_a_model_without_route_slots_runs_without_the_file_s_routes_and_says_so_once(models, tmp_path,
                                                                                     monkeypatch, capsys):
    trajectory = write_trajectory(tmp_path / "bend.json", bending_routes(frames=2, points=7))  # not checked: unused
    [request] = run_generate(models, "plain_model", trajectory, tmp_path / "out", monkeypatch)
    assert request.routes is None
    said = [line for line in capsys.readouterr().err.splitlines() if "routes" in line]
    assert said == [f"terra-generate: {trajectory} carries routes; the world model has no route slots "
                    "(num_route_tokens 0), so it runs without them"]
    assert json.loads((tmp_path / "out" / "rollout.json").read_text())["rollouts"][0]["route"] is False


def _with_s(routes: np.ndarray, s: np.ndarray) -> np.ndarray:
    return np.concatenate([routes, np.broadcast_to(s[:, None], routes.shape[:2] + (1,))], axis=-1)


# case → (the file's routes, text its one line holds)
BAD_ROUTES = {
    "wrong_number_of_points": (bending_routes(points=3), "routes must have shape [frames, 4, 2]"),
    "too_far": (bending_routes() * [1.0, 15.0], "a route point lies 1200 m from the car, more than 1000 m"),
    "too_few_frames": (bending_routes(frames=FRAMES - 1), "covers 4 frames but the rollout needs routes for 5"),
    "s_not_the_distances": (_with_s(bending_routes(), np.arange(1.0, 5.0)), "third values must be its points' "
                            "distances along the road, 20, 40, 60, 80 m"),
    "not_numbers": ([["ahead"]] * FRAMES, "routes: holds values that are not numbers"),
    "flat_list": (list(range(FRAMES)), "routes must have shape"),
}


@pytest.mark.parametrize("case", list(BAD_ROUTES))
def test_a_bad_route_in_a_file_is_one_line_naming_it(tmp_path, case):
    routes, expected = BAD_ROUTES[case]
    path = write_trajectory(tmp_path / "bad.json", routes)
    with pytest.raises(TerraInputError) as err:
        trajectory_inputs(path, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and expected in message, message


def test_a_nan_route_in_a_mapping_is_one_line():
    """JSON files cannot hold NaN (strict JSON); a mapping given from Python can."""
    routes = bending_routes()
    routes[2, 1, 0] = np.nan
    with pytest.raises(TerraInputError, match=r"^scene 7: routes: holds NaN or inf; replace them with finite"):
        trajectory_inputs({"manoeuvre": "straight", "routes": routes}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES,
                          "scene 7")


def test_skip_drops_the_routes_of_the_frames_not_used():
    """ACT-Bench's rule: the rows of context frames not used go, routes as actions."""
    routes = bending_routes(frames=FRAMES + 2)
    given = trajectory_inputs({"manoeuvre": "straight", "routes": routes}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES,
                              skip=2)
    np.testing.assert_allclose(given.routes[..., :2], routes[2:], rtol=1e-6)
    with pytest.raises(TerraInputError, match="covers 6 frames but the rollout needs routes for 7"):
        trajectory_inputs({"manoeuvre": "straight", "routes": routes[1:]}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES,
                          skip=2)


def test_a_bad_route_stops_terra_generate_before_any_model_loads(models, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(WorldModelPipeline, "from_run", no_model)
    trajectory = write_trajectory(tmp_path / "bad.json", bending_routes(points=3))
    with pytest.raises(TerraInputError, match="routes must have shape"):
        terra.apps.generate.run(terra.apps.generate.generate_spec(
            generate_cfg(models, "route_model", trajectory)), tmp_path / "out")


def test_terra_generate_exits_2_with_one_line_for_a_bad_route(models, tmp_path):
    trajectory = write_trajectory(tmp_path / "bad.json", bending_routes(frames=2))
    out = tmp_path / "out"
    args = ["backend=hf", "device=cpu", "num_threads=1", f"num_frames={NUM_FRAMES}", f"trajectory={trajectory}",
            f"model.world_model={models / 'route_model'}", f"tokenizer.path={models / 'tokenizer'}",
            f"output.dir={out}"]
    result = subprocess.run([str(Path(sys.executable).with_name("terra-generate")), *args], cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    line = one_error_line(result, "terra-generate", f"{trajectory}: routes: covers 2 frames but the rollout needs "
                                                    "routes for 5")
    assert "give a route for every frame" in line
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]



def test_the_docs_route_example_writes_a_file_that_a_k8_model_reads(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "generate.md").read_text()
    [example] = re.findall(r"^```python\n(.*?)^```", text.split("## Routes", 1)[1].split("\n## ", 1)[0], re.S | re.M)
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "generate.md", "exec"), {})
    given = trajectory_inputs(tmp_path / "bend.json", 3, 16, route_points=8)
    assert given.routes.shape == (19, 8, 3)
    np.testing.assert_allclose(given.routes[0, :, 2], np.arange(10, 90, 10))  # s: 10, 20, ..., 80 m
    assert (np.diff(given.routes[0, :, 0]) > 0).all()  # y grows: the road bends left
    assert given.actions[-1, -1, 0] > 0  # and curve_left drives left
    with pytest.raises(TerraInputError, match=r"routes must have shape \[frames, 4, 2\]"):
        trajectory_inputs(tmp_path / "bend.json", 3, 16, route_points=4)  # control: a model of another K refuses it
