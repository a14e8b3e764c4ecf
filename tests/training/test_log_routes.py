"""Recorded drives with a road (terra/inputs/log_routes.py): ``terra-prepare-logs`` writes each frame's route from a
clip's ``road.json`` / ``road.csv`` / ``clipgt.zip`` (or, with ``routes=driven_path``, from the car's own path), NaN
rows for a clip without one; every bad road is one line naming the clip and the file. End to end at the demo's scale:
``terra-make-dataset format=driving_logs`` -> ``terra-prepare-logs`` (the demo tokenizer) -> shards whose routes are
the scene's -> ``terra-train`` growing 8 route slots on a checkpoint without them."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from PIL import Image

from terra.apps.runner import CONF_DIR
from terra.config.assets import register_resolvers
from terra.contract.routes import route_distances
from terra.core.errors import TerraInputError
from terra.models import LlamaActionForCausalLM
from terra.models.checkpoint import read_world_model_config
from terra.roads import Lane, Road, write_clipgt
from terra.sim import random_clip
from terra.sim.logs import CLIP_RECORD, LOGS_META_FILE, ROAD_FILE, write_driving_logs
from terra.training.data import load_training_data
from terra.training.model import new_config
from terra.training.prepare_logs import open_index, prepare_shards, prepare_spec
from terra.training.settings import train_spec
from terra.training.shards import read_index, read_shard
from tests.training.test_train import train, train_config
from tests.training.test_train_world_model import H, W, PoolTokenizer

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread
register_resolvers()  # conf/ uses ${terra_asset:...}, as the apps register it

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
CLIPS, FRAMES, SEED = 3, 8, 2  # the end-to-end logs: 3 clips of 8 frames
SPEED = 10.0  # m/s of the hand-made clips, which drive along +x from x = 0 (or round a circle)
RADIUS = 50.0


def shard_clips(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Each clip's codes and routes (None: its shard has none) in a shard folder."""
    index, found = read_index(folder), {}
    for entry in index.shards:
        codes, _, routes = read_shard(folder, index, entry)
        start = 0
        for clip in entry.clips:
            part = slice(start, start + clip.frames)
            found[clip.id] = (codes[part], None if routes is None else routes[part])
            start += clip.frames
    return found


# ------------------------------------------------------------------------------------------- end to end


