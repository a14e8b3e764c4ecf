"""terra-alpasim reads AlpaSim's HD map (terra/alpasim/maps.py), over loopback as AlpaSim's runtime calls it: the
synthetic scenes exported as clipgt zips tell the engine, at every frame of the closed loop's 16 scenarios, the
scene's own routes; a route model holds each frame's route in the slots before it; a Y-fork is followed along the
branch the rig takes; each hostile map is one status or one log line while another session goes on; the HD-map
condition frames draw the told route; a model without route slots does not read the map; a closed session gives
back its map's memory.

Most tests run the real service and session table on a stand-in engine that records what each step is told (a frame
is code 0 at once, its pixels black), so that 16 drives of 20 s take seconds; one runs the tiny route model.
"""

from __future__ import annotations

import gc
import io
import logging
import threading
import time
import zipfile
from concurrent.futures import Future
from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import psutil
import pytest
from PIL import Image

pytest.importorskip("carla_driver_interface")
pytest.importorskip("pyarrow")
import grpc  # noqa: E402
from carla_driver_interface.protocol import Trajectory  # noqa: E402

from terra.alpasim import video_model_pb2 as pb  # noqa: E402
from terra.alpasim.client import ANCHOR_US, pose_at  # noqa: E402
from terra.alpasim.poses import FRAME_INTERVAL_US  # noqa: E402
from terra.alpasim.service import WorldModelServicer, bind, start  # noqa: E402
from terra.alpasim.sessions import SessionTable  # noqa: E402
from terra.alpasim.settings import AlpasimSettings  # noqa: E402
from terra.alpasim.maps import BOUNDARY_COLOR, ROUTE_COLOR, TopView  # noqa: E402
from terra.closedloop.scenarios import synthetic_scenarios  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.contract.routes import slot_routes  # noqa: E402
from terra.roads import Lane, Road, write_clipgt  # noqa: E402
from terra.sim.scene import scene_road  # noqa: E402
from tests.alpasim.fake_runtime import FakeRuntime  # noqa: E402
from tests.roads.conftest import TOLERANCE_M, drive_poses  # noqa: E402
from tests.roads.test_hostile_maps import archive, lane_row, parquet, points  # noqa: E402

ROUTES = 8  # the demo model's route slots, for the stand-in engine
SETTINGS = AlpasimSettings(port=0, max_sessions=20, max_frames=250, image_format="png")
CALL_S = 60.0  # every call's gRPC deadline: nothing may hang
QUICK_S = 10.0  # a refusal of a hostile map, on a loaded 2-core machine


class RecordingEngine:
    """Stands for the session engine: each rollout records the routes it opened with and each step's route."""

    def __init__(self, cells: int) -> None:
        self.cells = cells

    @staticmethod
    def _done(value) -> Future:
        future: Future = Future()
        future.set_result(value)
        return future

    def open(self, codes, actions, max_frames, seed=None, overlap=0, routes=None):
        return SimpleNamespace(context_routes=routes, routes=[])

    def steps(self, rollout, actions, sampling, routes=None) -> Future:
        rollout.routes.extend(routes or [None] * len(actions))
        return self._done([SimpleNamespace(codes=np.zeros(self.cells, np.int64)) for _ in actions])

    def close_rollout(self, rollout) -> Future:
        return self._done(None)

    def close(self) -> None:
        pass


def stand_in_pipeline(route_tokens: int, size: tuple[int, int] = (64, 64), grid: tuple[int, int] = (8, 8)):
    """What the session table asks of a pipeline: a model of ``route_tokens`` route slots; black frames."""
    backend = SimpleNamespace(layout=SimpleNamespace(route_tokens=route_tokens), as_run=lambda sampling: sampling,
                              num_queued=0, cancel=lambda states: None)
    return SimpleNamespace(image_size=size, backend=backend, tokenizer=SimpleNamespace(grid_shape=grid),
                           encode=lambda images: np.zeros((len(images), *grid), np.int64),
                           decode=lambda codes: np.zeros((len(codes), *size, 3), np.uint8))


