"""The docs' examples run as given: docs/generate.md's trajectory files (CSV and JSON, x forward and y to the left)
through the ``terra-generate`` command printed beside each, and docs/rollout.md's samples (its sample with routes,
written by the page's Python, too) through the batch's own check before any model loads, and docs/generate.md's
Python example that passes a road through ``RolloutRequest``. A trajectory covers
``num_context + num_frames - 1`` frames; a shorter one is refused with that rule in its line."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from PIL import Image

from terra.apps.runner import CONF_DIR
from terra.batch.config import batch_spec
from terra.batch.plan import plan_batch
from terra.core.errors import TerraInputError
from terra.inputs.actions import load_actions
from terra.inputs.samples import read_samples

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
RULE = "num_context + num_frames - 1"


def fenced(page: str, language: str) -> list[str]:
    """The code blocks of ``language`` in a docs page, their indentation removed."""
    text = (ROOT / "docs" / page).read_text()
    blocks = re.findall(rf"^( *)```{language}\n(.*?)^\1```", text, re.S | re.M)
    return ["\n".join(line[len(indent):] for line in body.splitlines()) + "\n" for indent, body in blocks]


def example_and_command(language: str) -> tuple[str, list[str]]:
    """docs/generate.md's trajectory example in ``language`` and the command line printed right after it."""
    text = (ROOT / "docs" / "generate.md").read_text()
    [after] = re.findall(rf"```{language}\n.*?```\s*```bash\n\s*(.*?)\n", text, re.S)
    [example] = fenced("generate.md", language)
    return example, shlex.split(after.partition("#")[0])


