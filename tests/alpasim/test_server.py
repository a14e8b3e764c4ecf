"""terra-alpasim's WorldModelService on loopback, driven by a fake AlpaSim runtime (tests/alpasim/fake_runtime.py)
in AlpaSim's call order: the frames come one per pose and decode; they are a direct session's frames (the same
context, actions and seed), whose actions are the whole path's, straight or curving; a seed gives the same frames
in two sessions at once; every bad request is a gRPC status with one line while the other sessions go on."""

from __future__ import annotations

import io
import logging
import threading
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("carla_driver_interface")
from carla_driver_interface.protocol import Trajectory  # noqa: E402

from terra.alpasim import video_model_pb2 as pb  # noqa: E402
from terra.alpasim.fields import pose_arrays, timestamps  # noqa: E402
from terra.alpasim.poses import planar_poses  # noqa: E402
from terra.alpasim.client import camera_spec, curve, pose_at, straight, trajectory  # noqa: E402
from terra.alpasim.service import WorldModelServicer, bind, start  # noqa: E402
from terra.alpasim.sessions import SessionTable, SessionUnusable  # noqa: E402
from terra.alpasim.settings import AlpasimSettings  # noqa: E402
from terra.config.sampling import SamplingConfig  # noqa: E402
from terra.generation.backends import model_backend  # noqa: E402
from terra.inputs.actions import actions_from_value  # noqa: E402
from terra.models.presets import TINY_TOKENIZER  # noqa: E402
from terra.pipeline import WorldModelPipeline  # noqa: E402
from terra.tokenizer.images import load_images  # noqa: E402
from terra.tokenizer.lfq import LFQTokenizer  # noqa: E402
from tests.alpasim.fake_runtime import CHUNKS, FakeRuntime, jpeg  # noqa: E402
from tests.conftest import tiny_model  # noqa: E402

SAMPLING = SamplingConfig(temperature=1.0, top_k=50)
SETTINGS = AlpasimSettings(port=0, max_sessions=4, max_frames=40, image_format="png")


@pytest.fixture(scope="module")
def served(single_thread):
    """The service on a tiny world model (Transformers), on a free loopback port; its table, and a runtime."""
    pipeline = WorldModelPipeline(LFQTokenizer(TINY_TOKENIZER), model_backend(tiny_model(), max_batch_size=4))
    server, port = bind(SETTINGS)
    table = SessionTable(pipeline, SETTINGS, SAMPLING)
    start(server, WorldModelServicer(table, "tiny"))
    yield table, FakeRuntime(f"127.0.0.1:{port}")
    server.stop(1).wait()
    table.shutdown()


def pixels(image: pb.Image) -> np.ndarray:
    assert image.format == pb.PNG
    decoded = Image.open(io.BytesIO(image.data))
    assert decoded.format == "PNG" and decoded.mode == "RGB"
    return np.asarray(decoded)


def direct(table: SessionTable, frame: bytes, actions: np.ndarray, seed: int) -> np.ndarray:
    """The frames' codes of a session opened on the same engine from ``frame`` and stepped with ``actions``."""
    pipeline = table.pipeline
    codes = pipeline.encode(load_images([Image.open(io.BytesIO(frame))], pipeline.image_size))
    rollout = table.engine.open(codes, np.zeros((0, 6, 3), np.float32), len(actions), seed)
    steps = [table.engine.step(rollout, action, table.sampling) for action in actions]
    generated = np.stack([step.result().codes for step in steps])
    table.engine.close_rollout(rollout).result()
    return np.concatenate([codes.reshape(1, -1), generated])


