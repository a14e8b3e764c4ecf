"""Routes in batch samples (docs/rollout.md, "Routes"): a sample's ``ego_routes`` (Terra's format and ACT-Bench's,
whose rows of unused context frames are dropped) or its JSON trajectory file's reach its request for a route model;
a bad route fails its sample alone with one line before the model loads; a model without route slots runs the
samples without them and the run says so in one line; each sidecar tells whether a route conditioned its rollout.

Tiny models (:func:`tests.conftest.tiny_route_model`, K = 4; :func:`tests.conftest.tiny_model`, none) on 64x64
frames, two generated frames: the file runs in seconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from terra.batch import BatchConfig, run_batch, stream
from terra.contract.routes import route_distances
from terra.sim import Scene, make_clip
from tests.conftest import TINY_ROUTES, save_tiny_tokenizer, tiny_model, tiny_route_model
from tests.test_route_files import bending_routes

NUM_CONTEXT, NUM_FRAMES = 3, 2
FRAMES = NUM_CONTEXT + NUM_FRAMES

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Saved models (``route_model``, ``plain_model``) and tokenizer; context frames ``clip/`` (4 frames); a JSON
    trajectory with routes and a CSV trajectory, which carries none."""
    root = tmp_path_factory.mktemp("batch_routes")
    tiny_route_model().save_pretrained(root / "route_model")
    tiny_model().save_pretrained(root / "plain_model")
    save_tiny_tokenizer(root / "tokenizer")
    clip = make_clip(Scene.generate(0), "straight", FRAMES + 1, 64, 64)
    (root / "clip").mkdir()
    for t in range(NUM_CONTEXT + 1):
        Image.fromarray(clip.frames[t]).save(root / "clip" / f"{t:02d}.png")
    (root / "trajs.json").write_text(json.dumps(np.round(clip.instruction_trajs, 3).tolist()))
    routed = {"manoeuvre": "straight", "ego_routes": (bending_routes() * 0.5).tolist()}
    (root / "routed.json").write_text(json.dumps(routed))
    (root / "path.csv").write_text("x,y\n" + "".join(f"{1.2 * i},0.0\n" for i in range(40)))
    return root


def lines(root: Path) -> list[dict]:
    """One sample of each way to give routes, one without, and two mistakes."""
    trajs = json.loads((root / "trajs.json").read_text())
    frames = [f"clip/{t:02d}.png" for t in range(NUM_CONTEXT + 1)]
    return [
        {"sample_id": "inline", "context": "clip/", "manoeuvre": "straight",
         "ego_routes": bending_routes().tolist()},
        {"sample_id": 7, "context_frames": frames, "instruction_trajs": trajs,  # 4 frames, 3 used: the first dropped
         "ego_routes": bending_routes(frames=FRAMES + 1).tolist()},
        {"sample_id": "file", "context": "clip/", "trajectory": "routed.json"},
        {"sample_id": "csv", "context": "clip/", "trajectory": "path.csv",
         "ego_routes": (bending_routes() * 2).tolist()},
        {"sample_id": "none", "context": "clip/", "manoeuvre": "straight"},
        {"sample_id": "three_points", "context": "clip/", "manoeuvre": "straight",
         "ego_routes": bending_routes(points=3).tolist()},
        {"sample_id": "twice", "context": "clip/", "trajectory": "routed.json",
         "ego_routes": bending_routes().tolist()},
    ]


def record_request_routes(monkeypatch) -> dict:
    """A dict that fills, as the batch runs, with each sample's request routes (as the engine gets them)."""
    routes: dict = {}
    prepare = stream.prepare_sample

    def recording(item, *args, **kwargs):
        prepared = prepare(item, *args, **kwargs)
        routes[prepared.item.sample.sample_id] = prepared.request.routes
        return prepared

    monkeypatch.setattr(stream, "prepare_sample", recording)
    return routes


