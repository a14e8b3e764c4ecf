"""Every console script's ``--help`` is the app's own page, made one way: what it does, the choices that exist, every
setting of its schema with its help and bounds, the exit codes and its docs page; never Hydra's generic page."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from terra.apps.help import PAGES, config_groups, opening_comment, page_template
from terra.config.schema import schema_settings

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
ENV = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
DOCS = {"terra-generate": "docs/generate.md", "terra-rollout": "docs/rollout.md", "terra-serve": "docs/serve.md",
        "terra-drive": "docs/drive.md", "terra-alpasim": "docs/alpasim.md", "terra-score": "docs/score.md",
        "terra-evaluate": "docs/score.md", **{name: "docs/train.md" for name in (
            "terra-train", "terra-prepare-logs", "terra-blend", "terra-train-tokenizer", "terra-tokenize",
            "terra-make-dataset")}}


def config_of(prog: str) -> str:
    [name] = [name for name, page in PAGES.items() if page.prog == prog]
    return name


def test_every_console_script_has_a_page():
    assert {page.prog for page in PAGES.values()} == set(SCRIPTS) == set(DOCS)
    for name in PAGES:
        assert (ROOT / "conf" / f"{name}.yaml").is_file(), name


@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_help_names_the_settings_choices_and_docs_page(prog, tmp_path):
    script = Path(sys.executable).with_name(prog)
    command = [str(script)] if script.exists() else [sys.executable, "-m", SCRIPTS[prog].partition(":")[0]]
    result = subprocess.run([*command, "--help"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=ENV)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    page = result.stdout
    assert "powered by Hydra" not in page and "$" not in page.replace("${", "")  # no template left unfilled
    assert page.startswith(f"{prog}: "), page[:200]  # what the app does, from its config file
    assert f"Usage: {prog} [KEY=VALUE ...]" in page and "Exit codes: 0" in page
    assert f"Docs: {DOCS[prog]}" in page
    text = (ROOT / "conf" / f"{config_of(prog)}.yaml").read_text()
    flat = re.sub(r"\s*\n\s*# ", " ", page)
    for item in schema_settings(PAGES[config_of(prog)].schema_class()).values():  # every field, its help, bounds
        assert f"\n{item.key}: " in page and item.help in flat and item.bounds() in flat, item.key
    config = yaml.safe_load(text)  # the config file: the schema first, the groups, Hydra's block; no setting twice
    assert set(config) == {"defaults", "hydra"} and config["defaults"][0] == f"{config_of(prog)}_schema"
    for group, options in config_groups(text).items():  # model=..., backend=..., with their options
        assert f"  {group}" in page and options.split(",")[0] in page, group
    assert list(tmp_path.iterdir()) == []  # --help writes nothing


def test_drives_page_lists_every_policy_world_and_control():
    from terra.closedloop.study.control_worlds import CONTROL_WORLDS
    from terra.closedloop.policies.builtin import PROBE_POLICIES, REFERENCE_POLICIES

    page = page_template("drive").replace("$$", "$")
    for name in (*REFERENCE_POLICIES, *PROBE_POLICIES, *CONTROL_WORLDS, "all_pixel", "all_reference", "navsim:",
                 "grpc:", "both", "truth", "package.module:Class", "bicycle", "docs/fidelity.md",
                 'docs/rollout.md, "Samples"'):
        assert name in page, name
    policies = PAGES["drive"].choices()["policies"]  # "Choices: policies" itself, not a comment elsewhere
    for name in (*REFERENCE_POLICIES, *PROBE_POLICIES):
        assert re.search(rf"\b{name}\b", policies), name


def test_the_input_formats_point_to_an_example():
    assert 'docs/generate.md, "Trajectories"' in page_template("generate") and "y to the left" in page_template(
        "generate")
    assert 'docs/rollout.md, "Samples"' in page_template("rollout")
    assert 'docs/train.md, "Driving logs"' in page_template("prepare_driving_logs")


def test_what_the_app_does_is_the_config_files_opening_comment():
    text = "# app: what it does\n#   app x=1\ndefaults:\n  - app_schema\n# a comment on the hydra block\nhydra: {}\n"
    assert opening_comment(text) == "app: what it does\n  app x=1"


def test_the_groups_are_those_the_defaults_list_picks():
    text = "defaults:\n  - model: demo\n  - optional backend@run: null\n  - override hydra/job_logging: none\n"
    assert config_groups(text) == {"model": "demo (default), terra_v1, terra_v2",
                                   "backend": "auto, hf, vllm; none by default"}


def run(prog: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(Path(sys.executable).with_name(prog)), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=ENV)


def test_a_config_not_the_apps_own_gets_a_page_and_a_refusal_leaves_no_run_folder(tmp_path):
    """``--help`` with ``--config-name`` (and ``--config-dir``) of a config that is not the app's: a page saying so,
    with the config as composed; overrides before ``--help`` are taken; and a run refused for such a config leaves
    no run folder of Hydra's (conf/generate.yaml's ``outputs/<date>/<time>/``), though a folder that was there stays."""
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "mine.yaml").write_text("a: 1\nb: ${a}\nc: ${oc.env:NOT_SET_HERE}\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = run("terra-generate", "--help", "--config-dir", str(tmp_path / "mine"), "--config-name", "mine", cwd=cwd)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout.startswith("terra-generate was given the config 'mine' (--config-name / --config-dir), not")
    assert "b: ${a}" in result.stdout and "Docs: docs/generate.md" in result.stdout
    result = run("terra-drive", "--help", "--config-name", "generate", cwd=cwd)
    assert result.returncode == 0 and "terra-drive was given the config 'generate'" in result.stdout, result.stderr
    result = run("terra-generate", "num_frames=3", "seed=2", "--help", cwd=cwd)
    assert result.returncode == 0 and result.stdout.startswith("terra-generate: "), result.stderr
    assert list(cwd.iterdir()) == []
    result = run("terra-drive", "--config-name", "generate", "num_frames=2", cwd=cwd)
    assert result.returncode == 2 and result.stderr.startswith("terra-drive: error: ") and \
        result.stderr.count("\n") == 1, result.stderr
    assert list(cwd.iterdir()) == []  # no outputs/<date>/<time>/
    (cwd / "kept").mkdir()  # a folder of the user's, empty, named as the run folder: it stays
    result = run("terra-drive", "--config-name", "generate", "hydra.run.dir=kept", cwd=cwd)
    assert result.returncode == 2 and [p.name for p in cwd.iterdir()] == ["kept"]


@pytest.mark.parametrize("name", ["generate", "rollout"])
def test_the_decoders_frame_size_is_the_demo_tokenizers(name):
    """``decoder: tokenizer`` writes frames at the tokenizer's own size: the size ``--help`` names for the demo is
    the shipped demo tokenizer's, read from the tokenizer itself."""
    from terra.config.assets import ASSETS
    from terra.tokenizer import load_tokenizer

    [line] = re.findall(r"^decoder: tokenizer +#.*(?:\n +#.*)*", page_template(name), re.M)
    said = re.findall(r"(\d+)x(\d+)\s*#?\s*for the demo's", line)
    assert said == [tuple(str(n) for n in load_tokenizer(ASSETS / "demo" / "tokenizer").image_size)], line


@pytest.mark.parametrize("config_name", ["generate", "rollout", "serve", "drive", "alpasim", "evaluate"])
def test_the_groups_settings_on_a_page_are_the_ranges_checked(monkeypatch, config_name):
    """An app with the sampling and backend groups lists their settings from the tables that check them."""
    from terra.config import backend, sampling
    from terra.config.checks import Range

    monkeypatch.setitem(sampling.SAMPLING, "top_k", Range(0, 77, 0, whole=True))
    monkeypatch.setitem(backend.BACKEND_OPTIONS["vllm"], "passes_per_step", Range(1, 9, 3, whole=True))
    page = page_template(config_name)
    assert re.search(r"\n  sampling\.top_k +0 \.\. 77 \(0 = off\)\n", page), page
    assert re.search(r"\n  backend\.options\.passes_per_step +1 \.\. 9 \(vllm\)\n", page), page
    assert "sampling.guesses" in page
    fps = re.search(r"\n  output\.fps +1\.0 \.\. 60\.0\n", page)  # terra-generate's output group
    assert bool(fps) == (config_name == "generate")
    assert "== Settings of the groups ==" not in page_template("score_actbench")  # an app without these groups
