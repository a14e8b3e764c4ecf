"""Routes in trajectory files (docs/generate.md, "Routes"): a JSON trajectory's ``ego_routes`` (x first) reach the
requests of a route model as the file gives them, and its ``road`` becomes every frame's route at that frame's pose,
read and checked once where the file enters and before any model loads; a bad route, an unknown key, a value that is
not a number, a route behind the car or too few routes is one line in the user's terms (exit 2 from
``terra-generate``); a model without route slots runs without them and says so; the docs' example is read as the docs
say, and ``--help`` shows the forms.

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

import terra.apps.generate
import terra.config.files
import terra.contract.actions
import terra.contract.routes
import terra.inputs.actions
from terra.apps.help import page_template
from terra.core.errors import TerraInputError
from terra.contract.routes import route_distances
from terra.inputs.requests import trajectory_inputs
from terra.inputs.samples import HOLDS, read_samples
from terra.roads import road_from_csv
from terra.sim import builtin_road
from terra.pipeline import WorldModelPipeline
from tests.conftest import TINY_ROUTES, one_error_line, save_tiny_tokenizer, tiny_model, tiny_route_model
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
    save_tiny_tokenizer(root / "tokenizer")
    return root


def bending_routes(frames: int = FRAMES, points: int = TINY_ROUTES) -> np.ndarray:
    """``[frames, K, 2]`` x, y: a road bending left ever more sharply, a different route for every frame."""
    s = route_distances(points).astype(np.float64)
    return np.stack([np.stack([s, 0.002 * (t + 1) * s**2], axis=1) for t in range(frames)])


def write_trajectory(path: Path, routes, key: str = "ego_routes", **form) -> Path:
    """A JSON trajectory (``form``, default a straight manoeuvre) with ``routes`` under ``key`` as given."""
    path.write_text(json.dumps({**(form or {"manoeuvre": "straight"}), key: np.asarray(routes).tolist()}))
    return path



def generate_cfg(models: Path, model: str, trajectory: Path, *extra: str):
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return compose("generate", overrides=[
            "backend=hf", "device=cpu", "num_threads=1", f"num_frames={NUM_FRAMES}",
            *([] if trajectory is None else [f"trajectory={trajectory}"]),
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
def test_a_route_model_s_requests_carry_the_file_s_routes_read_and_checked_once(models, tmp_path, monkeypatch, values):
    """``ego_routes`` rows ``[x, y]`` or ``[x, y, s]``."""
    routes = bending_routes()
    if values == 3:  # [x, y, s]: the distances written out
        routes = np.concatenate([routes, np.broadcast_to(route_distances(TINY_ROUTES)[:, None], (FRAMES, 4, 1))], -1)
    trajectory = write_trajectory(tmp_path / "bend.json", routes)
    with calls(terra.inputs.actions.read_trajectory_file, terra.config.files.read_input_text,
               terra.contract.actions.validate_actions, terra.contract.routes.validate_routes) as counts:
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
    """Control: a trajectory of poses without routes has none (the routes above came from the file; a manoeuvre
    file over the built-in frames gets the scene's road: tests/test_route_generate.py)."""
    trajectory = tmp_path / "straight.json"
    trajectory.write_text(json.dumps({"trajectory": {"x": [1.2 * i for i in range(8)], "y": [0.0] * 8}}))
    [request] = run_generate(models, "route_model", trajectory, tmp_path / "out", monkeypatch)
    assert request.routes is None
    assert json.loads((tmp_path / "out" / "rollout.json").read_text())["rollouts"][0]["route"] is False


def test_a_model_without_route_slots_runs_without_the_file_s_routes_and_says_so_once(models, tmp_path,
                                                                                     monkeypatch, capsys):
    trajectory = write_trajectory(tmp_path / "bend.json", bending_routes(frames=2, points=7))  # unused
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
    "too_far": (bending_routes() * [15.0, 1.0], "a route point lies 1200 m from the car, more than 1000 m"),
    "too_few_frames": (bending_routes(frames=FRAMES - 1), "gives 4 routes, one short: the rollout has 5 frames (3 "
                       "context + 2 generated), and each needs its route"),
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
    with pytest.raises(TerraInputError, match=r"^scene 7: ego_routes: holds NaN or inf; replace them with finite"):
        trajectory_inputs({"manoeuvre": "straight", "ego_routes": routes}, NUM_CONTEXT, NUM_FRAMES,
                          TINY_ROUTES, "scene 7")


def test_skip_drops_the_routes_of_the_frames_not_used():
    """ACT-Bench's rule: the rows of context frames not used go, routes as actions."""
    routes = bending_routes(frames=FRAMES + 2)
    given = trajectory_inputs({"manoeuvre": "straight", "ego_routes": routes}, NUM_CONTEXT, NUM_FRAMES,
                              TINY_ROUTES, skip=2)
    np.testing.assert_allclose(given.routes[..., :2], routes[2:], rtol=1e-6)
    with pytest.raises(TerraInputError, match=r"gives 6 routes, one short: the rollout has 5 frames \(3 context \+ 2 "
                                              r"generated\) after 2 context frames not used, and each of the 7 needs "
                                              r"its route, frame 0 \(the trajectory's first pose\) to frame 6"):
        trajectory_inputs({"manoeuvre": "straight", "ego_routes": routes[1:]}, NUM_CONTEXT, NUM_FRAMES,
                          TINY_ROUTES, skip=2)


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
    line = one_error_line(result, "terra-generate", f"{trajectory}: ego_routes: gives 2 routes, 3 short: the rollout "
                                                    "has 5 frames (3 context + 2 generated)")
    assert "one route per pose and one for the frame after the last pose" in line
    assert not out.exists() or not [p for p in out.iterdir() if not p.name.startswith(".")]



def test_the_docs_route_example_writes_a_file_that_a_k8_model_reads(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "generate.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text.split("## Routes", 1)[1].split("\n## ", 1)[0], re.S | re.M)
    [example] = [block for block in blocks if "bend.json" in block]
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "generate.md", "exec"), {})
    given = trajectory_inputs(tmp_path / "bend.json", 3, 16, route_tokens=8)
    assert given.routes.shape == (19, 8, 3)
    np.testing.assert_allclose(given.routes[0, :, 2], np.arange(10, 90, 10))  # s: 10, 20, ..., 80 m
    assert (np.diff(given.routes[0, :, 1]) > 0).all()  # y grows: the road bends left
    assert given.actions[-1, -1, 0] > 0  # and curve_left drives left
    np.testing.assert_allclose(np.hypot(given.routes[0, :, 0], given.routes[0, :, 1] - 200.0), 200.0, atol=0.01)
    four = trajectory_inputs(tmp_path / "bend.json", 3, 16, route_tokens=4)  # a road serves a model of any K
    np.testing.assert_allclose(four.routes[..., :2], given.routes[:, 1::2, :2], atol=0.01)