@pytest.mark.parametrize("path", [straight(), curve(rate=0.3)], ids=["straight", "curve"])
def test_a_rollout_as_alpasim_runs_it_gets_a_direct_sessions_frames(served, path):
    table, runtime = served
    session = runtime.start(seed=11)
    chunks = [runtime.chunk(session, trajectory(path, frames)) for frames in (range(1, 6), range(6, 14))]
    rollout = table.get(session.session_id).rollout
    actions, codes = rollout.state.actions[:13].copy(), rollout.codes()
    runtime.close(session)
    frames = [[pixels(image) for image in chunk.camera_outputs[0].rgb_frames] for chunk in chunks]
    assert [len(f) for f in frames] == list(CHUNKS) and frames[0][0].shape == (64, 64, 3)
    assert [c.camera_outputs[0].camera_logical_id for c in chunks] == ["camera_front_wide_120fov"] * 2
    t = np.arange(13 + 31) / 10  # the whole path known from the initial frame on, as terra-generate reads it
    x, y, yaw = np.array([path(s) for s in t]).T
    whole = actions_from_value({"trajectory": {"x": x, "y": y, "yaw": yaw, "t": t}}, "path", 13)
    np.testing.assert_allclose(actions, whole, atol=5e-3)  # tests/alpasim/test_poses.py: the chords' bound
    want = direct(table, jpeg(), actions, seed=11)
    np.testing.assert_array_equal(codes, want)
    grid = table.pipeline.tokenizer.grid_shape
    for chunk, span in zip(frames, (slice(1, 6), slice(6, 14))):  # decoded in the server's batches
        np.testing.assert_array_equal(np.stack(chunk), table.pipeline.decode(want[span].reshape(-1, *grid)))