@contextmanager
def serving(table: SessionTable):
    server, port = bind(table.settings)
    start(server, WorldModelServicer(table, "test"))
    try:
        yield FakeRuntime(f"127.0.0.1:{port}", CALL_S)
    finally:
        server.stop(1).wait()
        table.shutdown()


def recording_table(route_tokens: int) -> SessionTable:
    table = SessionTable(stand_in_pipeline(route_tokens), SETTINGS, SamplingConfig())
    table.engine.close()
    table.engine = RecordingEngine(64)
    return table


@pytest.fixture(scope="module")
def recorded():
    """The service on the recording engine of a model with :data:`ROUTES` route slots; its table and a runtime."""
    table = recording_table(ROUTES)
    with serving(table) as runtime:
        yield table, runtime


@pytest.fixture(scope="module")
def scenarios():
    """The closed loop's 16 synthetic scenarios (terra-drive study=gpu: 16 scenarios, scenario_seed 0)."""
    return synthetic_scenarios(16, 0, (32, 32))


def clipgt(road: Road, clip_id: str | None = "clip") -> pb.StaticWorldMap:
    buffer = io.BytesIO()
    write_clipgt(road, buffer, clip_id)
    return pb.StaticWorldMap(hdmap_parquets=buffer.getvalue())


def chunked(poses: np.ndarray, sizes=(5, 8)) -> list[Trajectory]:
    """AlpaSim's chunks of world ``poses`` (``poses[0]``: the initial frame's, never sent): ``sizes``, the last one
    repeated until every pose is sent."""
    chunks, first = [], 1
    while first < len(poses):
        size = sizes[min(len(chunks), len(sizes) - 1)]
        frames = range(first, min(first + size, len(poses)))
        chunks.append(Trajectory(poses=[pose_at(ANCHOR_US + k * FRAME_INTERVAL_US, *poses[k]) for k in frames]))
        first += size
    return chunks


def drive(runtime, table, poses, sizes=(5, 8), **fields):
    """A session along ``poses``: its chunks' answers and its rollout on the engine."""
    session = runtime.start(**fields)
    answers = [runtime.chunk(session, chunk) for chunk in chunked(poses, sizes)]
    rollout = table.get(session.session_id).rollout
    runtime.close(session)
    return answers, rollout


def told(rollout) -> np.ndarray:
    return np.stack([np.full((ROUTES, 3), np.nan) if r is None else r for r in rollout.routes])


def test_the_engine_is_told_the_scenes_routes_at_every_frame_of_16_scenarios(recorded, scenarios):
    table, runtime = recorded
    worst = 0.0
    for scenario in scenarios:
        poses = drive_poses(scenario)  # 20 s at 10 fps
        answers, rollout = drive(runtime, table, poses, static_world_map=clipgt(scene_road(scenario.scene)))
        assert sum(len(a.camera_outputs[0].rgb_frames) for a in answers) == len(poses) - 1
        assert np.isnan(rollout.context_routes).all()  # the initial frame's: no route slot holds it
        got, want = told(rollout), scenario.scene.route(poses[1:], ROUTES)
        assert got.shape == want.shape == (len(poses) - 1, ROUTES, 3) and np.isfinite(got).all(), scenario.id
        np.testing.assert_array_equal(got[..., 2], want[..., 2])
        worst = max(worst, float(np.abs(got[..., :2] - want[..., :2]).max()))
    assert worst < TOLERANCE_M, f"{worst * 100:.2f} cm"


def test_a_route_model_holds_each_frames_route_in_the_slots_before_it(scenarios, single_thread):
    """The tiny route model on the Transformers backend: frame t's route slots hold the route of frame t + 1, the
    contract's rule (``slot_routes``), for the frames of two chunks."""
    from terra.generation.backends import model_backend
    from terra.models.presets import TINY_TOKENIZER
    from terra.pipeline import WorldModelPipeline
    from terra.tokenizer.lfq import LFQTokenizer
    from tests.conftest import TINY_ROUTES, tiny_route_model

    pipeline = WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_route_model(), max_batch_size=2))
    table = SessionTable(pipeline, SETTINGS, SamplingConfig(temperature=1.0, top_k=50))
    scenario = scenarios[3]
    poses = drive_poses(scenario)[:14]
    with serving(table) as runtime:
        session = runtime.start(seed=3, static_world_map=clipgt(scene_road(scenario.scene)))
        for chunk in chunked(poses):
            runtime.chunk(session, chunk)
        state = table.get(session.session_id).rollout.state
        slots = state.route_slots[:13].copy()
        runtime.close(session)
    want = slot_routes(scenario.scene.route(poses, TINY_ROUTES), 13)
    np.testing.assert_allclose(slots, want, atol=TOLERANCE_M)