def run(root: Path, tmp_path: Path, model: str, monkeypatch) -> tuple[dict, dict, dict]:
    """Run the batch; return each sample's request routes (as the engine got them), records and sidecars."""
    samples = root / f"{tmp_path.name}.jsonl"  # beside the frames and trajectory files its paths name
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines(root)))
    routes = record_request_routes(monkeypatch)
    out = tmp_path / "out"
    result = run_batch(BatchConfig(samples=str(samples), output_dir=str(out), world_model=str(root / model),
                                   tokenizer=str(root / "tokenizer"), backend="hf", device="cpu", num_threads=1,
                                   num_frames=NUM_FRAMES, num_context=NUM_CONTEXT, progress=False, formats=("gif",)))
    records = {r["sample_id"]: r for r in result.records}
    sidecars = {r["sample_id"]: json.loads((out / f"{r['sample_id']}.json").read_text())
                for r in result.records if r["status"] == "ok"}
    return routes, records, sidecars


def test_samples_routes_reach_a_route_model_s_requests(inputs, tmp_path, monkeypatch):
    routes, records, sidecars = run(inputs, tmp_path, "route_model", monkeypatch)
    expected = {"inline": bending_routes(), 7: bending_routes(frames=FRAMES + 1)[1:],  # ACT-Bench: frame 0 dropped
                "file": bending_routes() * 0.5, "csv": bending_routes() * 2}
    for sample_id, given in expected.items():
        assert records[sample_id]["status"] == "ok", records[sample_id]
        assert routes[sample_id].shape == (FRAMES, TINY_ROUTES, 3)
        np.testing.assert_allclose(routes[sample_id][..., :2], given, rtol=1e-6, err_msg=str(sample_id))
        assert sidecars[sample_id]["route"] is True
    assert routes["none"] is None and sidecars["none"]["route"] is False  # control: no routes, no route
    for sample_id, text in [("three_points", "sample 'three_points': ego_routes: routes must have shape [frames, 4, "
                                             "2]"),
                            ("twice", "sample 'twice' gives routes twice, in the sample and in its trajectory file "
                                      "'routed.json'; keep one")]:
        record = records[sample_id]
        assert record["status"] == "failed" and record["stage"] == "input", record  # before the model loaded
        assert text in record["error"] and "\n" not in record["error"], record["error"]
    assert sample_id not in routes


def test_a_model_without_route_slots_runs_samples_with_routes_and_says_so_once(inputs, tmp_path, monkeypatch,
                                                                             capsys):
    routes, records, sidecars = run(inputs, tmp_path, "plain_model", monkeypatch)
    assert {k: r["status"] for k, r in records.items()} == {
        "inline": "ok", 7: "ok", "file": "ok", "csv": "ok", "none": "ok", "three_points": "ok", "twice": "failed"}
    assert all(given is None for given in routes.values()) and len(routes) == 6
    assert all(sidecar["route"] is False for sidecar in sidecars.values())
    said = [line for line in capsys.readouterr().err.splitlines() if "carry routes" in line]
    assert said == ["terra-rollout: 5 sample(s) carry routes; the world model has no route slots (num_route_tokens 0), "
                    "so it runs without them"]


