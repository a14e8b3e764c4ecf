"""Hostile inputs at every entry point: no traceback, no hang, no warning, nothing left behind.

One table per entry point, each row a class of hostile input (terra/config/ and the ranges it points to):

* the Python API (in-process): one :class:`TerraInputError` line that names the input, no warning first;
* ``terra-generate`` and ``terra-evaluate`` (subprocesses): exit code 2, exactly one line on stderr, no
  traceback, no output folder, no Hydra run folder.

Then what needs a running ``terra-generate``: a full disk (a file-size limit, ``RLIMIT_FSIZE``, in the
subprocess), Ctrl-C and SIGTERM while it generates, an internal error, and settings checked before torch loads.
The hostile files are made here: PNG headers claiming huge sizes, FIFOs, deep and huge JSON, lying .npy headers.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
import warnings
import zlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from terra.config.backend import check_backend
from terra.config.checks import check_number
from terra.config.files import check_context_paths
from terra.config.output_dir import check_output_dir
from terra.config.sampling import SamplingConfig
from terra.core.device import check_device
from terra.core.errors import TerraInputError
from terra.decoder.writers import write_gif, write_mp4
from terra.contract.actions import validate_actions
from terra.inputs.actions import actions_for_manoeuvre, load_actions
from terra.inputs.requests import trajectory_actions
from terra.inputs.trajectory import EgoTrajectory
from terra.models.checkpoint import read_world_model_config
from terra.tokenizer.images import load_images
from tests.conftest import spawn_interruptible

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "terra" / "assets" / "demo"
SIZE = (144, 256)  # the demo tokenizer's (H, W)
TERRA_GENERATE = Path(sys.executable).with_name("terra-generate")
FAST = ["backend=hf", "device=cpu", "num_frames=2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
ENV.pop("HYDRA_FULL_ERROR", None)


def png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims ``width`` x ``height`` pixels, with almost no pixel data behind it."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + chunk(b"IEND", b""))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> SimpleNamespace:
    """Every hostile file, made once per module."""
    root = tmp_path_factory.mktemp("hostile")
    ns = SimpleNamespace(root=root)

    def write(name: str, data: str | bytes) -> Path:
        path = root / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data, encoding="utf-8")
        return path

    # images
    ns.bomb_png = write("bomb.png", png_header(100_000, 100_000))  # Pillow's decompression-bomb error
    ns.big_png = write("big.png", png_header(9000, 9000))  # above MAX_PIXELS, below Pillow's own limit
    ns.fifo_png = root / "pipe.png"
    os.mkfifo(ns.fifo_png)
    ns.fifo_folder = root / "frames_with_fifo"
    ns.fifo_folder.mkdir()
    Image.new("RGB", SIZE[::-1], (90, 90, 90)).save(ns.fifo_folder / "a.png")
    os.mkfifo(ns.fifo_folder / "b.png")
    # trajectories
    ns.fifo_json = root / "pipe.json"
    os.mkfifo(ns.fifo_json)
    ns.huge_int = write("huge_int.json", '{"actions": [[[' + "9" * 400 + ", 0, 0.45]]]}")
    ns.deep = write("deep.json", "[" * 200_000 + "]" * 200_000)
    ns.beyond_float = write("beyond_float.json", '{"trajectory": {"x": [0, 1e400], "y": [0, 0]}}')
    ns.frames_1e9 = write("frames_1e9.json", '{"manoeuvre": {"name": "straight", "num_frames": 1e9}}')
    ns.frames_int = write("frames_int.json", '{"manoeuvre": {"name": "straight", "num_frames": 1000000000}}')
    ns.speed_1e308 = write("speed.json", '{"manoeuvre": {"name": "straight", "speed_kmh": 1e308}}')
    ns.rate_zero = write("rate_zero.json", json.dumps({"trajectory": {"x": [0, 1, 2], "y": [0, 0, 0], "rate_hz": 0}}))
    ns.fast_csv = write("fast.csv", "t,x,y\n0,0,0\n0.1,100000,0\n0.2,200000,0\n")  # 1e6 m/s
    ns.long_csv = write("long.csv", "t,x,y\n0,0,0\n1e9,1,0\n")  # 1e10 frames at 10 Hz
    ns.bom_csv = write("bom.csv", "\ufefft,x,y\n0,0,0\n0.1,1,0\n0.2,2,0\n0.3,3,0\n")  # Excel's UTF-8: accepted
    ns.complex_npy = root / "complex.npy"
    np.save(ns.complex_npy, np.ones((4, 6, 3), np.complex128))
    ns.lying_npy = root / "lying.npy"
    with ns.lying_npy.open("wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f8", "fortran_order": False, "shape": (10**12, 6, 3)})
        fh.write(b"\0" * 64)
    # a world model whose config.json asks for a table of negative size (weights linked, not copied)
    ns.wm_negative = root / "wm_negative"
    ns.wm_negative.mkdir()
    for file in (DEMO / "world_model").iterdir():
        if file.name != "config.json":
            (ns.wm_negative / file.name).symlink_to(file)
    config = json.loads((DEMO / "world_model" / "config.json").read_text())
    config["num_temporal_embeddings"] = -4
    (ns.wm_negative / "config.json").write_text(json.dumps(config))
    ns.a_file = write("a_file", "")
    ns.long_name = "n" * 300
    return ns


@pytest.fixture
def no_hang():
    """Fail (instead of hanging the suite) when a call blocks for 20 s, e.g. on a FIFO."""
    def timeout(signum, frame):
        raise TimeoutError("the call blocked")

    previous = signal.signal(signal.SIGALRM, timeout)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# case → (call(hostile), text the message must contain, attribute of `hostile` the message must name)
API_CASES = {
    "image_decompression_bomb": (lambda h: load_images(h.bomb_png, SIZE), "claims more than", "bomb_png"),
    "image_too_many_pixels": (lambda h: load_images(h.big_png, SIZE), "9000x9000", "big_png"),
    "image_is_a_fifo": (lambda h: load_images(h.fifo_png, SIZE), "not a regular file", "fifo_png"),
    "image_folder_with_a_fifo": (lambda h: load_images(h.fifo_folder, SIZE), "not a regular file", "fifo_folder"),
    "context_paths_fifo": (lambda h: check_context_paths([str(h.fifo_png)]), "not a regular file", "fifo_png"),
    "trajectory_is_a_fifo": (lambda h: load_actions(h.fifo_json, 4), "a FIFO", "fifo_json"),
    "json_400_digit_integer": (lambda h: load_actions(h.huge_int, 4), "400 digits", "huge_int"),
    "json_nested_200000_deep": (lambda h: load_actions(h.deep, 4), "too deeply", "deep"),
    "json_number_beyond_float": (lambda h: load_actions(h.beyond_float, 4), "1e400", "beyond_float"),
    "json_manoeuvre_num_frames_1e9": (lambda h: load_actions(h.frames_1e9, 4), "num_frames", "frames_1e9"),
    "json_manoeuvre_num_frames_10**9": (lambda h: load_actions(h.frames_int, 4), "from 1 to 10000", "frames_int"),
    "json_speed_kmh_1e308": (lambda h: load_actions(h.speed_1e308, 4), "speed_kmh must be", "speed_1e308"),
    "json_rate_hz_zero": (lambda h: load_actions(h.rate_zero, 4), "rate_hz must be", "rate_zero"),
    "csv_speed_1e6_mps": (lambda h: load_actions(h.fast_csv, 2), "m/s", "fast_csv"),
    "csv_spanning_1e9_s": (lambda h: load_actions(h.long_csv), "frames at 10 Hz", "long_csv"),
    "npy_complex_values": (lambda h: load_actions(h.complex_npy, 4), "complex128", "complex_npy"),
    "npy_header_claims_1e12_rows": (lambda h: load_actions(h.lying_npy, 4), "header promises", "lying_npy"),
    "mapping_speed_1e6_mps": (lambda h: trajectory_actions({"trajectory": {"x": [0, 1e5], "y": [0, 0]}}, 1, 1),
                              "m/s", None),
    "actions_1e6_m": (lambda h: validate_actions(np.full((4, 6, 3), 1e6)), "metres", None),
    "rate_hz_zero": (lambda h: EgoTrajectory.from_arrays([0, 1], [0, 0], rate_hz=0), "rate_hz", None),
    "manoeuvre_speed_1e308": (lambda h: actions_for_manoeuvre("straight", 4, speed_kmh=1e308), "speed_kmh", None),
    "manoeuvre_radius_1e-9": (lambda h: actions_for_manoeuvre("curve_left", 4, radius_m=1e-9), "radius_m", None),
    "manoeuvre_10**9_frames": (lambda h: actions_for_manoeuvre("straight", 10**9), "at most 10000", None),
    "temperature_inf": (lambda h: SamplingConfig(temperature=float("inf")), "sampling.temperature", None),
    "top_k_huge": (lambda h: SamplingConfig(top_k=10**30), "sampling.top_k", None),
    "number_400_digits": (lambda h: check_number(10**400, "speed_kmh", 0, 250, "speed_kmh=30"), "401-digit", None),
    "device_banana": (lambda h: check_device("banana"), "device='banana'", None),
    "max_batch_size_zero": (lambda h: check_backend("hf", {"max_batch_size": 0}), "max_batch_size", None),
    "backend_option_unknown": (lambda h: check_backend("hf", {"beams": 4}), "beams", None),
    "fps_1e9": (lambda h: write_gif(h.root / "x.gif", np.zeros((2, 8, 8, 3), np.uint8), fps=1e9), "fps", None),
    "fps_1e-9": (lambda h: write_mp4(h.root / "x.mp4", np.zeros((2, 8, 8, 3), np.uint8), fps=1e-9), "fps", None),
    "output_name_too_long": (lambda h: check_output_dir(h.root / "out", [h.long_name + ".mp4"]), "too long", None),
    "output_folder_under_a_file": (lambda h: check_output_dir(h.a_file / "out"), "not writable", "a_file"),
    "world_model_negative_table": (lambda h: read_world_model_config(h.wm_negative), "num_temporal_embeddings=-4",
                                   "wm_negative"),
}


@pytest.mark.parametrize("case", list(API_CASES))
def test_api_hostile_input_is_one_line_without_warnings(case, hostile, no_hang):
    call, expected, names = API_CASES[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TerraInputError) as err:
            call(hostile)
    message = str(err.value)
    assert expected in message, message
    assert "\n" not in message and len(message) < 400, message
    if names is not None:
        assert str(getattr(hostile, names)) in message, message
    assert [str(w.message) for w in caught] == []  # nothing printed before the error
    assert not list(hostile.root.glob("x.*")) and not (hostile.root / "out").exists()


def test_api_accepts_a_csv_with_a_byte_order_mark(hostile):
    actions = load_actions(hostile.bom_csv, 4)
    assert actions.shape == (4, 6, 3) and actions[0, 0, 1] == pytest.approx(0.45 * 10)  # 10 m/s along x


# ---------------------------------------------------------------------------------------------- subprocesses


def run_entry(command: list[str], cwd: Path, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout, **kwargs)


def one_error_line(result: subprocess.CompletedProcess, prog: str, code: int = 2) -> str:
    """The single stderr line of a failed run (checked: exit code, no traceback, nothing else on stderr)."""
    assert result.returncode == code, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr and "Warning" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: "), result.stderr
    return lines[0]


# case → (overrides from `hostile`, text the error line must contain)
CLI_CASES = {
    "context_decompression_bomb": (lambda h: [f"context={h.bomb_png}"], "claims more than"),
    "context_fifo": (lambda h: [f"context={h.fifo_png}"], "not a regular file"),
    "context_folder_with_a_fifo": (lambda h: [f"context={h.fifo_folder}"], "not a regular file"),
    "trajectory_fifo": (lambda h: [f"trajectory={h.fifo_json}"], "a FIFO"),
    "trajectory_400_digit_integer": (lambda h: [f"trajectory={h.huge_int}"], "400 digits"),
    "trajectory_nested_200000_deep": (lambda h: [f"trajectory={h.deep}"], "too deeply"),
    "trajectory_num_frames_1e9": (lambda h: [f"trajectory={h.frames_1e9}"], "num_frames"),
    "trajectory_speed_kmh_1e308": (lambda h: [f"trajectory={h.speed_1e308}"], "speed_kmh must be"),
    "trajectory_rate_hz_zero": (lambda h: [f"trajectory={h.rate_zero}"], "rate_hz must be"),
    "device_banana": (lambda h: ["device=banana"], "device='banana'"),
    "max_batch_size_zero": (lambda h: ["backend.options.max_batch_size=0"], "backend.options.max_batch_size"),
    "world_model_negative_table": (lambda h: [f"model.world_model={h.wm_negative}"], "num_temporal_embeddings=-4"),
    "fps_1e-9": (lambda h: ["output.fps=1e-9"], "output.fps"),
    "fps_1e9": (lambda h: ["output.fps=1e9"], "output.fps"),
    "output_name_too_long": (lambda h: [f"output.name={h.long_name}"], "output.name"),
    "temperature_inf": (lambda h: ["sampling.temperature=inf"], "sampling.temperature"),
    "speed_kmh_1e308": (lambda h: ["manoeuvre_params.speed_kmh=1e308"], "manoeuvre_params.speed_kmh"),
    "radius_m_1e-9": (lambda h: ["manoeuvre=curve_left", "manoeuvre_params.radius_m=1e-9"], "radius_m"),
    "num_samples_1000": (lambda h: ["num_samples=1000"], "num_samples"),
    "added_setting": (lambda h: ["+foo=1"], "unknown setting 'foo'"),
    "unquoted_non_ascii_path": (lambda h: [f"context={h.root}/Fahrtenbuch_ä"], "quote"),
}


@pytest.mark.skipif(shutil.which(str(TERRA_GENERATE)) is None, reason="terra-generate is not installed")
@pytest.mark.parametrize("case", list(CLI_CASES))
def test_terra_generate_hostile_input_exits_2_with_one_line(case, hostile, tmp_path):
    overrides, expected = CLI_CASES[case]
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    result = run_entry([str(TERRA_GENERATE), *FAST, *overrides(hostile), f"output.dir={out}"], cwd)
    line = one_error_line(result, "terra-generate")
    assert expected in line, line
    assert not out.exists() and list(cwd.iterdir()) == []  # no output folder, no Hydra run folder


@pytest.mark.skipif(shutil.which(str(TERRA_GENERATE)) is None, reason="terra-generate is not installed")
def test_terra_generate_writes_nothing_into_its_inputs(tmp_path):
    frames = tmp_path / "frames"
    frames.mkdir()
    for t in range(3):
        Image.fromarray(np.full((*SIZE, 3), 40 * t, np.uint8)).save(frames / f"{t}.png")
    for out, expected in ((frames, f"output.dir={frames} is the context ({frames})"),
                          (frames / "out", f"output.dir={frames / 'out'} lies inside the context {frames}"),
                          (tmp_path, f"output.dir={tmp_path} holds the context {frames}")):
        result = run_entry([str(TERRA_GENERATE), *FAST, f"context={frames}", f"output.dir={out}"], tmp_path / "cwd")
        assert expected in one_error_line(result, "terra-generate")
    assert sorted(p.name for p in frames.iterdir()) == ["0.png", "1.png", "2.png"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "frames"]
    assert list((tmp_path / "cwd").iterdir()) == []  # nor a Hydra run folder


# case → (overrides from `hostile`, text the error line must contain)
EVALUATE_CASES = {
    "out_dir_under_a_file": (lambda h: [f"out_dir={h.a_file}/eval"], "not writable"),
    "out_dir_name_too_long": (lambda h: [f"out_dir={h.root}/{h.long_name}"], "too long"),
    "out_dir_in_the_world_model": (lambda h: [f"out_dir={DEMO}/world_model/eval"], "lies inside the world model"),
    "device_banana": (lambda h: ["device=banana"], "device='banana'"),
    "max_batch_size_zero": (lambda h: ["backend.options.max_batch_size=0"], "backend.options.max_batch_size"),
    "temperature_inf": (lambda h: ["sampling.temperature=inf"], "sampling.temperature"),
    "speed_range_1e308": (lambda h: ["adherence.speed_kmh=[20,1e308]"], "adherence.speed_kmh"),
    "excluded_clips_1e9": (lambda h: ["exclude_training.num_clips=1e9"], "exclude_training.num_clips"),
    "horizon_not_whole": (lambda h: ["horizon=1.5"], "horizon"),
    "num_threads_zero": (lambda h: ["num_threads=0"], "num_threads"),
    "added_setting": (lambda h: ["+foo=1"], "unknown setting 'foo'"),
    "world_model_negative_table": (lambda h: [f"model.world_model={h.wm_negative}"], "num_temporal_embeddings=-4"),
}


@pytest.mark.parametrize("case", list(EVALUATE_CASES))
def test_evaluate_hostile_setting_exits_2_with_one_line_before_any_work(case, hostile, tmp_path):
    overrides, expected = EVALUATE_CASES[case]
    out, cwd = tmp_path / "eval", tmp_path / "cwd"
    args = overrides(hostile)
    if not any(a.startswith("out_dir=") for a in args):
        args.append(f"out_dir={out}")
    result = run_entry([sys.executable, "-m", "terra.apps.evaluate", "device=cpu", "quality.num_clips=1",
                        "adherence.num_cases=1", "horizon=1", *args], cwd)
    line = one_error_line(result, "terra-evaluate")
    assert expected in line, line
    assert not out.exists() and list(cwd.iterdir()) == []


# ---------------------------------------------------------------------------------------------- a running CLI


def test_settings_are_checked_before_torch_is_imported(tmp_path):
    code = ("import sys, terra.apps.generate\nsys.argv = ['terra-generate', 'device=banana']\ntry:\n"
            "    terra.apps.generate.main()\n"
            "except SystemExit as exit:\n    assert exit.code == 2, exit.code\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'imported before the check'\n")
    result = run_entry([sys.executable, "-c", code], tmp_path / "cwd")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().startswith("terra-generate: error: device='banana'")


@pytest.mark.skipif(shutil.which(str(TERRA_GENERATE)) is None, reason="terra-generate is not installed")
def test_internal_error_is_one_line_exit_1_and_verbose_shows_the_traceback(tmp_path):
    patch = ("import terra.apps.generate\ndef broken(cfg, out_dir):\n    raise RuntimeError('boom\\nsecond line')\n"
             "terra.apps.generate.run = broken\n")
    for verbose in (False, True):
        argv = ["terra-generate", "--verbose"] if verbose else ["terra-generate"]
        code = patch + f"import sys\nsys.argv = {argv!r}\nterra.apps.generate.main()\n"
        result = run_entry([sys.executable, "-c", code], tmp_path / "cwd")
        if verbose:
            assert result.returncode == 1 and "Traceback" in result.stderr and "RuntimeError: boom" in result.stderr
        else:
            line = one_error_line(result, "terra-generate", code=1)
            assert line.startswith("terra-generate: internal error: RuntimeError: boom (a bug") and "--verbose" in line
    assert list((tmp_path / "cwd").iterdir()) == []


def limit_file_size() -> None:
    """In the child: files may grow to 4 kB (and writing more fails with EFBIG instead of killing the process): the
    demo's 2-frame MP4 at Terra's encoding is about 6.5 kB, its GIF about 86 kB."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (4_000, 4_000))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(str(TERRA_GENERATE)) is None, reason="terra-generate is not installed")
