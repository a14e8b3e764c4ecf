"""AlpaSim's ``WorldModelService`` over gRPC, on a :class:`SessionTable`."""

from __future__ import annotations

import functools
import hmac
import logging
import socket
import threading
import time
import traceback
from concurrent import futures
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable

import grpc
from carla_driver_interface.protocol import ALPASIM_API_VERSION, Empty, VersionId

from terra.alpasim import video_model_pb2 as pb
from terra.alpasim import video_model_pb2_grpc as pb_grpc
from terra.alpasim.fields import RequestError, client_id, enum_name, pose_arrays, quoted, timestamps
from terra.alpasim.poses import planar_poses
from terra.alpasim.sessions import SessionTable
from terra.alpasim.settings import MAX_MESSAGE_BYTES, AlpasimSettings
from terra.config.checks import one_line
from terra.core.errors import TerraInputError, error_line

log = logging.getLogger("terra.alpasim")
FORMATS = {"jpeg": pb.JPEG, "png": pb.PNG}
INITIAL_FORMATS = (pb.UNDEFINED, pb.PNG, pb.JPEG)  # UNDEFINED: told by the bytes
SERVER_OPTIONS = [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                  ("grpc.so_reuseport", 0)]  # a port another server holds is refused, not shared
RETRY_WAIT_S = 600.0  # the longest a chunk waits for the session's chunk in flight (a retry of it)
MAX_DETAILS_CHARS = 1000  # a refusal's one line (gRPC sends it as metadata, a few KiB at most)
REFUSALS_LOGGED_EVERY_S = 60.0  # calls without the token: one log line counting them at most this often


def answered(method: Callable) -> Callable:
    """A servicer method whose refusals become gRPC statuses with one line."""

    @functools.wraps(method)
    def wrapper(self, request, context: grpc.ServicerContext):
        try:
            return method(self, request, context)
        except TerraInputError as err:  # a RequestError names its status
            code, details = grpc.StatusCode[getattr(err, "status", "INVALID_ARGUMENT")], str(err)
        except Exception as err:  # noqa: BLE001  (the server goes on; the caller gets one line)
            # the traceback's frames are the server's code; its message, which may quote a client, escaped
            log.error("%s failed: %s\n%s", method.__name__, one_line(f"{type(err).__name__}: {err}"),
                      "".join(traceback.format_tb(err.__traceback__)).rstrip())
            line = error_line(err, memory_advice="lower alpasim.max_sessions")
            code, details = grpc.StatusCode.INTERNAL, f"internal error: {line} (the server's log has the traceback)"
        details = error_line(TerraInputError(details), MAX_DETAILS_CHARS)  # one line, within gRPC's metadata
        log.info("%s refused: %s", method.__name__, one_line(details))
        context.abort(code, details)

    return wrapper


class TokenCheck(grpc.ServerInterceptor):
    """Calls without the metadata ``authorization: Bearer <token>`` end UNAUTHENTICATED before any servicer runs."""

    def __init__(self, token: str) -> None:
        self.wanted = f"Bearer {token}".encode()
        self._lock = threading.Lock()  # guards the count: calls are answered on many threads
        self._refused, self._next_line = 0, 0.0

        def refuse(request, context: grpc.ServicerContext):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token; send the gRPC metadata "
                          "authorization: Bearer <token> (terra-alpasim's alpasim.token)")

        self.refusal = grpc.unary_unary_rpc_method_handler(refuse)

    def intercept_service(self, continuation, handler_call_details):
        sent = [value for key, value in handler_call_details.invocation_metadata or () if key == "authorization"]
        given = sent[0].encode() if len(sent) == 1 and isinstance(sent[0], str) else b""
        if hmac.compare_digest(given, self.wanted):
            return continuation(handler_call_details)
        now = time.monotonic()
        with self._lock:
            self._refused += 1
            if now < self._next_line:
                return self.refusal
            count, self._refused, self._next_line = self._refused, 0, now + REFUSALS_LOGGED_EVERY_S
        log.info("%d call(s) without the token refused (the last to %s); the next such line in %.0f s at the earliest",
                 count, one_line(quoted(handler_call_details.method)), REFUSALS_LOGGED_EVERY_S)
        return self.refusal


