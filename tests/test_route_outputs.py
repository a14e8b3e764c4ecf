"""What a rollout was told of the road shows in its outputs (docs/generate.md, "Routes"; docs/rollout.md): a sidecar
keeps ``route`` (as before), ``route_source`` (where the routes came from: the scene, the file or sample and key) and
``ego_routes``, each frame's told route x first in its ego frame as ``ego_routes`` are written (null for a frame told
none); the video's inset draws the route on the frames that have one. terra-generate and terra-rollout alike, on the
tiny models of tests/test_route_files.py."""

from __future__ import annotations

import json
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest

from terra.batch import BatchConfig, run_batch
from terra.decoder.overlay import Inset
from terra.outputs import route_record
from terra.sim import Scene, builtin_road, make_clip
from tests.conftest import TINY_ROUTES
from tests.decoder.test_route_inset import magenta
from tests.roads.conftest import route_offsets
from tests.test_route_files import (  # noqa: F401  (models: the fixture)
    FRAMES, NUM_CONTEXT, NUM_FRAMES, bending_routes, models, run_generate, write_trajectory,
)

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread
ROAD = [[-20.0, 0.0], [200.0, 0.0]]  # a straight road along x, where a straight manoeuvre drives


def inset(video: np.ndarray) -> np.ndarray:
    """The inset's pixels of frames ``[..., H, W, 3]`` (the frames beside it are the tiny model's random colours)."""
    box = Inset.fit(*video.shape[-3:-1], reach_m=10.0)
    return video[..., box.y0 : box.y0 + box.size + 1, box.x0 : box.x0 + box.size + 1, :]


def generated(models: Path, trajectory: Path | None, out: Path, monkeypatch, *extra: str) -> tuple[dict, np.ndarray]:
    """terra-generate's rollout entry in its sidecar and its GIF's frames."""
    run_generate(models, "route_model", trajectory, out, monkeypatch, "output.formats=[gif]", *extra)
    [entry] = json.loads((out / "rollout.json").read_text())["rollouts"]
    return entry, iio.imread(out / "rollout.gif", index=None)


def test_terra_generate_keeps_and_draws_the_routes_told(models, tmp_path, monkeypatch):
    routes = bending_routes()
    ego = write_trajectory(tmp_path / "bend.json", routes, "ego_routes")
    entry, video = generated(models, ego, tmp_path / "ego", monkeypatch)
    assert entry["route"] is True and entry["route_source"] == f"{ego}: ego_routes"
    np.testing.assert_allclose(entry["ego_routes"], routes, atol=5e-4)  # as the file gave them
    assert all(magenta(inset(frame)).any() for frame in video)  # the last one too: it has no action, but a route

    road = write_trajectory(tmp_path / "road.json", ROAD, "road")
    entry, _ = generated(models, road, tmp_path / "road", monkeypatch)
    assert entry["route_source"] == f"{road}: road"
    s = (80.0 * np.arange(1, TINY_ROUTES + 1) / TINY_ROUTES).tolist()
    assert entry["ego_routes"][0] == [[x, 0.0] for x in s]  # on the lane given, straight ahead

    entry, _ = generated(models, None, tmp_path / "scene", monkeypatch, "manoeuvre=curve_left", "seed=3")
    scene, poses = builtin_road("curve_left", FRAMES, 3, {})
    assert entry["route_source"] == "scene"
    np.testing.assert_allclose(entry["ego_routes"], scene.route(poses, TINY_ROUTES)[..., :2], atol=5e-4)
    told = route_offsets(scene, poses, np.array(entry["ego_routes"]))  # where on the road each point is
    np.testing.assert_allclose(told, scene.ego_lane_offset_m, atol=0.05)  # the ego lane's centre, not the road's

    plain = tmp_path / "plain.json"  # control: poses without routes; nothing told, nothing drawn
    plain.write_text(json.dumps({"trajectory": {"x": [1.2 * i for i in range(8)], "y": [0.0] * 8}}))
    entry, video = generated(models, plain, tmp_path / "plain", monkeypatch)
    assert (entry["route"], entry["route_source"], entry["ego_routes"]) == (False, None, None)
    assert not magenta(inset(video)).any()