def test_a_rerun_redoes_a_sample_whose_trajectory_file_or_world_model_changed(inputs, tmp_path, monkeypatch, capsys):
    """A sample's fingerprint covers the content of the files it names and the world model (docs/rollout.md, "What a
    rerun keeps"): a trajectory file that gains routes, or whose routes change, makes its sample again with them
    (its sidecar then says ``"route": true``); a model of other weights makes every sample again; unchanged samples,
    and the same model's files at another path, are kept."""
    trajectory = tmp_path / "path.json"
    trajectory.write_text(json.dumps({"manoeuvre": "straight"}))
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"sample_id": "file", "context": "clip/", "trajectory": "path.json"}) + "\n"
                       + json.dumps({"sample_id": "same", "context": "clip/", "manoeuvre": "straight"}) + "\n")
    routes = record_request_routes(monkeypatch)
    out = tmp_path / "out"

    def rerun(model: Path) -> dict:
        routes.clear()
        result = run_batch(BatchConfig(samples=str(samples), output_dir=str(out), image_root=str(inputs),
                                       world_model=str(model), tokenizer=str(inputs / "tokenizer"), backend="hf",
                                       device="cpu", num_threads=1, num_frames=NUM_FRAMES, num_context=NUM_CONTEXT,
                                       progress=False, formats=("gif",)))
        return {r["sample_id"]: r["status"] for r in result.records}

    model = inputs / "route_model"
    assert rerun(model) == {"file": "ok", "same": "ok"}
    assert json.loads((out / "file.json").read_text())["route"] is False and routes["file"] is None
    for scale in (1.0, 0.5):  # the file gains routes, then its routes change
        ego_routes = (bending_routes() * scale).tolist()
        trajectory.write_text(json.dumps({"manoeuvre": "straight", "ego_routes": ego_routes}))
        assert rerun(model) == {"file": "ok", "same": "skipped"}
        assert json.loads((out / "file.json").read_text())["route"] is True
        np.testing.assert_allclose(routes["file"][..., :2], bending_routes() * scale, rtol=1e-6)
    assert "terra-rollout: 1 sample redone: the sample's files changed" in capsys.readouterr().err
    copy = tmp_path / "copy"  # the same files elsewhere: the same model
    copy.mkdir()
    for file in model.iterdir():
        (copy / file.name).write_bytes(file.read_bytes())
    assert rerun(copy) == {"file": "skipped", "same": "skipped"} and routes == {}
    tiny_route_model(seed=1).save_pretrained(copy)  # other weights in the same folder
    assert rerun(copy) == {"file": "ok", "same": "ok"}
    assert "terra-rollout: 2 samples redone: the world model changed" in capsys.readouterr().err


def test_samples_give_a_road_or_ego_routes(inputs, tmp_path, monkeypatch):
    """A sample's ``road`` (beside an inline trajectory, a CSV file of poses or the default manoeuvre) becomes every
    frame's route at its pose; ``ego_routes`` are x first; a misspelt key fails its line, a road beside ACT-Bench's
    ego-frame trajectories its sample, each in one line."""
    road = [[-20.0, 0.0], [200.0, 0.0]]  # the straight road the samples drive along x
    trajs = json.loads((inputs / "trajs.json").read_text())
    frames = [f"clip/{t:02d}.png" for t in range(NUM_CONTEXT + 1)]
    lines = [{"sample_id": "road", "context": "clip/", "trajectory": {"x": [1.2 * i for i in range(8)], "y": [0] * 8},
              "road": road},
             {"sample_id": "csv", "context": "clip/", "trajectory": "path.csv", "road": road},
             {"sample_id": "default", "context": "clip/", "road": road},
             {"sample_id": "ego", "context": "clip/", "manoeuvre": "straight",
              "ego_routes": bending_routes().tolist()},
             {"sample_id": "typo", "context": "clip/", "manoeuvre": "straight", "route": bending_routes().tolist()},
             {"sample_id": "actbench", "context_frames": frames, "instruction_trajs": trajs, "road": road}]
    samples = inputs / f"{tmp_path.name}.jsonl"
    samples.write_text("".join(json.dumps(line) + "\n" for line in lines))
    routes = record_request_routes(monkeypatch)
    result = run_batch(BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"),
                                   world_model=str(inputs / "route_model"), tokenizer=str(inputs / "tokenizer"),
                                   backend="hf", device="cpu", num_threads=1, num_frames=NUM_FRAMES,
                                   num_context=NUM_CONTEXT, progress=False, formats=("gif",),
                                   default_manoeuvre="straight"))
    records = {r["sample_id"]: r for r in result.records}
    straight = np.broadcast_to(np.stack([route_distances(TINY_ROUTES), np.zeros(TINY_ROUTES)], 1), (FRAMES, 4, 2))
    for sample_id in ("road", "csv", "default"):
        assert records[sample_id]["status"] == "ok", records[sample_id]
        np.testing.assert_allclose(routes[sample_id][..., :2], straight, atol=1e-4, err_msg=sample_id)
    for sample_id in ("ego",):
        np.testing.assert_allclose(routes[sample_id][..., :2], bending_routes(), rtol=1e-6, err_msg=sample_id)
    assert records["typo"]["stage"] == "parse" and "unknown key 'route' (did you mean 'ego_routes'?)" in \
        records["typo"]["error"]
    assert records["actbench"]["stage"] == "input"
    assert "sample 'actbench': road: a road is followed along the trajectory's world poses" in \
        records["actbench"]["error"]