@pytest.mark.parametrize("fmt", ["gif", "mp4"])
def test_full_disk_is_one_line_and_keeps_the_users_empty_folder(fmt, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()  # the user made it: a failed run leaves it, empty
    result = run_entry([str(TERRA_GENERATE), *FAST, f"output.formats=[{fmt}]", f"output.dir={out}"], tmp_path / "cwd",
                       preexec_fn=limit_file_size)
    line = one_error_line(result, "terra-generate")
    assert f"cannot write {out / ('rollout.' + fmt)}" in line and "free disk space" in line, line
    assert out.is_dir() and list(out.iterdir()) == [] and list((tmp_path / "cwd").iterdir()) == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(str(TERRA_GENERATE)) is None, reason="terra-generate is not installed")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_while_generating_stops_with_one_line_and_no_files(signum, tmp_path):
    out, cwd = tmp_path / "out", tmp_path / "cwd"
    cwd.mkdir()
    proc = spawn_interruptible([str(TERRA_GENERATE), "backend=hf", "device=cpu", "num_frames=200",
                                f"output.dir={out}"], cwd=cwd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    try:
        started = proc.stdout.readline()  # printed (and flushed) just before the first frame is generated
        assert started.startswith("terra-generate: generating 200 frames"), (started, proc.stderr.read())
        time.sleep(1.0)
        assert proc.poll() is None  # 200 frames take minutes: it is generating
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, (proc.returncode, stderr)
    assert stderr.strip() == f"terra-generate: interrupted by {signal.Signals(signum).name}", stderr
    assert not out.exists() and list(cwd.iterdir()) == []