def test_a_frame_told_no_route_is_null():
    routes = np.stack([np.full((TINY_ROUTES, 3), np.nan), np.stack([np.arange(1.0, 5.0), np.full(4, 0.5),
                                                                   np.arange(1.0, 5.0)], 1)])
    record = route_record(routes, "scene", 3)  # the video's third frame: beyond the routes given
    assert record == {"route": True, "route_source": "scene",
                      "ego_routes": [None, [[1.0, 0.5], [2.0, 0.5], [3.0, 0.5], [4.0, 0.5]], None],
                      "route_told": ["none given", "told", "none given"]}


def test_terra_rollout_sidecars_keep_the_routes_told(models, tmp_path):
    clip = make_clip(Scene.generate(0), "straight", FRAMES, 64, 64)
    (tmp_path / "clip").mkdir()
    for t in range(NUM_CONTEXT):
        iio.imwrite(tmp_path / "clip" / f"{t:02d}.png", clip.frames[t])
    lines = [{"sample_id": "road", "context": "clip/", "manoeuvre": "straight", "road": ROAD},
             {"sample_id": "ego", "context": "clip/", "manoeuvre": "straight",
              "ego_routes": bending_routes().tolist()},
             {"sample_id": "none", "context": "clip/", "manoeuvre": "straight"}]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    result = run_batch(BatchConfig(samples=str(samples), output_dir=str(out), world_model=str(models / "route_model"),
                                   tokenizer=str(models / "tokenizer"), backend="hf", device="cpu", num_threads=1,
                                   num_frames=NUM_FRAMES, num_context=NUM_CONTEXT, progress=False, formats=("gif",),
                                   overlay_trajectory=True))
    assert [r["status"] for r in result.records] == ["ok"] * 3
    sidecars = {line["sample_id"]: json.loads((out / f"{line['sample_id']}.json").read_text()) for line in lines}
    assert sidecars["road"]["route_source"] == "sample 'road': road"
    assert sidecars["road"]["ego_routes"][0] == [[20.0 * k, 0.0] for k in range(1, TINY_ROUTES + 1)]
    assert sidecars["ego"]["route_source"] == "sample 'ego': ego_routes"
    np.testing.assert_allclose(sidecars["ego"]["ego_routes"], bending_routes(), atol=5e-4)
    assert [sidecars[k]["route"] for k in ("road", "ego", "none")] == [True, True, False]
    assert (sidecars["none"]["route_source"], sidecars["none"]["ego_routes"]) == (None, None)
    assert magenta(inset(iio.imread(out / "ego.gif", index=0))).any()
    assert not magenta(inset(iio.imread(out / "none.gif", index=None)[: FRAMES - 1])).any()


def test_terra_rollouts_inset_is_on_by_default_but_off_for_act_bench(tmp_path):
    """terra-rollout's settings as its Hydra run composes them: the inset draws by default; with
    ``output.naming=actbench`` it is off (ACT-Bench's scorer reads the frames) unless asked for."""
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR
    from terra.batch import batch_spec

    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    drawn = {}
    for name, extra in (("default", []), ("actbench", ["output.naming=actbench"]),
                        ("actbench, asked", ["output.naming=actbench", "output.overlay_trajectory=true"]),
                        ("off", ["output.overlay_trajectory=false"])):
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            cfg = compose("rollout", overrides=[f"samples={samples}", f"output.dir={tmp_path / 'out'}", *extra])
        drawn[name] = batch_spec(cfg, progress=False).overlay_trajectory
    assert drawn == {"default": True, "actbench": False, "actbench, asked": True, "off": False}