@pytest.mark.parametrize("language", ["csv", "json"])
def test_a_trajectory_example_runs_as_its_command_says(tmp_path, language):
    """The example saved under the name its command gives, and that command run (demo model, built-in context)."""
    example, (program, *args) = example_and_command(language)
    assert program == ".venv/bin/terra-generate" and f"trajectory=traj.{language}" in args, args
    (tmp_path / f"traj.{language}").write_text(example)
    num_frames = int(dict(a.split("=", 1) for a in args).get("num_frames", 16))
    actions = load_actions(tmp_path / f"traj.{language}", 3 + num_frames - 1)  # [frames, 6, 3]: [y, x, time]
    assert (actions[:, :, 1] > 0).all()  # x: forward, 12 m/s
    assert actions[0, -1, 0] > 0  # y: the example turns to the left
    result = subprocess.run([sys.executable, "-m", "terra.apps.generate", *args], cwd=tmp_path, env=ENV,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    [sidecar] = (tmp_path / "outputs").glob("*/*/rollout.json")
    assert json.loads(sidecar.read_text())["rollouts"][0]["num_generated"] == num_frames


def test_a_trajectory_one_frame_short_names_the_rule(tmp_path):
    """Control: the CSV example is exactly long enough for its command; one frame more is refused, naming why."""
    example, args = example_and_command("csv")
    num_frames = int(dict(a.split("=", 1) for a in args[1:])["num_frames"])
    path = tmp_path / "traj.csv"
    path.write_text(example)
    assert len(load_actions(path, 3 + num_frames - 1)) == 3 + num_frames - 1
    with pytest.raises(TerraInputError, match=rf"covers {num_frames + 2} frames but the rollout needs actions for "
                                              rf"{num_frames + 3} \({re.escape(RULE)}"):
        load_actions(path, 3 + num_frames)


def test_a_trajectory_example_with_a_broken_key_is_one_error(tmp_path):
    """Control: the loader does refuse what the docs do not show (a misspelt key)."""
    [example] = fenced("generate.md", "json")
    path = tmp_path / "traj.json"
    path.write_text(example.replace('"trajectory"', '"trajectroy"'))
    with pytest.raises(TerraInputError, match="unknown key 'trajectroy' \\(did you mean 'trajectory'\\?\\)"):
        load_actions(path, 3)


def samples_folder(tmp_path: Path) -> Path:
    """docs/rollout.md's samples (the elided ACT-Bench row aside) with the files they name: frames under
    ``frames/`` (the command's image_root), a video, and sample 0's trajectory file, docs/generate.md's JSON."""
    [block] = fenced("rollout.md", "jsonl")
    lines = [line for line in block.splitlines() if "..." not in line]
    assert len(lines) == 3
    (tmp_path / "samples.jsonl").write_text("\n".join(lines) + "\n")
    frames = tmp_path / "frames"
    rng = np.random.default_rng(0)
    for folder, names in (("clips/drive_07", ["0.png", "1.png", "2.png"]), ("a", ["0.jpg", "1.jpg", "2.jpg"])):
        (frames / folder).mkdir(parents=True)
        for name in names:
            Image.fromarray(rng.integers(0, 255, (72, 128, 3), dtype=np.uint8)).save(frames / folder / name)
    iio.imwrite(frames / "b.mp4", rng.integers(0, 255, (4, 64, 128, 3), dtype=np.uint8), fps=10)
    (tmp_path / "traj").mkdir()
    [trajectory] = fenced("generate.md", "json")
    (tmp_path / "traj" / "drive_07.json").write_text(trajectory)
    return tmp_path


def rollout_plan(folder: Path, *extra: str):
    """The batch's plan of docs/rollout.md's first command in ``folder``: every sample's inputs checked, its
    trajectory built into actions, before any model loads."""
    program, *args = shlex.split(fenced("rollout.md", "bash")[0].splitlines()[0])
    assert program == ".venv/bin/terra-rollout" and "num_frames=16" in args, args
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            return plan_batch(batch_spec(compose("rollout", overrides=[*args, *extra]), progress=False))
    finally:
        os.chdir(cwd)


def test_the_samples_example_runs_as_the_command_says(tmp_path):
    folder = samples_folder(tmp_path)
    samples = read_samples(folder / "samples.jsonl")
    assert [s.error for s in samples] == [None, None, None] and [s.kind for s in samples] == ["terra"] * 3
    plan = rollout_plan(folder)
    assert plan.failed == [] and [item.sample.sample_id for item in plan.to_run] == [0, 1, 2]
    assert [item.num_frames for item in plan.to_run] == [16, 16, 2]


def test_a_sample_too_short_for_its_frames_fails_alone_naming_the_rule(tmp_path):
    """Control: sample 2's 4 poses without its own num_frames (the run's 16) fail that sample alone."""
    folder = samples_folder(tmp_path)
    text = (folder / "samples.jsonl").read_text()
    assert ', "num_frames": 2}' in text
    (folder / "samples.jsonl").write_text(text.replace(', "num_frames": 2}', "}"))
    plan = rollout_plan(folder)
    assert [item.sample.sample_id for item in plan.to_run] == [0, 1]
    [failed] = plan.failed
    assert failed["sample_id"] == 2 and RULE in failed["error"], failed


def test_the_routes_example_runs_as_its_command_says(tmp_path):
    """docs/rollout.md's sample with routes, written by its Python in the samples' folder and planned by the command
    printed after it for the demo model's route slots: it runs, told the bend's lane ahead of every frame (y grows as
    the road turns left, from the car's own place)."""
    from terra.config.assets import ASSETS

    folder = samples_folder(tmp_path)
    text = (ROOT / "docs" / "rollout.md").read_text()
    [code] = [block for block in fenced("rollout.md", "python") if "routes.jsonl" in block]
    [line] = re.findall(r"```python\n[^`]*routes\.jsonl[^`]*```\s*```bash\n(.*?)\n", text, re.S)
    program, *args = shlex.split(line)
    assert program == ".venv/bin/terra-rollout" and "samples=routes.jsonl" in args, args
    route_tokens = json.loads((ASSETS / "demo" / "world_model" / "config.json").read_text())["num_route_tokens"]
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        exec(code, {})  # noqa: S102  (the page's own example)
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            plan = plan_batch(batch_spec(compose("rollout", overrides=args), progress=False), route_tokens=route_tokens)
    finally:
        os.chdir(cwd)
    assert plan.failed == [] and [item.sample.sample_id for item in plan.to_run] == ["bend"]
    [item] = plan.to_run
    routes = item.inputs.routes  # [frames, K, 3]: x, y, s
    assert routes.shape == (3 + item.num_frames, route_tokens, 3)
    assert 0.0 < routes[0, 0, 1] < routes[0, -1, 1] and np.all(np.diff(routes[0, :, 0]) > 0)
    np.testing.assert_allclose(np.hypot(*routes[..., :2].reshape(-1, 2).T - np.array([[0.0], [200.0]])), 200.0,
                               atol=0.01)  # every frame's route: the car's lane, through the car


def test_the_python_road_example_runs_a_road_through_rollout_request(tmp_path, monkeypatch):
    """docs/generate.md's Python example (its Routes section): a road followed at the car's poses into
    ``RolloutRequest(routes=)`` on the demo model; its routes are those of the page's ``bend.json`` (to its 1 mm)."""
    section = (ROOT / "docs" / "generate.md").read_text().split("## Routes", 1)[1].split("\n## ", 1)[0]
    write, run = re.findall(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert "bend.json" in write and "RolloutRequest" in run
    monkeypatch.chdir(tmp_path)
    exec(write, {})  # noqa: S102  (the page's own examples)
    names: dict = {}
    exec(run, names)  # noqa: S102
    assert names["result"].frames.shape == (7, 144, 256, 3) and names["request"].routes.shape == (7, 8, 3)
    from terra.inputs.requests import trajectory_inputs

    np.testing.assert_allclose(names["routes"], trajectory_inputs(tmp_path / "bend.json", 3, 4, 8).routes, atol=0.005)