def test_a_seed_gives_the_same_frames_in_two_sessions_at_once(served):
    table, runtime = served
    got: dict[str, list] = {}

    def run(name: str, seed: int) -> None:
        got[name] = [image.data for chunk in runtime.drive(curve(), seed) for image in chunk]

    threads = [threading.Thread(target=run, args=args) for args in (("a", 5), ("b", 5), ("c", 6), ("d", 0))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert all(len(frames) == 13 for frames in got.values()), {k: len(v) for k, v in got.items()}
    assert got["a"] == got["b"]
    assert got["c"] != got["a"] and got["d"] != got["a"]  # another seed; the server's choice
    assert not table.sessions  # every rollout closed its session


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_bad_requests_get_one_line_statuses_and_the_others_go_on(served):
    table, runtime = served
    path = straight()
    session = runtime.start(seed=3)
    runtime.chunk(session, trajectory(path, range(1, 6)))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    nan = trajectory(path, range(6, 8))
    nan.poses[1].pose.vec.x = float("nan")
    zero = trajectory(path, range(6, 8))
    zero.poses[0].pose.quat.w = 0.0
    fps30 = trajectory(path, range(6, 8))
    fps30.poses[1].timestamp_us = fps30.poses[0].timestamp_us + 33_333
    unread = trajectory(path, range(6, 1006))  # too many poses: refused by their count before any is read
    unread.poses[0].timestamp_us = 2**63 - 1
    cases = {
        "two cameras": (lambda: runtime.start(cameras=2), invalid, ["one camera", "has 2 (camera_specs)"]),
        "no camera": (lambda: runtime.start(cameras=0), invalid, ["has 0"]),
        "not an image": (lambda: runtime.start(frame=b"not an image"), invalid, ["cannot be read as an image"]),
        "2:1 camera": (lambda: runtime.start(resolution=(640, 1280)), invalid, ["aspect ratio 2.000", "64x64"]),
        "only skipping video": (lambda: runtime.start(debug_options=pb.DebugOptions(skip_video_generation=True)),
                                invalid, ["skip_video_generation without return_hdmap_frames"]),
        "unknown session": (lambda: runtime.chunk(pb.SessionId(session_id="nope"), trajectory(path, [1])),
                            grpc.StatusCode.NOT_FOUND, ["no session 'nope'"]),
        "NaN pose": (lambda: runtime.chunk(session, nan), invalid, ["pose 1 holds NaN"]),
        "zero quaternion": (lambda: runtime.chunk(session, zero), invalid, ["pose 0", "unit quaternion"]),
        "30 fps": (lambda: runtime.chunk(session, fps30), invalid, ["33333 us apart", "fps=10"]),
        "a gap": (lambda: runtime.chunk(session, trajectory(path, range(8, 10))), invalid, ["the next is at"]),
        "over max_frames": (lambda: runtime.chunk(session, trajectory(path, range(6, 42))),
                            grpc.StatusCode.OUT_OF_RANGE, ["rendered 5 frames and may render 35 more",
                                                           "alpasim.max_frames=40"]),
        "1000 poses": (lambda: runtime.chunk(session, unread), grpc.StatusCode.OUT_OF_RANGE,
                       ["may render 35 more", "the chunk asks for 1000"]),
    }
    for name, (call, code, words) in cases.items():
        got_code, details = status_of(call)
        assert got_code == code and all(w in details for w in words) and "\n" not in details, (name, details)
    answer = runtime.chunk(session, trajectory(path, range(6, 8)))  # the session goes on where it was
    assert len(answer.camera_outputs[0].rgb_frames) == 2
    runtime.close(session)
    runtime.close(session)  # closing twice is harmless
    code, details = status_of(lambda: runtime.chunk(session, trajectory(path, [8])))
    assert code == grpc.StatusCode.NOT_FOUND and "closed" in details
    assert not table.sessions


def test_initial_frames_are_png_or_jpeg_and_never_reach_ghostscript(served, tmp_path, monkeypatch):
    """An EPS initial frame would make Pillow run ``gs`` on the client's PostScript (here a fake one that leaves a
    mark); a GIF is refused as well, and the server goes on."""
    from PIL import EpsImagePlugin

    mark, gs = tmp_path / "ghostscript-ran", tmp_path / "gs"
    gs.write_text(f"#!/bin/sh\ntouch {mark}\nexit 1\n")
    gs.chmod(0o755)
    monkeypatch.setattr(EpsImagePlugin, "gs_binary", str(gs))
    table, runtime = served
    gif = io.BytesIO()
    Image.new("RGB", (160, 96)).save(gif, format="GIF")
    for frame in (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 16 16\nshowpage\n", gif.getvalue()):
        code, details = status_of(lambda frame=frame: runtime.start(frame=frame))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "PNG or JPEG" in details and "\n" not in details
    assert not mark.exists() and not table.sessions
    runtime.close(runtime.start())


def test_sessions_beyond_the_limit_are_refused_until_one_closes(served):
    table, runtime = served
    sessions = [runtime.start() for _ in range(SETTINGS.max_sessions)]
    code, details = status_of(runtime.start)
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "alpasim.max_sessions=4" in details
    runtime.close(sessions.pop())
    sessions.append(runtime.start())
    for session in sessions:
        runtime.close(session)


def test_messages_up_to_64_mib_and_the_version(served):
    _, runtime = served
    huge_map = pb.StaticWorldMap(hdmap_parquets=bytes(20 << 20))  # over gRPC's default 4 MiB (unread: no route slots)
    session = runtime.start(static_world_map=huge_map)
    runtime.close(session)
    version = runtime.version()
    assert version.version_id.startswith("terra-alpasim ") and "one camera at 64x64, 10 fps" in version.version_id
    api = version.grpc_api_version
    assert (api.major, api.minor) == (0, 55)


def test_frames_are_sent_at_the_size_the_camera_asks(served):
    _, runtime = served
    session = runtime.start(resolution=(128, 128))
    answer = runtime.chunk(session, Trajectory(poses=[pose_at(10**6, 0.0, 0.0, 0.0)]))
    frame = answer.camera_outputs[0].rgb_frames[0]
    runtime.close(session)
    assert pixels(frame).shape == (128, 128, 3)


def test_a_failure_of_the_server_is_internal_and_ends_only_its_session(served, monkeypatch, caplog):
    table, runtime = served
    caplog.set_level("INFO", logger="terra.alpasim")
    broken = runtime.start(seed=1)

    def fail(session, actions, routes):
        raise RuntimeError("the engine broke\nits second line")

    monkeypatch.setattr(table, "_generate", fail)
    code, details = status_of(lambda: runtime.chunk(broken, trajectory(straight(), range(1, 6))))
    assert code == grpc.StatusCode.INTERNAL and details == (
        "internal error: RuntimeError: the engine broke its second line (the server's log has the traceback)")
    monkeypatch.undo()
    code, details = status_of(lambda: runtime.chunk(broken, trajectory(straight(), range(1, 6))))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "failed in an earlier chunk" in details
    runtime.close(broken)
    assert len(runtime.drive(straight())[1]) == 8  # the server goes on
    logged = [record.getMessage() for record in caplog.records if record.name == "terra.alpasim"]
    assert any("RuntimeError: the engine broke\\nits second line" in line for line in logged), logged
    assert not any("the engine broke\nits second line" in line for line in logged)  # no line of the message's own


def png(size: tuple[int, int]) -> bytes:
    """A black PNG of ``size`` (height, width): small on the wire whatever its size."""
    buffer = io.BytesIO()
    Image.new("RGB", size[::-1]).save(buffer, format="PNG")
    return buffer.getvalue()


def test_every_field_is_checked_before_use_and_named_when_refused(served, caplog):
    table, runtime = served
    caplog.set_level("INFO", logger="terra.alpasim")
    path = straight()
    session = runtime.start(seed=4)
    late = trajectory(path, [1, 2])
    late.poses[0].timestamp_us = 2**64 - 1
    actor = pb.VideoChunkRequest(session_id=session, rig_trajectory=trajectory(path, [1]),
                                 dynamic_state=pb.DynamicWorldState(actors=[pb.DynamicActor(class_id=77)]))
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    cases = {
        "enum out of range": (lambda: runtime.start(initial_frames=[pb.Image(data=jpeg(), format=99)]),
                              ["initial_frames[0].format is 99", "ImageFormat"]),
        "timestamp near 2**64": (lambda: runtime.chunk(session, late),
                                 ["pose 0 has timestamp_us=18446744073709551615"]),
        "actor class out of range": (lambda: runtime.stub.render_video_chunk(actor, timeout=60),
                                     ["dynamic_state.actors[0].class_id is 77"]),
        "newline in a camera id": (lambda: runtime.start(camera_specs=[camera_spec(logical_id="cam\nINFO: forged")]),
                                   ["camera_specs[0].logical_id 'cam\\nINFO: forged' is not an id"]),
        "megabyte camera id": (lambda: runtime.start(camera_specs=[camera_spec(logical_id="c" * (1 << 20))]),
                               ["(1048576 characters) is not an id"]),
        "megabyte session id": (lambda: runtime.chunk(pb.SessionId(session_id="s" * (1 << 20)), trajectory(path, [1])),
                                ["session_id 'sss", "is not an id"]),
        "close with a bad id": (lambda: runtime.close(pb.SessionId(session_id="a\nb")), ["session_id 'a\\nb'"]),
        "a bomb of a frame": (lambda: runtime.start(frame=png((4096, 4096))),
                              ["4096x4096 pixels, more than the 8294400"]),
    }
    for name, (call, words) in cases.items():
        code, details = status_of(call)
        assert code == invalid and all(w in details for w in words), (name, code, details)
        assert "\n" not in details and len(details) <= 1000, name
    assert len(runtime.chunk(session, trajectory(path, range(1, 3))).camera_outputs[0].rgb_frames) == 2
    runtime.close(session)
    assert not table.sessions
    logged = [record.getMessage() for record in caplog.records if record.name == "terra.alpasim"]
    assert logged and not any("\n" in line or len(line) > 1200 for line in logged)  # no forged or huge log line


def test_a_chunk_abandoned_by_its_caller_goes_to_its_retry(served):
    table, runtime = served
    path = straight()
    session = runtime.start(seed=6)
    state = table.get(session.session_id)
    first = trajectory(path, range(1, 4))
    times = timestamps(first.poses)
    poses = planar_poses(*pose_arrays(first.poses))
    with pytest.raises(SessionUnusable, match="gave up"):
        table.render(session.session_id, times, poses, answered=lambda: False)
    assert state.track.frames == 0 and not state.last.committed  # nothing committed
    code, details = status_of(lambda: runtime.chunk(session, trajectory(path, range(4, 6))))  # skipping ahead
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "send that chunk again" in details
    kept = state.last.images
    retried = runtime.chunk(session, first).camera_outputs[0].rgb_frames
    assert [image.data for image in retried] == kept and state.track.frames == 3 and state.last.committed
    again = runtime.chunk(session, first).camera_outputs[0].rgb_frames  # its answer lost: answered again
    assert [image.data for image in again] == kept and state.track.frames == 3
    assert len(runtime.chunk(session, trajectory(path, range(4, 6))).camera_outputs[0].rgb_frames) == 2
    assert state.track.frames == 5
    runtime.close(session)


def test_a_caller_past_its_deadline_gets_its_frames_on_retry(served, monkeypatch):
    """The retry comes while the abandoned chunk still renders: it waits for it and gets its frames."""
    table, runtime = served
    path = straight()
    session = runtime.start(seed=7)
    generate, given_up = table._generate, threading.Event()

    def slow(session_state, actions, routes):  # the engine still works when the caller's deadline passes
        codes = generate(session_state, actions, routes)
        given_up.wait(60)
        return codes

    monkeypatch.setattr(table, "_generate", slow)
    chunk = trajectory(path, range(1, 4))
    with pytest.raises(grpc.RpcError) as err:
        runtime.stub.render_video_chunk(pb.VideoChunkRequest(session_id=session, rig_trajectory=chunk), timeout=0.5)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    state = table.get(session.session_id)
    assert state.busy.locked() and state.track.frames == 0  # still rendering the abandoned chunk
    threading.Timer(0.5, given_up.set).start()  # it ends while the retry waits
    assert len(runtime.chunk(session, chunk).camera_outputs[0].rgb_frames) == 3 and state.track.frames == 3
    monkeypatch.undo()
    runtime.close(session)


def test_a_token_guards_every_call(caplog):
    from terra.core.errors import TerraInputError
    from terra.serve.settings import ServeSettings

    for host in ("0.0.0.0", "::ffff:10.0.0.1", "::ffff:0.0.0.0"):
        with pytest.raises(TerraInputError, match="reachable beyond this machine, so a token is required"):
            AlpasimSettings(host=host)
    for host in ("::ffff:127.0.0.1", "[::ffff:127.0.0.2]", "::1", "localhost"):  # loopback: no token needed
        assert AlpasimSettings(host=host).token is None
    assert ServeSettings(host="::ffff:127.0.0.1").token is None
    with pytest.raises(TerraInputError, match="alpasim.max_sessions must be a whole number from 1 to 1024"):
        AlpasimSettings(max_sessions=10**9)
    settings = AlpasimSettings(port=0, token="s3cret-token")
    server, port = bind(settings)
    start(server, WorldModelServicer(SimpleNamespace(pipeline=SimpleNamespace(image_size=(64, 64))), "none"))
    try:
        with caplog.at_level(logging.INFO, logger="terra.alpasim"):
            for token in (None, "wrong-token") * 100:
                code, details = status_of(FakeRuntime(f"127.0.0.1:{port}", 30, token).version)
                assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization: Bearer <token>" in details
        lines = [r.getMessage() for r in caplog.records if "without the token" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("1 call(s) without the token refused"), lines  # not 200
        assert FakeRuntime(f"127.0.0.1:{port}", 30, "s3cret-token").version().version_id.startswith("terra-alpasim")
    finally:
        server.stop(1).wait()