# Routes as a person writes them (terra/inputs/routes.py): x first, under a name that says so, or as a road; every
# key known; numbers that are numbers; each route ahead of its car; counts in the user's terms.

STRAIGHT = [[float(s), 0.0] for s in route_distances(TINY_ROUTES)]  # [x, y]: the road straight ahead


def test_ego_routes_are_x_first_so_a_straight_road_is_straight_ahead():
    given = trajectory_inputs({"manoeuvre": "straight", "ego_routes": [STRAIGHT] * FRAMES}, NUM_CONTEXT, NUM_FRAMES,
                              TINY_ROUTES)
    np.testing.assert_array_equal(given.routes[..., 1], 0.0)  # y: no turn (read as [y, x] it was a 90-degree left)
    np.testing.assert_array_equal(given.routes[..., 0], np.broadcast_to(route_distances(TINY_ROUTES), (FRAMES, 4)))


def test_a_route_behind_the_car_is_refused():
    behind = [STRAIGHT] * FRAMES
    behind[3] = [[-x, y] for x, y in STRAIGHT]
    with pytest.raises(TerraInputError, match=r"ego_routes: the route of frame 3 does not lie ahead .* x = -20 m; .*"
                                              r"\(its rows are \[x, y\]: x forward"):
        trajectory_inputs({"manoeuvre": "straight", "ego_routes": behind}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES)