FORK_X, RADIUS = 50.0, 100.0  # a trunk along +x to the fork, then straight on or a left bend of this radius


def fork_point(s: float, left: bool) -> tuple[float, float, float]:
    """The pose ``s`` metres from the trunk's start along the straight or the left branch."""
    if s <= FORK_X or not left:
        return s, 0.0, 0.0
    theta = (s - FORK_X) / RADIUS
    return FORK_X + RADIUS * np.sin(theta), RADIUS * (1.0 - np.cos(theta)), theta


def y_fork() -> Road:
    arc = [fork_point(FORK_X + s, True)[:2] for s in np.linspace(0.0, 120.0, 61)]
    return Road([Lane(np.stack([np.linspace(0.0, FORK_X, 11), np.zeros(11)], -1), "trunk"),
                 Lane(np.stack([np.linspace(FORK_X, 250.0, 41), np.zeros(41)], -1), "straight"),
                 Lane(np.array(arc), "left")], source="y fork")


def to_world(route: np.ndarray, pose: np.ndarray) -> np.ndarray:
    forward, left = route[:, 0].astype(np.float64), route[:, 1].astype(np.float64)
    c, s = np.cos(pose[2]), np.sin(pose[2])
    return np.stack([pose[0] + c * forward - s * left, pose[1] + s * forward + c * left], axis=-1)


