"""What every app runs, checked once before torch loads: :class:`RunSpec`, built by :func:`run_spec`; and resume
fingerprints (:func:`fingerprint`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Mapping, Optional, Union

from omegaconf import DictConfig

from terra.config.backend import DTYPES, check_backend, check_num_threads, device_setting, num_threads_setting
from terra.config.checks import MAX_FRAMES, Range, check_choice, check_flag, select
from terra.config.memory import check_memory
from terra.config.schema import group, setting
from terra.config.sampling import SamplingConfig
from terra.config.snapshot import checkpoint_path
from terra.core.device import check_device
from terra.core.errors import TerraInputError
from terra.tokenizer.resize import RESIZE_MODES

DECODERS = ("tokenizer", "refiner")  # how codes become frames: the tokenizer's decoder or Terra's video refiner
REFINER_OUTPUT_KEYS = ("preset", "num_steps", "guidance", "arithmetic")  # shape the refiner's frames
WINDOW_SETTINGS = {"num_context": Range(1, MAX_FRAMES, 3, whole=True),
                   "model.overlap": Range(1, MAX_FRAMES, 3, whole=True)}


@dataclass(frozen=True)
class RunSpec:
    """A run's model pair, engine and generation settings, each checked once (:func:`run_spec`)."""

    world_model: str  # checkpoint folder (exists)
    tokenizer: str  # checkpoint folder (exists)
    backend: str = "auto"  # auto | hf | vllm
    backend_options: dict[str, Any] = field(default_factory=dict)  # checked against the backend's table
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    dtype: str = "auto"
    sampling: SamplingConfig = SamplingConfig()
    num_context: int = 3
    overlap: int = 3  # frames carried into the next window
    zero_embed_code_0: bool = False  # code 0 embeds as zeros
    resize: str = "crop"  # context frames: crop | stretch
    decoder: str = "tokenizer"  # tokenizer | refiner
    refiner: dict[str, Any] = field(default_factory=dict)  # the refiner's settings, for decoder=refiner
    terra_root: str | None = None  # a downloaded Terra snapshot, named in error lines
    num_threads: int | None = None  # torch CPU threads of this process; None: torch's
    memory: str = "full"  # full | auto | 16GiB | 24GiB: the GPU memory a vLLM engine fits to

    def replace(self, **changes: Any) -> "RunSpec":
        """A copy with ``changes`` (already checked values)."""
        return dataclasses.replace(self, **changes)

    def output_settings(self) -> dict[str, Any]:
        """What of this run shapes a world model's outputs from given inputs and seed: its part of every fingerprint."""
        # decoder=refiner under the words of the fingerprints before decoder= (a finished sample stays finished)
        refiner = {"decoding": "refiner", "refiner": {key: self.refiner.get(key) for key in REFINER_OUTPUT_KEYS}}
        return {"num_context": self.num_context, "overlap": self.overlap, "zero_embed_code_0": self.zero_embed_code_0,
                "resize": self.resize, "sampling": self.sampling.draw_settings(),
                **(refiner if self.decoder == "refiner" else {})}


# the parts of what shapes an output, as a rerun names them
INPUT_NAMES = {"world_model": "the world model", "tokenizer": "the tokenizer", "scenario": "the scenario's files",
               "sample": "the sample's files", "clip": "the clip's files", "settings": "the settings"}


def fingerprint(payload: Mapping[str, Any]) -> str:
    """The resume fingerprint of ``payload``: sha256 of its sorted, compact JSON, 32 hex digits."""
    text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def changed_inputs(kept: Any, inputs: Mapping[str, Any]) -> str:
    """What a rerun says of an output whose ``kept`` inputs ``inputs`` no longer match, naming each changed part."""
    if not isinstance(kept, Mapping):
        return "it was made by another version"
    names = [INPUT_NAMES.get(name, name) for name in inputs if kept.get(name) != inputs[name]]
    return f"{' and '.join(names) or 'its inputs'} changed"


def redone_line(reasons: Iterable[str], noun: str) -> str:
    """How many outputs (``noun``) a rerun redoes and why, one line ("" when none)."""
    counts = Counter(reasons)
    return "; ".join(f"{n} {noun}{'s' * (n != 1)} redone: {why}" for why, n in counts.most_common())


@dataclass
class RunConfig:
    """The settings every model-running app shares (checked by :func:`run_spec`), first in its schema."""

    tokenizer: Dict[str, Any] = group()
    sampling: Dict[str, Any] = group()
    model: Dict[str, Any] = group()
    backend: Dict[str, Any] = group()
    terra_root: Optional[str] = setting(None, "a download of turing-motors/Terra (world_model/, "
                                              "lfq_tokenizer_B_256/, ...); see conf/model/terra_v1.yaml")
    device: str = device_setting()
    dtype: str = setting("auto", "auto: bf16 on GPU, fp32 on CPU", choices=DTYPES)
    memory: str = setting("full", "GPU memory the vLLM engine fits to: full (vLLM's defaults) | auto (this card) | "
                                  "16GiB | 24GiB (a card of that size: FP8 KV / weights where needed; docs/memory.md)")
    num_threads: Optional[Union[int, str]] = num_threads_setting()
    num_context: int = setting(3, "context frames; at least 1 and below the world model's window")


def run_spec(cfg: DictConfig) -> RunSpec:
    """Check the shared settings of a Hydra run config once; checkpoint folders must exist."""
    window = {key: limits.check(select(cfg, key), key) for key, limits in WINDOW_SETTINGS.items()}
    decoder = check_decoder_name(cfg.get("decoder", "tokenizer"))
    backend, options = check_backend(select(cfg, "backend.name"), select(cfg, "backend.options"))
    refiner = select(cfg, "refiner") if decoder == "refiner" and "refiner" in cfg else {}
    return RunSpec(
        world_model=checkpoint_path(cfg, "model", "world_model"),
        tokenizer=checkpoint_path(cfg, "tokenizer", "path"),
        backend=backend,
        backend_options=options,
        device=check_device(select(cfg, "device")),
        dtype=check_choice(select(cfg, "dtype"), "dtype", DTYPES),
        sampling=SamplingConfig.from_mapping(select(cfg, "sampling")),
        num_context=window["num_context"],
        overlap=window["model.overlap"],
        zero_embed_code_0=check_flag(cfg.model.get("zero_embed_code_0", False), "model.zero_embed_code_0"),
        resize=check_choice(cfg.tokenizer.get("resize", "crop"), "tokenizer.resize", RESIZE_MODES),
        decoder=decoder,
        refiner=dict(refiner or {}),
        terra_root=None if cfg.get("terra_root") is None else str(cfg.terra_root),
        num_threads=check_num_threads(cfg.get("num_threads")),
        memory=check_memory(cfg.get("memory", "full")),
    )


def check_decoder_name(decoder: Any) -> str:
    if decoder not in DECODERS:
        raise TerraInputError(f"decoder={decoder!r} is unknown; use decoder=tokenizer (the tokenizer's frames) "
                              "or decoder=refiner (Terra's video refiner, GPU)")
    return decoder