@pytest.mark.parametrize("route_tokens", [TINY_ROUTES, 0])
@pytest.mark.parametrize("key, guess", [("route", "ego_routes"), ("routes", "ego_routes"), ("Routes", "ego_routes"),
                                        ("ego_route", "ego_routes"), ("roads", "road"), ("trajectroy", "trajectory"),
                                        ("colour", None)])
def test_an_unknown_key_is_refused_with_a_guess(tmp_path, key, guess, route_tokens):
    """Before, a misspelt route key was dropped without a word and the run went on without a route."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"manoeuvre": "straight", key: [STRAIGHT] * FRAMES}))
    with pytest.raises(TerraInputError) as err:
        trajectory_inputs(path, NUM_CONTEXT, NUM_FRAMES, route_tokens)
    message = str(err.value)
    assert message.startswith(f"{path}: unknown key {key!r}") and "\n" not in message, message
    assert (f"(did you mean {guess!r}?)" in message) if guess else "did you mean" not in message, message


def test_unknown_keys_are_refused_in_jsonl_lines_and_inside_a_trajectory(tmp_path):
    """A batch line (terra-rollout, terra-drive) and a trajectory mapping: a near miss is refused, also in an
    ACT-Bench row, whose other columns (reference_traj, ...) are its own."""
    frames = ["a.png", "b.png", "c.png"]
    lines = [{"sample_id": 1, "context": "c/", "manoeuvre": "straight", "route": [STRAIGHT] * FRAMES},
             {"sample_id": 2, "context": "c/", "manoeuvre": "straight", "sead": 3},
             {"sample_id": 3, "context_frames": frames, "instruction_trajs": [], "Routes": []},
             {"sample_id": 4, "context_frames": frames, "instruction_trajs": [], "reference_traj": [], "cond": 1},
             {"sample_id": 5, "context": "c/", "manoeuvre": "straight", "ego_routes": [STRAIGHT] * FRAMES}]
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert [sample.error for sample in read_samples(tmp_path / "s.jsonl")] == [
        "line 1: unknown key 'route' (did you mean 'ego_routes'?); " + HOLDS,
        "line 2: unknown key 'sead' (did you mean 'seed'?); " + HOLDS,
        "line 3: unknown key 'Routes' (did you mean 'ego_routes'?); " + HOLDS, None, None]
    with pytest.raises(TerraInputError, match=r"^s: trajectory: unknown key 'routes'; a trajectory mapping holds x, "
                                              r"y and optionally yaw, t \(or timestamp\) or rate_hz; a road or "
                                              "ego_routes go beside it, not inside"):
        trajectory_inputs({"trajectory": {"x": [0, 1, 2, 3], "y": [0, 0, 0, 0], "routes": [STRAIGHT] * FRAMES}},
                          NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES, "s")


POSES = {"x": [1.2 * i for i in range(6)], "y": [0.0] * 6}  # 12 m/s along x, enough for 3 + 2 frames


@pytest.mark.parametrize("value, text", [
    ({"manoeuvre": "straight", "ego_routes": [[["10", 0]] + STRAIGHT[1:]] * FRAMES},
     "s: ego_routes: holds values that are not numbers: the string '10'; write numbers without quotes"),
    ({"manoeuvre": "straight", "ego_routes": [[[True, 0]] + STRAIGHT[1:]] * FRAMES},
     "s: ego_routes: holds values that are not numbers: true (a boolean)"),
    ({"trajectory": {**POSES, "x": ["0"] + POSES["x"][1:]}}, "s: x: holds values that are not numbers: the string '0'"),
    ({"trajectory": {**POSES, "y": ["1_0"] + POSES["y"][1:]}}, "s: y: holds values that are not numbers: the string"),
    ({"trajectory": {**POSES, "yaw": [False] * 6}}, "s: yaw: holds values that are not numbers: false (a boolean)"),
    ({"trajectory": {**POSES, "t": ["0.1"] * 6}}, "s: t: holds values that are not numbers: the string '0.1'"),
    ({"actions": [[["1.5", 1, 0.45]] * 6] * 4}, "s: holds values that are not numbers: the string '1.5'"),
    ({"manoeuvre": "straight", "road": [[0, 0], ["30", 0]]}, "s: road[1][0]: must be a number (x, metres), got '30'"),
])
def test_numbers_must_be_numbers_wherever_coordinates_are_read(value, text):
    """Before, ``np.asarray(..., float64)`` read "1.5", "1_0" and booleans as numbers."""
    with pytest.raises(TerraInputError) as err:
        trajectory_inputs(value, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES, "s")
    assert str(err.value).startswith(text), str(err.value)


def test_numpy_numbers_are_numbers_in_a_road_given_from_python():
    """A road built with numpy (float32 and int64 points, int64 successors) is the road its Python numbers give."""
    lanes = [{"points": [[np.int64(-20), np.float32(0)], [np.float64(30), np.float32(0)]], "successors": [np.int64(1)]},
             [[np.float32(30), np.float32(0)], [np.float32(200), np.float32(0)]]]
    plain = [{"points": [[-20, 0.0], [30.0, 0.0]], "successors": [1]}, [[30.0, 0.0], [200.0, 0.0]]]
    given, expected = (trajectory_inputs({"manoeuvre": "straight", "road": road}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES)
                       for road in (lanes, plain))
    np.testing.assert_array_equal(given.routes, expected.routes)
    with pytest.raises(TerraInputError, match=r"road\[0\]\[0\]: must be a number \(x, metres\), got np.True_"):
        trajectory_inputs({"manoeuvre": "straight", "road": [[np.bool_(True), 0], [1, 0]]}, NUM_CONTEXT, NUM_FRAMES,
                          TINY_ROUTES, "s")


def test_a_csv_cell_must_be_a_plain_number(tmp_path):
    """``float()`` takes "1_0", "0_5e1" and other scripts' digits; a trajectory or road CSV does not."""
    for cell in ("1_0", "0_5e1", "\u0661"):
        path = tmp_path / "t.csv"
        path.write_text("x,y\n" + "".join(f"{1.2 * i},0\n" for i in range(5)) + f"{cell},0\n", encoding="utf-8")
        with pytest.raises(TerraInputError, match=rf"a value is not a number \('{cell}' is not a number\)"):
            trajectory_inputs(path, NUM_CONTEXT, NUM_FRAMES)
        with pytest.raises(TerraInputError, match=rf"line 3, column x: '{cell}' is not a finite number"):
            road_from_csv(f"x,y\n0,0\n{cell},0\n")
    control = tmp_path / "ok.csv"
    control.write_text("x,y\n" + "".join(f"{1.2 * i:.1f},0\n" for i in range(6)))
    assert len(trajectory_inputs(control, NUM_CONTEXT, NUM_FRAMES).actions) == 4


