"""A normal run raises no warning from the project's own code: the demo (``terra-generate`` on the shipped demo
model, CPU, the Transformers backend) runs with every warning attributed to a ``terra`` module turned into an error,
and its stderr stays empty.

``python -W error::Warning:terra`` would not do: ``-W`` matches the module name whole (``terra`` only, not
``terra.models.modeling_llama_action``), so the filter is set with :func:`warnings.filterwarnings`, whose module
is a regular expression. A library's deprecation warning points, through its ``stacklevel``, at the line of ours
that called it (transformers' renamed ``past_key_values``: terra/models/modeling_llama_action.py), so the filter
catches it; the control run shows it does, with a stand-in for such a library warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {key: value for key, value in os.environ.items() if key != "HYDRA_FULL_ERROR"}  # an error: one line
ENV.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
OWN_WARNINGS_ARE_ERRORS = "import warnings; warnings.filterwarnings('error', module=r'terra(\\.|\\Z)')\n"
RUN_THE_DEMO = "from terra.apps.generate import main; main()\n"
# Transformers' Llama warning the way its deprecated keywords do (transformers/utils/deprecation.py): at the caller.
LLAMA_WARNS = """
import functools, transformers
forward = transformers.LlamaForCausalLM.forward
@functools.wraps(forward)
def warning_forward(*args, **kwargs):
    warnings.warn("`stand_in` is deprecated for LlamaForCausalLM.forward", FutureWarning, stacklevel=2)
    return forward(*args, **kwargs)
transformers.LlamaForCausalLM.forward = warning_forward
"""


def demo(out: Path, prelude: str = "") -> subprocess.CompletedProcess:
    """``terra-generate`` at 2 frames with the project's warnings as errors (``prelude`` runs before it)."""
    code = OWN_WARNINGS_ARE_ERRORS + prelude + RUN_THE_DEMO
    return subprocess.run([sys.executable, "-c", code, "backend=hf", "device=cpu", "num_frames=2",
                           "output.formats=[gif]", f"output.dir={out}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_demo_runs_with_our_warnings_as_errors(tmp_path):
    result = demo(tmp_path / "out")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert (tmp_path / "out" / "rollout.gif").stat().st_size > 0


@pytest.mark.slow
def test_a_library_warning_at_our_call_fails_the_demo(tmp_path):
    result = demo(tmp_path / "out", LLAMA_WARNS)
    assert result.returncode == 1
    last = result.stderr.splitlines()[-1]  # (after Transformers' progress bars: imported before the app hides them)
    assert last.startswith("terra-generate: internal error: FutureWarning: `stand_in` is deprecated"), result.stderr