class WorldModelServicer(pb_grpc.WorldModelServiceServicer):
    """The four calls of ``omnidreams.video_model.WorldModelService`` on ``table``'s sessions."""

    def __init__(self, table: SessionTable, model: str) -> None:
        self.table = table
        height, width = table.pipeline.image_size
        self.renders = f"{model}, one camera at {height}x{width}, 10 fps"

    @answered
    def start_session(self, request: pb.SessionRequest, context) -> pb.SessionId:
        cameras = len(request.camera_specs)
        if cameras != 1:
            raise RequestError(f"this server renders one camera; the request has {cameras} (camera_specs): run "
                               "AlpaSim with one camera for the video model")
        if len(request.initial_frames) != 1 or len(request.rig_to_camera) > 1:
            raise RequestError(f"one camera needs one initial frame and at most one rig_to_camera; the request has "
                               f"{len(request.initial_frames)} and {len(request.rig_to_camera)}")
        debug = request.debug_options
        if debug.skip_video_generation and not debug.return_hdmap_frames:
            raise RequestError("debug_options.skip_video_generation without return_hdmap_frames leaves nothing to "
                               "return; set return_hdmap_frames too (each frame's told route drawn), or neither")
        frame = request.initial_frames[0]
        name = enum_name(pb.ImageFormat, frame.format, "initial_frames[0].format")
        if frame.format not in INITIAL_FORMATS:
            raise RequestError(f"initial_frames[0] is {name}; send a PNG or JPEG")
        spec = request.camera_specs[0]
        camera = client_id(spec.logical_id, "camera_specs[0].logical_id") if spec.logical_id else "camera"
        session = self.table.start(frame.data, camera, (spec.resolution_h, spec.resolution_w), request.random_seed,
                                   request.static_world_map.hdmap_parquets, debug.return_hdmap_frames,
                                   debug.skip_video_generation)
        height, width = session.size
        frames = ("only HD-map condition frames" if debug.skip_video_generation
                  else "with HD-map condition frames" if debug.return_hdmap_frames else "")
        log.info("session %s: camera %s (%s model asked) rendered as this model's own camera (%s), sent at %dx%d%s; "
                 "seed %d%s; not used: the text prompt, the camera model, rig_to_camera", session.id, camera,
                 spec.WhichOneof("camera_param") or "no", self.renders, height, width, f", {frames}" if frames else "",
                 session.seed, " (the server's choice)" if not request.random_seed else "")
        return pb.SessionId(session_id=session.id)

    @answered
    def render_video_chunk(self, request: pb.VideoChunkRequest, context) -> pb.VideoChunkReturn:
        session = self.table.get(request.session_id.session_id)
        poses = request.rig_trajectory.poses
        self.table.check_room(session, len(poses))  # before a pose is read: a million of them cost seconds
        times = timestamps(poses)
        vec, quat = pose_arrays(poses)
        for i, actor in enumerate(request.dynamic_state.actors):
            enum_name(pb.ActorClassId, actor.class_id, f"dynamic_state.actors[{i}].class_id")
        wait_s = context.time_remaining()  # a retry may arrive while the chunk it retries still renders
        rendered = self.table.render(session.id, times, planar_poses(vec, quat), context.is_active,
                                     RETRY_WAIT_S if wait_s is None else min(wait_s, RETRY_WAIT_S))
        if request.dynamic_state.actors and session.track.frames == len(times):
            log.info("session %s: %d other actors are not rendered (Terra does not model them)", session.id,
                     len(request.dynamic_state.actors))
        image_format = FORMATS[self.table.settings.image_format]
        output = pb.CameraOutput(camera_logical_id=session.camera,
                                 rgb_frames=[pb.Image(data=data, format=image_format) for data in rendered.images],
                                 hdmap_condition_frames=[pb.Image(data=data, format=image_format)
                                                         for data in rendered.hdmap])
        return pb.VideoChunkReturn(camera_outputs=[output])

    @answered
    def close_session(self, request: pb.SessionCloseRequest, context) -> Empty:
        if self.table.close(request.session_id):
            log.info("session %s closed", request.session_id)  # an id of this server's (checked by close)
        return Empty()

    @answered
    def get_version(self, request: Empty, context) -> VersionId:
        return VersionId(version_id=f"terra-alpasim {package_version()} ({self.renders})", git_hash="",
                         grpc_api_version=ALPASIM_API_VERSION)


def package_version() -> str:
    try:
        return version("terra-world-model")
    except PackageNotFoundError:
        return "unknown"


def bind(settings: AlpasimSettings, workers: int | None = None) -> tuple[grpc.Server, int]:
    """A gRPC server bound to ``alpasim.host:alpasim.port`` (not started) and its port."""
    check_free(settings)
    interceptors = [] if settings.token is None else [TokenCheck(settings.token)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers or settings.max_sessions + 4,
                                                    thread_name_prefix="terra-alpasim"), options=SERVER_OPTIONS,
                         interceptors=interceptors)
    try:
        port = server.add_insecure_port(settings.address)
    except RuntimeError:
        port = 0
    if not port:
        raise TerraInputError(f"cannot listen on {settings.address}; choose another alpasim.port / alpasim.host")
    return server, port


def check_free(settings: AlpasimSettings) -> None:
    """Raise one line when ``alpasim.host:alpasim.port`` cannot be bound."""
    if not settings.port:
        return
    try:
        family, kind, proto, _, address = socket.getaddrinfo(settings.host, settings.port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
            probe.bind(address)
    except OSError as err:
        raise TerraInputError(f"cannot listen on {settings.address} ({err.strerror or err}); stop the program that "
                              "uses the port or choose another alpasim.port / alpasim.host") from None


def start(server: grpc.Server, servicer: WorldModelServicer) -> Any:
    """Serve ``servicer`` on a server from :func:`bind`."""
    pb_grpc.add_WorldModelServiceServicer_to_server(servicer, server)
    server.start()
    return server