def prepare_app(root: Path, logs: str, shards: str) -> subprocess.CompletedProcess:
    """``terra-prepare-logs`` run as a user runs it, in ``root``."""
    done = subprocess.run([sys.executable, "-m", "terra.apps.prepare_logs", f"logs={logs}", f"output_dir={shards}",
                           "device=cpu", "progress=false", "batch_size=8"], cwd=root, env=ENV, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture(scope="module")
def logs_shards(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("e2e")
    write_driving_logs(root / "logs", CLIPS, FRAMES, 36, 64, seed=SEED, progress=False)
    done = prepare_app(root, "logs", "shards")
    assert done.stderr == "", done.stderr
    routed = f"{CLIPS * FRAMES} frames written; {CLIPS * FRAMES} of them with a route"
    assert f"{CLIPS} clips used" in done.stdout and routed in done.stdout, done.stdout
    return root / "logs", root / "shards"


def test_synthetic_logs_carry_the_scenes_road_and_the_shards_its_routes(logs_shards):
    """road.json is the scene's road in the trajectory's frame; after the round trip through it, every frame's
    route in the shards is ``scene.route`` at the clip's pose within 5 cm, at the datasets' 16 points."""
    logs, shards = logs_shards
    found = shard_clips(shards)
    assert sorted(found) == [f"day-{SEED}-{i:05d}" for i in range(CLIPS)]
    worst = 0.0
    for i in range(CLIPS):
        truth = random_clip(np.random.default_rng([SEED, i]), FRAMES, 36, 64).routes
        routes = found[f"day-{SEED}-{i:05d}"][1]
        assert routes.shape == truth.shape == (FRAMES, 16, 3) and np.isfinite(routes).all()
        np.testing.assert_array_equal(routes[..., 2], np.broadcast_to(route_distances(16), (FRAMES, 16)))
        worst = max(worst, float(np.abs(routes[..., :2] - truth[..., :2]).max()))
        record = json.loads((logs / f"day-{SEED}-{i:05d}" / CLIP_RECORD).read_text())
        assert record["road"] == ROAD_FILE == "road.json"
    assert worst < 0.05, f"max error {worst * 100:.2f} cm"
    assert read_index(shards).routes == "road"


def test_a_rerun_redoes_the_clips_whose_road_moved_in_place(logs_shards, tmp_path):
    """Every clip's road.json moved 2 m in its file: the rerun makes every clip again, said in one line, and its
    shards hold the routes a first run of the moved logs writes, not the old ones."""
    logs, shards = logs_shards
    shutil.copytree(logs, tmp_path / "logs")
    shutil.copytree(shards, tmp_path / "shards")
    for path in sorted((tmp_path / "logs").glob(f"*/{ROAD_FILE}")):
        road = json.loads(path.read_text())
        for lane in road["road"]:
            lane["points"] = [[x, y + 2.0] for x, y in lane["points"]]
        path.write_text(json.dumps(road))
    again = prepare_app(tmp_path, "logs", "shards")
    assert again.stderr == f"terra-prepare-logs: {CLIPS} clips redone: the clip's files changed\n"
    assert f"{CLIPS} clips used" in again.stdout and "0 already done" in again.stdout, again.stdout
    prepare_app(tmp_path, "logs", "fresh")
    rerun, fresh, old = shard_clips(tmp_path / "shards"), shard_clips(tmp_path / "fresh"), shard_clips(shards)
    for clip, (codes, routes) in fresh.items():
        np.testing.assert_array_equal(rerun[clip][1], routes)
        np.testing.assert_array_equal(rerun[clip][0], codes)
        assert np.abs(routes[..., :2] - old[clip][1][..., :2]).max() > 1.0


def test_the_logs_train_a_warm_start_growing_8_route_slots(logs_shards, tmp_path, capsys):
    """A checkpoint without route slots, in the demo tokenizer's layout, warm-started with net.num_route_tokens=8
    on the shards: it trains on their routes, its loss finite, and exports 8 route slots."""
    _, shards = logs_shards
    cfg = train_config(shards, tmp_path / "unused")
    data = load_training_data(str(shards), 0)
    assert data.has_routes and data.patches == 144 and data.codebook_size == 1024
    torch.manual_seed(0)
    plain = LlamaActionForCausalLM(new_config(train_spec(cfg).net, data))
    assert plain.config.num_route_tokens == 0
    plain.save_pretrained(tmp_path / "plain")
    summary = train(train_config(shards, tmp_path / "run", f"init={tmp_path / 'plain'}", "net.num_route_tokens=8",
                                 "train.max_steps=3", "train.batch_size=4", "train.log_every=1"))
    out = capsys.readouterr().out
    assert "route slots: 8 a frame" in out and "holds no routes" not in out
    rows = [json.loads(line) for line in (tmp_path / "run" / "train_log.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if "loss" in row]
    assert summary["step"] == 3 and losses and all(math.isfinite(loss) for loss in losses)
    assert read_world_model_config(tmp_path / "run" / "model").num_route_tokens == 8


def test_a_rerun_writes_again_a_clip_folder_made_before_clips_had_a_road(tmp_path):
    out = write_driving_logs(tmp_path / "logs", 2, 2, 36, 64, seed=4, progress=False)
    old = out / "day-4-00001"
    record = json.loads((old / CLIP_RECORD).read_text())
    del record["road"]
    (old / CLIP_RECORD).write_text(json.dumps(record))
    (old / ROAD_FILE).unlink()
    (out / LOGS_META_FILE).unlink()  # as if interrupted
    kept = (out / "day-4-00000" / "frame_000.png").stat().st_mtime_ns
    write_driving_logs(out, 2, 2, 36, 64, seed=4, progress=False)
    assert (old / ROAD_FILE).is_file() and json.loads((old / CLIP_RECORD).read_text())["road"] == ROAD_FILE
    assert (out / "day-4-00000" / "frame_000.png").stat().st_mtime_ns == kept


# -------------------------------------------------------------------------------- hand-made clips, in-process


def write_clip(folder: Path, frames: int = 6, seconds: float = 12.0, circle: bool = False,
               road: tuple[str, bytes | str] | None = None) -> None:
    """A clip of ``frames`` PNG frames at 10 Hz and a CSV trajectory of ``seconds`` at 20 Hz: along +x at
    :data:`SPEED`, or left round a circle of :data:`RADIUS` about (0, RADIUS); ``road`` (name, content) beside."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(len(folder.name))
    for t in range(frames):
        Image.fromarray(rng.integers(0, 256, (H, W, 3), dtype=np.uint8)).save(folder / f"{t:03d}.png")
    t = np.arange(int(round(seconds * 20)) + 1) / 20
    s = SPEED * t
    if circle:
        x, y, yaw = RADIUS * np.sin(s / RADIUS), RADIUS * (1 - np.cos(s / RADIUS)), s / RADIUS
    else:
        x, y, yaw = s, np.zeros_like(s), np.zeros_like(s)
    rows = zip(*(v.tolist() for v in (t, x, y, yaw)))
    (folder / "trajectory.csv").write_text("t,x,y,yaw\n" + "".join(f"{a!r},{b!r},{c!r},{d!r}\n" for a, b, c, d in rows))
    if road is not None:
        name, content = road
        (folder / name).write_bytes(content if isinstance(content, bytes) else content.encode())


def run_prepare(logs: Path, out: Path, *overrides: str) -> tuple[list[str], object]:
    """prepare_shards as the app runs it, with the stand-in tokenizer; the lines it reported and its summary."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("prepare_driving_logs", overrides=[f"logs={logs}", f"output_dir={out}", "device=cpu",
                                                         "progress=false", "val_fraction=0", *overrides])
    spec = prepare_spec(cfg)
    index, _ = open_index(spec, PoolTokenizer())
    lines: list[str] = []
    summary = prepare_shards(spec, PoolTokenizer(), index, spec.clips, {f.name: "train" for f in spec.clips},
                             lines.append)
    return lines, summary


def clipgt_bytes(tmp_path: Path, lateral_m: float) -> bytes:
    """AlpaSim's map of one lane along +x, ``lateral_m`` left of the car's path."""
    road = Road([Lane(np.array([[-20.0, lateral_m], [400.0, lateral_m]]), "lane-0")])
    write_clipgt(road, tmp_path / "map.zip")
    return (tmp_path / "map.zip").read_bytes()


def test_each_clips_road_gives_its_frames_routes_and_a_clip_without_one_no_route_rows(tmp_path):
    logs = tmp_path / "logs"
    write_clip(logs / "a-csv", road=("road.csv", "x,y\n-10,0\n500,0\n"))
    write_clip(logs / "b-none")
    write_clip(logs / "c-clipgt", road=("clipgt.zip", clipgt_bytes(tmp_path, 1.5)))
    write_clip(logs / "d-json", circle=True, road=("road.json", json.dumps(
        {"road": [[RADIUS * math.sin(a), RADIUS * (1 - math.cos(a))] for a in np.linspace(-0.2, 3.0, 600)]})))
    lines, summary = run_prepare(logs, tmp_path / "shards")
    assert lines == [] and (summary.used, summary.routed_frames) == (4, 18)
    found = shard_clips(tmp_path / "shards")
    assert len(read_index(tmp_path / "shards").shards) == 1  # one shard mixes clips with and without routes
    ahead = route_distances(16)
    for name, lateral in (("a-csv", 0.0), ("c-clipgt", 1.5)):
        routes = found[name][1]
        assert routes.shape == (6, 16, 3)
        np.testing.assert_allclose(routes[..., 0], np.broadcast_to(ahead, (6, 16)), atol=1e-3)  # x forward
        np.testing.assert_allclose(routes[..., 1], lateral, atol=1e-3)  # y left
    assert np.isnan(found["b-none"][1]).all()  # the contract's "no route" rows
    phi = ahead / RADIUS  # a circle turning left: every frame sees the same route in its own frame
    circle = np.stack([RADIUS * np.sin(phi), RADIUS * (1 - np.cos(phi))], axis=-1)
    np.testing.assert_allclose(found["d-json"][1][..., :2], np.broadcast_to(circle, (6, 16, 2)), atol=0.05)


def test_routes_driven_path_are_the_cars_own_path_ahead_and_none_past_the_recording(tmp_path):
    """A circle recorded for 8.35 s at 10 m/s (83.5 m): frames 0-3 (at 0 to 3 m) see 80 m of it ahead, frames 4
    and 5 do not and have no route. A road file beside is not read."""
    logs = tmp_path / "logs"
    write_clip(logs / "circle", seconds=8.35, circle=True, road=("road.csv", "x,y\n0,1e5\n1,1e5\n"))
    lines, summary = run_prepare(logs, tmp_path / "shards", "routes=driven_path")
    assert lines == [] and summary.routed_frames == 4
    routes = shard_clips(tmp_path / "shards")["circle"][1]
    phi = route_distances(16) / RADIUS
    expected = np.stack([RADIUS * np.sin(phi), RADIUS * (1 - np.cos(phi))], axis=-1)
    np.testing.assert_allclose(routes[:4, :, :2], np.broadcast_to(expected, (4, 16, 2)), atol=0.01)
    assert np.isnan(routes[4:]).all()
    assert read_index(tmp_path / "shards").routes == "driven_path"
    write_clip(logs / "more")
    with pytest.raises(TerraInputError, match=r"holds shards prepared with routes=driven_path, not routes=road; "):
        run_prepare(logs, tmp_path / "shards")
    with pytest.raises(TerraInputError, match=r"^unknown routes 'map'; choose one of: road, driven_path$"):
        run_prepare(logs, tmp_path / "other", "routes=map")


def test_routes_are_counted_by_frame_not_by_clip(tmp_path):
    """Two clips recorded for 1 s: driven_path has 80 m ahead of no frame, so none is told a route, and the closing
    line says so rather than "2 with routes"."""
    logs = tmp_path / "logs"
    for name in ("a", "b"):
        write_clip(logs / name, frames=4, seconds=1.0)
    lines, summary = run_prepare(logs, tmp_path / "shards", "routes=driven_path")
    assert lines == [] and (summary.used, summary.frames, summary.routed_frames) == (2, 8, 0)
    assert "8 frames written; 0 of them with a route)" in summary.line(read_index(tmp_path / "shards"), tmp_path)


def test_every_bad_road_is_one_line_naming_the_clip_and_the_file(tmp_path):
    logs = tmp_path / "logs"
    write_clip(logs / "a-nan", road=("road.json", '{"road": [[0, 0], [10, "1"]]}'))
    write_clip(logs / "b-far", road=("road.csv", "x,y\n100000,0\n100100,0\n"))
    write_clip(logs / "c-two", road=("road.csv", "x,y\n0,0\n100,0\n"))
    (logs / "c-two" / "road.json").write_text('{"road": [[0, 0], [100, 0]]}')
    write_clip(logs / "d-zip", road=("clipgt.zip", b"not a zip"))
    write_clip(logs / "e-typo", road=("road.json", '{"raod": [[0, 0], [100, 0]]}'))
    write_clip(logs / "f-actions", road=("road.csv", "x,y\n0,0\n100,0\n"))
    (logs / "f-actions" / "trajectory.csv").unlink()
    np.save(logs / "f-actions" / "trajectory.npy", np.zeros((6, 6, 3), dtype=np.float32))
    write_clip(logs / "g-good", road=("road.csv", "x,y\n0,0\n100,0\n"))
    lines, summary = run_prepare(logs, tmp_path / "shards")
    assert (summary.used, summary.skipped, summary.routed_frames) == (1, 6, 6)
    expected = [
        "skipped clip a-nan: road.json: road[1][1]: must be a number (y, metres), got '1' (a string)",
        "skipped clip b-far: road.csv: no frame's pose lies on a lane of the road (within 4 m of a centreline, "
        "heading within 60 degrees of it): at frame 0 the nearest lane is 100000.0 m away, heading 0 degrees off "
        "the car's; give the road in the trajectory's world frame: [x, y] in metres, x first, each lane in its "
        "driving direction",
        "skipped clip c-two: holds 2 roads (road.json, road.csv); keep one of road.json, road.csv, clipgt/ and "
        "clipgt.zip",
        "skipped clip d-zip: clipgt.zip: is not a zip archive of parquet files",
        "skipped clip e-typo: road.json: unknown key 'raod' (did you mean 'road'?)",
        "skipped clip f-actions: road.csv: a road needs the car's world poses, but trajectory.npy gives per-frame "
        "actions",
    ]
    assert len(lines) == len(expected)
    for line, start in zip(lines, expected):
        assert line.startswith(start) and "\n" not in line, line


def test_a_road_inside_a_clips_trajectory_file_is_refused_not_dropped(tmp_path):
    logs = tmp_path / "logs"
    write_clip(logs / "a-inline")
    (logs / "a-inline" / "trajectory.csv").unlink()
    s = (SPEED * np.arange(241) / 20).tolist()
    trajectory = {"x": s, "y": [0.0] * len(s), "t": (np.arange(241) / 20).tolist()}
    (logs / "a-inline" / "trajectory.json").write_text(json.dumps({"trajectory": trajectory,
                                                                   "road": [[0, 0], [100, 0]]}))
    write_clip(logs / "b-good", road=("road.csv", "x,y\n0,0\n100,0\n"))
    lines, summary = run_prepare(logs, tmp_path / "shards")
    assert (summary.used, summary.skipped, summary.routed_frames) == (1, 1, 6)
    assert len(lines) == 1 and lines[0].startswith("skipped clip a-inline: ") and "carries 'road'" in lines[0] \
        and "road.json, road.csv or clipgt/" in lines[0], lines


def clipgt_with_rails(tmp_path: Path, layout) -> bytes:
    """AlpaSim's map of one lane along +x under the car, its rails stored as the Arrow list ``layout`` (parquet keeps
    list, large_list and fixed_size_list)."""
    import io
    import zipfile

    import pyarrow as pa
    import pyarrow.parquet as pq

    point = pa.struct([("x", pa.float64()), ("y", pa.float64()), ("z", pa.float64())])
    rails = [pa.array([[{"x": -20.0, "y": side, "z": 0.0}, {"x": 400.0, "y": side, "z": 0.0}]],
                      type=pa.list_(point)).cast(layout(point)) for side in (1.75, -1.75)]
    table = pa.table({"lane": pa.StructArray.from_arrays(rails, names=["left_rail", "right_rail"])})
    buffer, out = io.BytesIO(), io.BytesIO()
    pq.write_table(table, buffer)
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("lane.parquet", buffer.getvalue())
    return out.getvalue()


def test_a_road_with_a_byte_order_mark_or_rails_in_any_arrow_list_layout_gives_routes(tmp_path):
    import pyarrow as pa

    logs = tmp_path / "logs"
    write_clip(logs / "a-csv-bom", road=("road.csv", b"\xef\xbb\xbfx,y\n-10,0\n500,0\n"))
    write_clip(logs / "b-json-bom", road=("road.json", b"\xef\xbb\xbf" + b'{"road": [[-10, 0], [500, 0]]}'))
    layouts = {"list": pa.list_, "large_list": pa.large_list, "fixed_size_list": lambda t: pa.list_(t, 2)}
    for name, layout in layouts.items():
        write_clip(logs / f"c-{name}", road=("clipgt.zip", clipgt_with_rails(tmp_path, layout)))
    lines, summary = run_prepare(logs, tmp_path / "shards")
    assert lines == [] and (summary.used, summary.routed_frames) == (5, 30), lines
    for name, (_, routes) in shard_clips(tmp_path / "shards").items():
        np.testing.assert_allclose(routes[..., 1], 0.0, atol=1e-3, err_msg=name)  # the lane under the car
        np.testing.assert_allclose(routes[..., 0], np.broadcast_to(route_distances(16), (6, 16)), atol=1e-3)


def test_stacked_and_finely_split_short_lanes_are_read_quickly_and_never_lead_a_route_back(tmp_path):
    """Maps that took minutes a clip: 200 lanes of 1.2 m stacked where the car starts (a road that ends there) and a
    road split into 2,000 lanes of 5 cm (past a route's 256 lanes): one line each; split into lanes of 50 cm, every
    frame's route runs straight ahead."""
    import time

    logs = tmp_path / "logs"
    stacked = [[[0, 0], [1.2, 0]]] * 200
    write_clip(logs / "a-stacked", road=("road.json", json.dumps({"road": stacked})))
    for name, step in (("b-5cm", 0.05), ("c-50cm", 0.5)):
        split = [[[step * i, 0], [step * (i + 1), 0]] for i in range(int(200 / step))]
        write_clip(logs / name, road=("road.json", json.dumps({"road": split})))
    start = time.perf_counter()
    lines, summary = run_prepare(logs, tmp_path / "shards")
    assert time.perf_counter() - start < 30.0
    assert lines == [f"skipped clip {name}: road.json: road: the road ends within 40 m ahead of every frame that "
                     "lies on a lane, so no frame has a route; give the road ahead of the drive"
                     for name in ("a-stacked", "b-5cm")]
    routes = shard_clips(tmp_path / "shards")["c-50cm"][1]
    np.testing.assert_allclose(routes[..., 0], np.broadcast_to(route_distances(16), (6, 16)), atol=1e-3)
    np.testing.assert_allclose(routes[..., 1], 0.0, atol=1e-3)