def _scene_trajectory(scene, poses: np.ndarray) -> dict:
    return {"trajectory": {"x": poses[:, 0].tolist(), "y": poses[:, 1].tolist(), "yaw": poses[:, 2].tolist()}}


@pytest.mark.parametrize("manoeuvre", ["curve_left", "accelerate", "follow_lane"])
def test_a_road_gives_every_frame_the_route_at_its_pose(tmp_path, manoeuvre):
    """A built-in scene's road written as a road file in the scene's world frame, beside the poses of a drive there:
    each frame's route is the scene's own at that pose (within 5 cm), so nothing need be transformed by hand."""
    scene, poses = builtin_road(manoeuvre, 30, 406, {})
    lane = scene.lane_pose(np.arange(0.0, scene.length_m, 0.5))[:, :2]  # the ego lane's centre, as a map gives it
    path = tmp_path / "drive.json"
    path.write_text(json.dumps({**_scene_trajectory(scene, poses), "road": lane.round(4).tolist()}))
    given = trajectory_inputs(path, NUM_CONTEXT, 16, route_tokens=8)
    assert given.routes.shape == (19, 8, 3) and not np.isnan(given.routes).any()
    np.testing.assert_allclose(given.routes, scene.route(poses[:19], 8), atol=0.05)


def test_at_a_fork_the_road_follows_the_branch_the_trajectory_takes():
    """A Y-fork 30 m ahead: the later poses of the trajectory choose the branch of every frame's route."""
    d = np.arange(0.0, 101.0, 5.0)
    branch = [np.stack([30 + d * np.cos(a), d * np.sin(a)], axis=1).tolist() for a in (0.35, -0.35)]
    road = [{"points": [[-20, 0], [30, 0]], "successors": [1, 2]}, branch[0], branch[1]]
    for side, sign in ((0, 1.0), (1, -1.0)):
        along = np.concatenate([np.stack([np.arange(0.0, 30.0, 1.2), np.zeros(25)], axis=1), branch[side][1:]])
        given = trajectory_inputs({"trajectory": {"x": along[:, 0].tolist(), "y": along[:, 1].tolist()},
                                   "road": road}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES)
        assert np.sign(given.routes[:, -1, 1]).tolist() == [sign] * FRAMES  # y at 80 m: on the branch taken


