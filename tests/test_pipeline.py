"""WorldModelPipeline's tokenizer side: calls from several threads (batch writers, sessions, the server) run one
at a time, so the tokenizer's activations stay one batch beside an engine that holds most of the GPU; the
pretrained builder's one-line errors; every Ray actor's set-up (``actor_spec``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import imageio.v3 as iio
import numpy as np
import pytest
import torch

from terra.generation.backends import create_backend
from terra.models.presets import TINY_TOKENIZER
from terra.config.spec import RunSpec
from terra.core.device import usable_cores
from terra.core.errors import TerraInputError
from terra.pipeline import WorldModelPipeline, actor_spec
from terra.tokenizer import LFQTokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_concurrent_encode_and_decode_never_overlap_in_the_tokenizer(tiny_model_dir, single_thread) -> None:
    torch.manual_seed(0)
    tokenizer = LFQTokenizer(TINY_TOKENIZER)
    pipeline = WorldModelPipeline(tokenizer, create_backend("hf", tiny_model_dir, device="cpu"),
                                  tokenizer_batch_size=2)
    inside, most = 0, 0
    guard = threading.Lock()

    def counted(method):
        def call(*args, **kwargs):
            nonlocal inside, most
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)  # long enough for other threads to try to enter
            try:
                return method(*args, **kwargs)
            finally:
                with guard:
                    inside -= 1
        return call

    tokenizer.decode = counted(tokenizer.decode)
    tokenizer.encode = counted(tokenizer.encode)
    images = torch.rand(4, 3, *pipeline.image_size) * 2 - 1
    codes = pipeline.encode(images)
    with ThreadPoolExecutor(6) as pool:
        decoded = list(pool.map(lambda _: pipeline.decode(codes), range(6)))
        encoded = list(pool.map(lambda _: pipeline.encode(images), range(6)))
    assert most == 1
    assert all(np.array_equal(frames, decoded[0]) for frames in decoded)
    assert all(np.array_equal(c, codes) for c in encoded)
    assert decoded[0].shape == (4, *pipeline.image_size, 3)


def test_the_readme_python_snippet_runs_as_pasted_from_any_folder(tmp_path) -> None:
    """README's "From Python" block, run from a folder outside the repository (two frames instead of 16)."""
    snippet = re.search(r"## From Python\n\n```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    assert snippet.count("16") == 2  # the only two places that say how many frames
    code = snippet.replace("len(codes) + 16", "len(codes) + 2").replace("num_frames=16", "num_frames=2")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "(5, 144, 256, 3)"  # 3 context + 2 generated frames at the demo's size
    assert iio.imread(tmp_path / "rollout.mp4", index=None).shape == (5, 144, 256, 3)


@pytest.mark.parametrize("world_model, tokenizer, message", [
    ("turing-motors/Terra", None, "it looks like a Hugging Face repo id: download it first, e.g. `hf download "
                                  "turing-motors/Terra --local-dir Terra`, and pass the world model's folder "
                                  "(Terra: Terra/world_model)"),
    ("no/such/folder", None, "is not a folder here; from_pretrained takes 'demo' (the shipped demo model) or a local "
                             "checkpoint folder, and downloads nothing: pass a checkpoint folder"),
    ("WORLD", None, "needs the tokenizer the world model was trained with: tokenizer=its folder"),
])
def test_from_pretrained_says_what_it_takes_in_one_line(tiny_model_dir, world_model, tokenizer, message) -> None:
    from terra.core.errors import TerraInputError

    world_model = str(tiny_model_dir) if world_model == "WORLD" else world_model
    with pytest.raises(TerraInputError) as err:
        WorldModelPipeline.from_pretrained(world_model, tokenizer, device="cpu")
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("device, gpus, expected", [
    ("auto", ["0"], "cuda"), ("cpu", ["3", "4"], "cuda"), ("auto", [], "cpu"), ("cpu", [], "cpu"),
    ("cuda:1", [], "cuda:1"),
])
def test_a_ray_actor_runs_on_the_gpus_ray_gave_it(device, gpus, expected) -> None:
    """An actor with GPUs runs on them (Ray sets CUDA_VISIBLE_DEVICES: ``cuda``); one without never takes a GPU
    for ``auto``; its backend is chosen for that device (``auto`` on a CPU: Transformers)."""
    from terra.config.backend import vllm_available

    spec = actor_spec(RunSpec("wm", "tok", device=device), gpus)
    assert spec.device == expected
    assert spec.backend == ("vllm" if expected.startswith("cuda") and vllm_available() else "hf")


def test_a_vllm_actor_checks_the_plugin_and_keeps_a_multi_gpu_engine_on_its_gpus(monkeypatch) -> None:
    """backend=vllm finds the world model only through the project's entry point, which a runtime_env
    working_dir does not install: the actor says so in one line instead of failing inside vLLM. A tensor-parallel
    engine starts its workers as processes on the actor's GPUs (``mp``) unless told otherwise; one GPU: as set."""
    import importlib.metadata

    pytest.importorskip("vllm")
    tp = {"tensor_parallel_size": 2}
    assert actor_spec(RunSpec("wm", "tok", backend="vllm", backend_options=tp), ["0", "1"]).backend_options == {
        **tp, "distributed_executor_backend": "mp"}
    given = {**tp, "distributed_executor_backend": "ray"}
    assert actor_spec(RunSpec("wm", "tok", backend="vllm", backend_options=given), ["0", "1"]).backend_options == given
    assert actor_spec(RunSpec("wm", "tok", backend="vllm"), ["0"]).backend_options == {}
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [])
    with pytest.raises(TerraInputError, match=r"backend=vllm needs the project installed on this node") as err:
        actor_spec(RunSpec("wm", "tok", backend="vllm"), ["0"])
    assert "\n" not in str(err.value)
    assert actor_spec(RunSpec("wm", "tok", backend="hf"), ["0"]).backend == "hf"  # no plugin needed