@pytest.mark.parametrize("left", [True, False], ids=["left", "straight"])
def test_a_y_fork_is_followed_along_the_branch_the_rig_takes(recorded, left):
    """Chunks of 30 frames (3 s): the frames whose chunk shows the rig 12 m or more into a branch (or past the
    fork), are told that branch; the others, knowing no more than the trunk, the straightest (the straight one)."""
    table, runtime = recorded
    s = 20.0 + 8.0 * np.arange(61) / 10  # 8 m/s from 30 m before the fork to 18 m past it
    poses = np.array([fork_point(v, left) for v in s])
    _, rollout = drive(runtime, table, poses, sizes=(30,), static_world_map=clipgt(y_fork()))
    routes = told(rollout)
    branch = np.array([fork_point(FORK_X + v, True)[:2] for v in np.linspace(0.0, 150.0, 3001)])
    for i, (route, pose) in enumerate(zip(routes, poses[1:]), start=1):
        world = to_world(route, pose)
        beyond = world[world[:, 0] > FORK_X + 1.0]
        chunk_end = min(30 * ((i - 1) // 30 + 1), len(poses) - 1)
        knows_left = left and s[chunk_end] - FORK_X >= 12.0
        on_left = np.hypot(*(beyond[:, None] - branch[None]).transpose(2, 0, 1)).min(axis=1)
        if knows_left:
            assert on_left.max() < TOLERANCE_M, (i, on_left.max())
        else:
            assert np.abs(beyond[:, 1]).max() < TOLERANCE_M, (i, beyond)


def distant_road(offset_m: float) -> Road:
    return Road([Lane(np.array([[offset_m, 0.0], [offset_m + 100.0, 0.0]]), "far")])


def zip_bomb(mib: int = 528) -> bytes:
    """A lane table of ``mib`` MiB of zeros, zipped to a few MiB."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as out:
        with out.open("clip.lane.parquet", "w", force_zip64=True) as entry:
            zeros = bytes(8 * 2**20)
            for _ in range(mib // 8):
                entry.write(zeros)
    return buffer.getvalue()


def many_lanes(count: int = 100_000) -> bytes:
    import pyarrow as pa

    rail = pa.ListArray.from_arrays(pa.array(np.arange(0, 2 * count + 1, 2), pa.int32()), pa.StructArray.from_arrays(
        [pa.array(np.tile([0.0, 10.0], count)), pa.array(np.repeat(np.arange(count) * 4.0, 2)),
         pa.array(np.zeros(2 * count))], names=["x", "y", "z"]))
    return archive({"c.lane.parquet": parquet(pa.table({"lane": pa.StructArray.from_arrays(
        [rail, rail], names=["left_rail", "right_rail"])}))})


def large_map(lanes: int = 19_000, points: int = 100, notes_mib: int = 16) -> bytes:
    """A legal map near the limits, zipped to under a MiB: ``lanes`` parallel lanes of ``points`` points 1 m apart
    (19,000 x 100: nearly 2,000,000 points, a road of about 100 MiB of arrays) in a lane table of about 110 MiB
    unpacked (its ``notes`` column unread)."""
    import pyarrow as pa

    offsets = pa.array(np.arange(0, lanes * points + 1, points, dtype=np.int32))
    x = pa.array(np.tile(np.arange(points, dtype=np.float64), lanes))

    def rail(y: float) -> pa.Array:
        ys = pa.array(np.repeat(np.arange(lanes) * 4.0 + y, points))
        return pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays([x, ys, pa.array(np.zeros(len(x)))],
                                                                            names=["x", "y", "z"]))

    table = pa.table({"key": pa.StructArray.from_arrays([pa.array([f"L{i}" for i in range(lanes)])], names=["map_id"]),
                      "lane": pa.StructArray.from_arrays([rail(1.75), rail(-1.75)], names=["left_rail", "right_rail"]),
                      "notes": pa.array([bytes(notes_mib * 2**20 // lanes)] * lanes, pa.binary())})
    return archive({"clip.lane.parquet": parquet(table, compression="none", use_dictionary=False)})


HOSTILE = {
    "zip bomb": (zip_bomb, ["unpack to 528 MiB, more than 128 MiB"]),
    "200 MiB of tables": (lambda: zip_bomb(200), ["unpack to 200 MiB, more than 128 MiB"]),  # held whole to read
    "not a zip": (lambda: b"PK\x03\x04 not really a zip", ["not a zip archive"]),
    "wrong types": (lambda: archive({"lane.parquet": parquet([{"lane": {"left_rail": [{"x": "1", "y": "2"}] * 2,
                                                                       "right_rail": [{"x": "1", "y": "2"}] * 2}}])}),
                    ["lane.parquet: lane.left_rail.x", "must be numbers, got string"]),
    "NaN point": (lambda: archive({"lane.parquet": parquet([lane_row("L7", points([0, 10], [1, 1]),
                                                                     points([0, 10], [np.nan, -1]))])}),
                  ["lane.right_rail", "'L7'", "not finite"]),
    "lane of one point": (lambda: archive({"lane.parquet": parquet([lane_row("L1", points([0], [1]),
                                                                             points([0], [-1]))])}),
                          ["lane 'L1'", "left_rail has 1 point(s)"]),
    "100,000 lanes": (many_lanes, ["c.lane.parquet", "100000 lane rows, more than 20000"]),
    "a road 1e9 m away": (lambda: archive({"lane.parquet": parquet([lane_row(
        "far", points([1e9, 1e9 + 50], [1, 1]), points([1e9, 1e9 + 50], [-1, -1]))])}),
                          ["lane 'far'", "beyond 1e+06 m"]),
}


def test_each_hostile_map_is_one_status_while_another_session_goes_on(recorded, scenarios, caplog):
    table, runtime = recorded
    caplog.set_level(logging.INFO, logger="terra.alpasim")
    scenario = scenarios[0]
    poses = drive_poses(scenario)
    other = runtime.start(static_world_map=clipgt(scene_road(scenario.scene)))
    done, stop = [], threading.Event()

    def keep_driving() -> None:  # one chunk after another until the hostile maps are through
        for chunk in chunked(poses, (1,)):
            done.append(len(runtime.chunk(other, chunk).camera_outputs[0].rgb_frames))
            if stop.is_set() and len(done) >= 5:
                return

    driver = threading.Thread(target=keep_driving)
    driver.start()
    for name, (make, words) in HOSTILE.items():
        data = make()
        before = len(caplog.records)
        begin = time.perf_counter()
        with pytest.raises(grpc.RpcError) as err:
            runtime.start(static_world_map=pb.StaticWorldMap(hdmap_parquets=data))
        seconds = time.perf_counter() - begin
        code, details = err.value.code(), err.value.details()
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (name, code, details)
        assert details.startswith("static_world_map.hdmap_parquets: ") and all(w in details for w in words), details
        assert "\n" not in details and seconds < QUICK_S, (name, seconds)
        refusals = [r for r in caplog.records[before:] if "start_session refused" in r.getMessage()]
        assert len(refusals) == 1, name
    stop.set()
    driver.join(CALL_S)
    assert not driver.is_alive() and len(done) >= 5 and set(done) == {1}
    rollout = table.get(other.session_id).rollout
    assert np.isfinite(told(rollout)).all()  # the other session was told its routes throughout
    runtime.close(other)
    assert not table.sessions


@pytest.mark.parametrize("world_map, line", [
    (clipgt(distant_road(1e5)), "no lane of the HD map within 4 m"),
    (pb.StaticWorldMap(hdmap_parquets=b"PK\x05\x06" + bytes(18)), "holds no lanes"),  # an empty zip
    (pb.StaticWorldMap(hdmap_parquets=b""), "no HD map (static_world_map.hdmap_parquets is empty)"),
    (pb.StaticWorldMap(hdmap_parquets=archive({"clip.crosswalk.parquet": b"not read"})), "holds no lanes"),
], ids=["road_1e5_m_away", "empty_map", "no_map", "no_lane_table"])
def test_no_lane_near_the_car_runs_without_a_route_and_says_so_once(recorded, scenarios, caplog, world_map, line):
    table, runtime = recorded
    caplog.set_level(logging.INFO, logger="terra.alpasim")
    answers, rollout = drive(runtime, table, drive_poses(scenarios[1])[:22], static_world_map=world_map)
    assert [len(a.camera_outputs[0].rgb_frames) for a in answers] == [5, 8, 8]
    assert len(rollout.routes) == 21 and np.isnan(told(rollout)).all()
    assert len([r for r in caplog.records if line in r.getMessage()]) == 1


def route_pixels(route: np.ndarray, view: TopView) -> list[tuple[int, int]]:
    return [(round(v), round(u)) for u, v in view._pixels(route[:, :2].astype(np.float64))]


def test_hdmap_frames_draw_each_frames_told_route(recorded, scenarios):
    table, runtime = recorded
    scenario = scenarios[2]
    poses = drive_poses(scenario)[:14]
    debug = pb.DebugOptions(return_hdmap_frames=True)
    answers, rollout = drive(runtime, table, poses, static_world_map=clipgt(scene_road(scenario.scene)),
                             debug_options=debug, resolution=(128, 128))
    frames = [np.asarray(Image.open(io.BytesIO(image.data))) for a in answers
              for image in a.camera_outputs[0].hdmap_condition_frames]
    assert len(frames) == sum(len(a.camera_outputs[0].rgb_frames) for a in answers) == 13
    view = TopView(None, (128, 128))
    for frame, route in zip(frames, told(rollout)):
        assert frame.shape == (128, 128, 3)
        for row, col in route_pixels(route, view):
            if 0 <= row < 128 and 0 <= col < 128:
                assert tuple(frame[row, col]) == ROUTE_COLOR, (row, col)
        assert (frame == BOUNDARY_COLOR).all(axis=-1).sum() > 50  # the road's edges
    skipped, rollout = drive(runtime, table, poses, static_world_map=clipgt(scene_road(scenario.scene)),
                             debug_options=pb.DebugOptions(return_hdmap_frames=True, skip_video_generation=True),
                             resolution=(128, 128))
    assert [len(a.camera_outputs[0].rgb_frames) for a in skipped] == [0, 0] and not rollout.routes  # no model run
    drawn = [image.data for a in skipped for image in a.camera_outputs[0].hdmap_condition_frames]
    assert drawn == [image.data for a in answers for image in a.camera_outputs[0].hdmap_condition_frames]


@pytest.mark.parametrize("data, line", [
    (b"not a map", "no route slots, so the HD map (9 bytes) is not read"),
    (b"", "no HD map (static_world_map.hdmap_parquets is empty)"),
], ids=["map", "no_map"])
def test_a_model_without_route_slots_does_not_read_the_map(caplog, data, line):
    caplog.set_level(logging.INFO, logger="terra.alpasim")
    table = recording_table(0)
    with serving(table) as runtime:
        poses = np.array([[float(k), 0.0, 0.0] for k in range(14)])
        _, rollout = drive(runtime, table, poses, static_world_map=pb.StaticWorldMap(hdmap_parquets=data))
    assert rollout.context_routes is None and rollout.routes == [None] * 13
    assert len([r for r in caplog.records if line in r.getMessage()]) == 1



def test_maps_of_stacked_or_finely_split_short_lanes_answer_each_chunk_within_a_second(recorded, scenarios):
    """Maps that stalled a session for minutes (terra/roads/follow.py's branch search): 256 lanes of 1.2 m stacked
    where the rig starts, and the rig's path split into lanes of 5 cm; each chunk is answered within a second."""
    table, runtime = recorded
    poses = drive_poses(scenarios[1])[:22]
    start, heading = poses[0, :2], np.array([np.cos(poses[0, 2]), np.sin(poses[0, 2])])
    stacked = Road([Lane(np.stack([start, start + 1.2 * heading]), f"s{i}") for i in range(256)])
    along = np.concatenate([[0.0], np.cumsum(np.hypot(*np.diff(poses[:, :2], axis=0).T))])
    s = np.arange(0.0, along[-1], 0.05)
    path = np.stack([np.interp(s, along, poses[:, 0]), np.interp(s, along, poses[:, 1])], axis=-1)
    split = Road([Lane(path[i:i + 2], f"p{i}") for i in range(len(path) - 1)])
    for road in (stacked, split):
        session = runtime.start(static_world_map=clipgt(road))
        for chunk in chunked(poses):
            begin = time.perf_counter()
            runtime.chunk(session, chunk)
            assert time.perf_counter() - begin < 1.0
        runtime.close(session)


OPEN_MIB = 256  # what a session of the large map may hold: its road (about 120 MiB), not its reading's peak (590)
CLOSED_MIB = 48  # what it may leave held once closed: far less than its road
MEMORY_DEADLINE_S = 10.0


def mib_held_over(process, baseline: int, bound_mib: float) -> float:
    """The MiB ``process`` holds over ``baseline`` bytes, once under ``bound_mib`` or at the deadline."""
    deadline = time.monotonic() + MEMORY_DEADLINE_S
    while True:
        gc.collect()
        held = (process.memory_info().rss - baseline) / 2**20
        if held < bound_mib or time.monotonic() > deadline:
            return held


def test_a_session_gives_back_the_memory_of_its_large_map_when_it_closes():
    """A legal map near the limits (about 110 MiB of tables, a road of about 120 MiB of arrays) read and driven: the
    server holds its road, not its reading's peak; once the session closes, it is back within :data:`CLOSED_MIB` of
    what it held before; a second such session holds no more."""
    server = psutil.Process()
    data = large_map()
    assert len(data) < 2**20 and sum(i.file_size for i in zipfile.ZipFile(io.BytesIO(data)).infolist()) > 100 * 2**20
    poses = np.array([[float(k), 0.0, 0.0] for k in range(22)])  # along the first lane
    table = recording_table(ROUTES)
    with serving(table) as runtime:
        drive(runtime, table, poses, static_world_map=clipgt(distant_road(0.0)))  # a small map: what any run holds
        before = server.memory_info().rss
        for _ in range(2):
            session = runtime.start(static_world_map=pb.StaticWorldMap(hdmap_parquets=data))
            for chunk in chunked(poses):
                runtime.chunk(session, chunk)
            assert np.isfinite(told(table.get(session.session_id).rollout)).all()  # the map was read and followed
            held = mib_held_over(server, before, OPEN_MIB)
            assert held < OPEN_MIB, f"{held:.0f} MiB held by a session of the large map"
            runtime.close(session)
            held = mib_held_over(server, before, CLOSED_MIB)
            assert held < CLOSED_MIB, f"{held:.0f} MiB still held after the session closed"
    assert not table.sessions