def test_a_road_needs_world_poses_and_a_lane_near_them():
    road = [[-20.0, 0.0], [200.0, 0.0]]
    given = trajectory_inputs({"manoeuvre": "straight", "road": road}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES)
    straight = np.array([[1.0, 0.0]]) * route_distances(4)[:, None]
    np.testing.assert_allclose(given.routes[..., :2], np.broadcast_to(straight, (FRAMES, 4, 2)), atol=1e-4)
    assert given.manoeuvre is not None and given.manoeuvre.name == "straight"
    with pytest.raises(TerraInputError, match=r"^s: road: a road is followed along the trajectory's world poses"):
        trajectory_inputs({"actions": np.zeros((4, 6, 3)).tolist(), "road": road}, NUM_CONTEXT, NUM_FRAMES,
                          TINY_ROUTES, "s")
    with pytest.raises(TerraInputError, match=r"^s: road: no frame's pose lies on a lane of the road \(within 4 m"):
        trajectory_inputs({"manoeuvre": "straight", "road": [[0.0, -20.0], [0.0, 200.0]]}, NUM_CONTEXT, NUM_FRAMES,
                          TINY_ROUTES, "s")  # x and y swapped: the road crosses the car's path
    with pytest.raises(TerraInputError, match=r"^s: gives road and ego_routes; give one"):
        trajectory_inputs({"manoeuvre": "straight", "road": road, "ego_routes": [STRAIGHT] * FRAMES}, NUM_CONTEXT,
                          NUM_FRAMES, TINY_ROUTES, "s")
    unused = trajectory_inputs({"manoeuvre": "straight", "road": road}, NUM_CONTEXT, NUM_FRAMES, 0)
    assert unused.routes is None and unused.unused_routes
    assert trajectory_inputs({"manoeuvre": "straight", "road": None}, NUM_CONTEXT, NUM_FRAMES, TINY_ROUTES).routes \
        is None  # null: no route


def test_terra_generate_s_help_shows_the_route_forms():
    """``--help`` named no route, and its JSON line ("an object with one key") ruled them out."""
    page = page_template("generate").replace("$$", "$")
    assert "an object with one key" not in page
    for form in ('"road" [[x, y], ...]', '"ego_routes" [num_context + num_frames, K, 2|3]', "rows [x, y]",
                 "any other key is an error", "a manoeuvre file\n         drives the built-in scene and gets its road"):
        assert form in page, form
