"""Shared inputs of the scoring tests: a tiny estimator (the published architecture with a 32x32 input and a small
transformer), a handful of small synthetic MP4s named as ``output.naming=actbench`` writes them and ACT-Bench rows
for them, made once per session with the helpers of ``scripts/bench/benchmark_scoring.py``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.conftest import load_script

ROOT = Path(__file__).resolve().parents[2]
APP = "terra.apps.score"  # terra-score
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ENV.pop("HYDRA_FULL_ERROR", None)
FRAMES, HEIGHT, WIDTH = 46, 48, 80  # 2 context + 44 scored frames, small
SAMPLE_IDS = [3, 7, 12, 20, 31, 45, 46, 58, 60]  # one per class (the benchmark's label cycle)


@pytest.fixture(scope="session")
def bench():
    """``scripts/bench/benchmark_scoring.py`` as a module (its input writers and presets)."""
    return load_script("bench/benchmark_scoring")


@pytest.fixture(scope="session")
def inputs(bench, tmp_path_factory) -> SimpleNamespace:
    """Estimator folder, videos folder (one video per scored sample, plus one of no sample) and samples file
    (plus one row of a class ACT-Bench leaves out, which has no video)."""
    root = tmp_path_factory.mktemp("scoring")
    estimator = bench.write_estimator(root / "estimator", bench.PRESETS["tiny"])
    videos = root / "videos"
    bench.write_videos(videos, SAMPLE_IDS + [999], FRAMES, HEIGHT, WIDTH, distinct=3)
    samples = bench.write_samples(root / "act_bench.jsonl", SAMPLE_IDS, FRAMES)
    with samples.open("a") as fh:
        fh.write(json.dumps({"sample_id": 500, "label": "shifting_to_left/lane", "context_frames": [],
                             "instruction_trajs": []}) + "\n")
    return SimpleNamespace(root=root, estimator=estimator, videos=videos, samples=samples)


def copy_inputs(inputs: SimpleNamespace, where: Path) -> SimpleNamespace:
    """A copy of ``inputs`` to spoil: videos hard-linked, the samples file and the estimator's config copied, its
    weights linked (replace a file rather than writing into it)."""
    copy = SimpleNamespace(root=where, videos=where / "videos", estimator=where / "estimator",
                           samples=where / "act_bench.jsonl")
    shutil.copytree(inputs.videos, copy.videos, copy_function=os.link)
    shutil.copytree(inputs.estimator, copy.estimator, copy_function=os.link)
    (copy.estimator / "config.json").unlink()
    shutil.copy(inputs.estimator / "config.json", copy.estimator / "config.json")
    shutil.copy(inputs.samples, copy.samples)
    return copy


def run_score(inputs: SimpleNamespace, output_dir: Path, *overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    """``terra-score`` on ``inputs`` in a process of its own (CPU, decoding in this process)."""
    args = [f"videos={inputs.videos}", f"samples={inputs.samples}", f"estimator={inputs.estimator}",
            f"output_dir={output_dir}", "device=cpu", "num_workers=0", "num_threads=1", *overrides]
    return subprocess.run([sys.executable, "-m", APP, *args], cwd=cwd, env=ENV, capture_output=True, text=True,
                          timeout=300)