def test_a_samples_road_may_be_a_file_beside_the_samples(inputs, tmp_path, monkeypatch):
    """``"road": "road.csv"`` (relative to the JSONL; a clipgt zip or folder, a road.json alike) is the road the
    inline polyline gives; a road file that does not exist fails its sample alone, before the model loads."""
    (inputs / "road.csv").write_text("x,y\n-20,0\n200,0\n")
    samples = inputs / f"{tmp_path.name}.jsonl"  # beside the frames and the road
    samples.write_text("".join(json.dumps({"sample_id": sid, "context": "clip/", "manoeuvre": "straight",
                                           "road": road}) + "\n"
                               for sid, road in (("file", "road.csv"), ("inline", [[-20, 0], [200, 0]]),
                                                 ("missing", "nowhere.csv"))))
    routes = record_request_routes(monkeypatch)
    result = run_batch(BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"),
                                   world_model=str(inputs / "route_model"), tokenizer=str(inputs / "tokenizer"),
                                   backend="hf", device="cpu", num_threads=1, num_frames=NUM_FRAMES,
                                   num_context=NUM_CONTEXT, progress=False, formats=("gif",)))
    records = {r["sample_id"]: r for r in result.records}
    assert records["file"]["status"] == records["inline"]["status"] == "ok"
    np.testing.assert_array_equal(routes["file"], routes["inline"])
    np.testing.assert_allclose(routes["file"][..., 0], np.broadcast_to(route_distances(4), (FRAMES, 4)), atol=1e-3)
    assert records["missing"]["stage"] == "input" and "nowhere.csv: does not exist" in records["missing"]["error"]


def test_a_road_that_ends_is_said_per_frame_in_the_manifest_and_in_one_line(inputs, tmp_path):
    """terra-rollout run as a user runs it: a sample driving 1.2 m a frame along a road that ends 42 m ahead of its
    first frame; frames left with under 40 m of road are told none, each sidecar and manifest record says so per
    frame, stdout in one line."""
    samples = inputs / f"{tmp_path.name}.jsonl"
    samples.write_text(json.dumps({"sample_id": "short", "context": "clip/", "road": [[-20, 0], [42, 0]],
                                   "trajectory": {"x": [1.2 * i for i in range(8)], "y": [0] * 8}}) + "\n")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "terra.apps.rollout", f"samples={samples}", f"output.dir={out}",
                           f"model.world_model={inputs / 'route_model'}", f"tokenizer.path={inputs / 'tokenizer'}",
                           "backend=hf", "device=cpu", "num_threads=1", f"num_frames={NUM_FRAMES}",
                           f"num_context={NUM_CONTEXT}", "progress=false", "output.formats=[gif]"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    told = ["told", "told", "road ended", "road ended", "road ended"]  # 42, 40.8, then 39.6 m of road ahead
    [record] = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert record["route_told"] == json.loads((out / "short.json").read_text())["route_told"] == told
    assert "terra-rollout: route told in 2 of 5 frames: 3 road ended\n" in done.stdout


