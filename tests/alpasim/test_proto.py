"""The WorldModelService contract as AlpaSim defines it (its video_model.proto: package, service, messages and
field numbers, checked on the descriptors the server runs with), and the committed generated modules are what
scripts/tools/compile_alpasim_proto.py makes of terra/alpasim/video_model.proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("carla_driver_interface")
from google.protobuf.descriptor import FieldDescriptor  # noqa: E402

from terra.alpasim import video_model_pb2 as pb  # noqa: E402
from tests.conftest import load_script  # noqa: E402

R, M = FieldDescriptor.LABEL_REPEATED, FieldDescriptor.LABEL_OPTIONAL
# message → field → (number, type name or scalar type, repeated), from AlpaSim's video_model.proto
FIELDS = {
    "StaticWorldMap": {"hdmap_parquets": (1, FieldDescriptor.TYPE_BYTES, M)},
    "SessionId": {"session_id": (1, FieldDescriptor.TYPE_STRING, M)},
    "DynamicActor": {"class_id": (1, "omnidreams.video_model.ActorClassId", M), "bbox_dims": (2, "common.AABB", M),
                     "trajectory": (3, "common.Trajectory", M)},
    "DynamicWorldState": {"actors": (1, "omnidreams.video_model.DynamicActor", R)},
    "Image": {"data": (1, FieldDescriptor.TYPE_BYTES, M), "format": (2, "omnidreams.video_model.ImageFormat", M)},
    "TextPrompt": {"positive": (1, FieldDescriptor.TYPE_STRING, M), "negative": (2, FieldDescriptor.TYPE_STRING, M)},
    "DebugOptions": {"return_hdmap_frames": (1, FieldDescriptor.TYPE_BOOL, M),
                     "skip_video_generation": (2, FieldDescriptor.TYPE_BOOL, M)},
    "SessionRequest": {"static_world_map": (1, "omnidreams.video_model.StaticWorldMap", M),
                       "text_prompt": (2, "omnidreams.video_model.TextPrompt", M),
                       "debug_options": (3, "omnidreams.video_model.DebugOptions", M),
                       "camera_specs": (4, "nre.grpc.protos.sensorsim.CameraSpec", R),
                       "initial_frames": (5, "omnidreams.video_model.Image", R),
                       "rig_to_camera": (6, "common.Pose", R),
                       "random_seed": (7, FieldDescriptor.TYPE_FIXED64, M)},
    "SessionCloseRequest": {"session_id": (1, FieldDescriptor.TYPE_STRING, M)},
    "VideoChunkRequest": {"session_id": (1, "omnidreams.video_model.SessionId", M),
                          "rig_trajectory": (2, "common.Trajectory", M),
                          "dynamic_state": (3, "omnidreams.video_model.DynamicWorldState", M)},
    "CameraOutput": {"camera_logical_id": (1, FieldDescriptor.TYPE_STRING, M),
                     "rgb_frames": (2, "omnidreams.video_model.Image", R),
                     "hdmap_condition_frames": (3, "omnidreams.video_model.Image", R)},
    "VideoChunkReturn": {"camera_outputs": (1, "omnidreams.video_model.CameraOutput", R)},
}
ENUMS = {"ActorClassId": ["INVALID", "CAR", "TRUCK", "PEDESTRIAN", "CYCLIST", "OTHER"],
         "ImageFormat": ["UNDEFINED", "PNG", "JPEG", "JPEG2000", "RGB_UINT8_PLANAR", "AVC", "AV1"]}
METHODS = {"start_session": ("SessionRequest", "SessionId"), "close_session": ("SessionCloseRequest", "common.Empty"),
           "render_video_chunk": ("VideoChunkRequest", "VideoChunkReturn"),
           "get_version": ("common.Empty", "common.VersionId")}


def full(name: str) -> str:
    return name if "." in name else f"omnidreams.video_model.{name}"


def test_the_descriptors_are_alpasims():
    file = pb.DESCRIPTOR
    assert (file.name, file.package) == ("alpasim_grpc/v0/video_model.proto", "omnidreams.video_model")
    assert [d.name for d in file.dependencies] == ["alpasim_grpc/v0/common.proto", "alpasim_grpc/v0/sensorsim.proto"]
    assert set(file.message_types_by_name) == set(FIELDS)
    for message, fields in FIELDS.items():
        descriptor = file.message_types_by_name[message]
        got = {f.name: (f.number, (f.message_type or f.enum_type).full_name if (f.message_type or f.enum_type)
                        else f.type, R if f.is_repeated else M) for f in descriptor.fields}
        assert got == fields, message
    for enum, names in ENUMS.items():
        assert [(v.name, v.number) for v in file.enum_types_by_name[enum].values] == list(zip(names, range(7)))
    service = file.services_by_name["WorldModelService"]
    assert service.full_name == "omnidreams.video_model.WorldModelService"
    assert {m.name: (m.input_type.full_name, m.output_type.full_name) for m in service.methods} == {
        name: (full(i), full(o)) for name, (i, o) in METHODS.items()}


def test_the_committed_modules_are_the_compilers_output(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) compiles the proto")
    compile_script = load_script("tools/compile_alpasim_proto")
    committed = Path(pb.__file__).parent
    for path in compile_script.compile_proto(tmp_path):
        assert path.read_text() == (committed / path.name).read_text(), (
            f"{path.name} differs from the compiler's output: run python scripts/tools/compile_alpasim_proto.py")


def test_the_shipped_proto_compiles_alone_against_alpasims_imports(tmp_path):
    """The proto imports AlpaSim's common.proto and sensorsim.proto, which are not shipped: protoc finds them in the
    descriptors carla-driver-interface's modules carry (the script's --imports-out), as the proto's header says."""
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the dev extra) compiles the proto")
    compile_script = load_script("tools/compile_alpasim_proto")
    proto = Path(pb.__file__).with_name("video_model.proto")
    imports = tmp_path / "alpasim_imports.pb"
    compile_script.main(["--imports-out", str(imports)])

    def protoc(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "grpc_tools.protoc", *flags, f"-I{proto.parent}",
                               f"--python_out={tmp_path}", proto.name], capture_output=True, text=True, timeout=120)

    alone = protoc()  # the control: without AlpaSim's files protoc cannot read the imports
    assert alone.returncode != 0 and "alpasim_grpc/v0/common.proto" in alone.stderr
    found = protoc(f"--descriptor_set_in={imports}")
    assert found.returncode == 0, found.stderr
    assert "WorldModelService" in (tmp_path / "video_model_pb2.py").read_text()