@pytest.mark.parametrize("given", ["default", 1, None])
def test_from_pretrained_sets_threads_as_terra_generate_does(monkeypatch, given) -> None:
    """The Python API and the CLI share one thread rule: ``from_pretrained``'s default is terra-generate's
    ``num_threads``, and the spec it runs sets torch's threads to what the CLI's spec sets."""
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR
    from terra.config.spec import run_spec

    setting = {"default": [], 1: ["num_threads=1"], None: ["num_threads=null"]}[given]
    overrides = ["backend=hf", "device=cpu", *setting]
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cli_threads = run_spec(compose("generate", overrides=overrides)).num_threads
    runs = []
    monkeypatch.setattr(WorldModelPipeline, "from_run", classmethod(lambda cls, run, tokenizer=None: runs.append(run)))
    before, untouched = torch.get_num_threads(), (cli_threads or 1) + 2  # a count neither setting chooses
    torch.set_num_threads(untouched)
    try:
        kwargs = {} if given == "default" else {"num_threads": given}
        WorldModelPipeline.from_pretrained("demo", backend="hf", device="cpu", **kwargs)
        applied = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    [run] = runs
    assert run.spec.num_threads == cli_threads
    assert applied == (untouched if cli_threads is None else cli_threads)
    if given == "default":  # the CLI's default decides a number here (auto), unlike torch's one per core
        assert cli_threads == max(1, usable_cores() // 2)


@pytest.mark.parametrize("backend, told", [("vllm", True), ("hf", False)])
def test_a_vllm_engine_start_is_said_to_be_the_slow_part_before_it(tiny_model_dir, monkeypatch, capsys, backend,
                                                                   told) -> None:
    """vLLM's engine took minutes to start on a CPU with no word of it; the line comes before the engine starts."""
    import terra.pipeline
    from terra.models.checkpoint import read_world_model_config
    from terra.config.memory import tokenizer_pixels
    from terra.contract.layout import TokenLayout
    from terra.run import ResolvedRun

    said = []

    def create(*args, **kwargs):  # the engine's start: what was printed by then
        said.append(capsys.readouterr().out)
        raise KeyboardInterrupt

    monkeypatch.setattr(terra.pipeline, "build_backend", create)
    model = read_world_model_config(tiny_model_dir)
    run = ResolvedRun(RunSpec(tiny_model_dir, "", backend=backend, device="cpu"), model, "float32", "per_frame",
                      TokenLayout.from_config(model), tokenizer_pixels(), refiner_device=None, engine_options={},
                      passes_per_step=None, refiner=None)
    with pytest.raises(KeyboardInterrupt):
        WorldModelPipeline.from_run(run, LFQTokenizer(TINY_TOKENIZER))
    expected = ["terra: starting vLLM's engine, the slow part of the start (1-5 min on a CPU) ...\n"] if told else [""]
    assert said == expected  # under pytest stdout is no terminal: the line goes there, as in a log