# terra-rollout in a subprocess; its last stdout line says whether torch was imported before its first stderr line
FIRST_LINE_PROBE = """import runpy, sys
class Probe:
    def __init__(self, stream):
        self.stream, self.torch = stream, None
    def write(self, text):
        if self.torch is None and text.strip():
            self.torch = 'torch' in sys.modules
        return self.stream.write(text)
    def __getattr__(self, name):
        return getattr(self.stream, name)
sys.stderr = probe = Probe(sys.stderr)
try:
    runpy.run_module('terra.apps.rollout', run_name='__main__', alter_sys=True)
finally:
    print('torch before the first line:', probe.torch, '| torch at the end:', 'torch' in sys.modules, flush=True)
"""


def rollout_probed(inputs: Path, samples: Path, out: Path) -> subprocess.CompletedProcess:
    """terra-rollout on the tiny route model, run as a user runs it, under :data:`FIRST_LINE_PROBE`."""
    return subprocess.run([sys.executable, "-c", FIRST_LINE_PROBE, f"samples={samples}", f"output.dir={out}",
                           f"model.world_model={inputs / 'route_model'}", f"tokenizer.path={inputs / 'tokenizer'}",
                           "backend=hf", "device=cpu", "num_threads=1", f"num_frames={NUM_FRAMES}",
                           f"num_context={NUM_CONTEXT}", "progress=false", "output.formats=[gif]"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})


OFF_ROAD = {"sample_id": "off", "context": "clip/", "road": [[5, -20], [5, 200]],  # crosses the drive 5 m ahead
            "trajectory": {"x": [1.2 * i for i in range(8)], "y": [0] * 8}}
OFF_ROAD_LINE = ("terra-rollout: sample 'off' ({name} line 1) failed: sample 'off': road: no frame's pose lies on a "
                 "lane of the road")


def test_a_batch_whose_every_road_is_bad_exits_2_with_its_line_before_torch_loads(inputs, tmp_path):
    """Every sample refused for its road (one off the drive, one a malformed road file): a line each, exit 2, the
    manifest records both, and torch is never imported."""
    (inputs / "bad_road.csv").write_text("x,q\n1,2\n")
    samples = inputs / f"{tmp_path.name}.jsonl"
    samples.write_text(json.dumps(OFF_ROAD) + "\n" + json.dumps({**OFF_ROAD, "sample_id": "file",
                                                                  "road": "bad_road.csv"}) + "\n")
    done = rollout_probed(inputs, samples, tmp_path / "out")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith(OFF_ROAD_LINE.format(name=samples.name)), done.stderr
    assert "the nearest lane is 5.0 m away, heading 90 degrees off the car's" in lines[0]
    assert lines[1].startswith(f"terra-rollout: sample 'file' ({samples.name} line 2) failed: bad_road.csv: unknown "
                               "column 'q'"), lines[1]
    assert done.stdout.splitlines()[-1] == "torch before the first line: False | torch at the end: False", done.stdout
    records = [json.loads(line) for line in (tmp_path / "out" / "manifest.jsonl").read_text().splitlines()]
    assert [(r["sample_id"], r["status"], r["stage"]) for r in records] == [("off", "failed", "input"),
                                                                           ("file", "failed", "input")]


def test_a_bad_road_s_line_comes_before_the_model_loads_and_the_good_sample_still_runs(inputs, tmp_path):
    samples = inputs / f"{tmp_path.name}.jsonl"
    good = {**OFF_ROAD, "sample_id": "good", "road": [[-20, 0], [200, 0]]}
    samples.write_text(json.dumps(OFF_ROAD) + "\n" + json.dumps(good) + "\n")
    done = rollout_probed(inputs, samples, tmp_path / "out")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[0].startswith(OFF_ROAD_LINE.format(name=samples.name)), done.stderr
    assert done.stdout.splitlines()[-1] == "torch before the first line: False | torch at the end: True", done.stdout
    manifest = (tmp_path / "out" / "manifest.jsonl").read_text()
    records = {r["sample_id"]: r for r in map(json.loads, manifest.splitlines())}
    assert records["off"]["status"] == "failed" and records["good"]["status"] == "ok", records
    assert "terra-rollout: 1 succeeded, 1 failed, 0 skipped" in done.stdout
