"""A batch run's settings, checked once (without torch) into a frozen :class:`BatchSpec`."""

from __future__ import annotations

import dataclasses
import os
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from terra.config.actbench import MAX_SAMPLES_BYTES, VIDEO_STEM
from terra.config.assets import demo_checkpoints
from terra.config.backend import DEFAULT_THREADS
from terra.config.checks import Range, plain, select, shown
from terra.config.files import open_input_file
from terra.config.manifest import manifest_name, summary_name
from terra.config.output_dir import OutputDir, claim_output_dir
from terra.config.outputs import FORMATS, check_output_formats
from terra.config.ray_settings import EXECUTORS, RayBlock, RaySettings, check_executor
from terra.config.schema import flag, group, schema_settings, setting
from terra.config.spec import RunConfig, RunSpec, check_decoder_name, run_spec
from terra.core.errors import TerraInputError
from terra.decoder.writers import MAX_FPS, MIN_FPS
from terra.inputs.samples import SAMPLE_SETTINGS
from terra.inputs.trajectory import MANOEUVRES

APP = "terra-rollout"
NAMING = {
    "default": ("{sample_id}.{ext}", "{sample_id}.json"),
    "actbench": (f"{VIDEO_STEM}.{{ext}}", f"{VIDEO_STEM}.json"),
}
PATTERN_FIELDS = {"sample_id", "ext", "line", "label"}


def _concurrency(value: Any) -> int | str:
    return value if value == "auto" else Range(1, 4096, "auto", whole=True).check(value, "max_concurrent")


@dataclass
class OutputBlock:
    dir: Optional[str] = setting(None, "null = outputs/rollouts/<samples file stem>; keep it fixed to resume a run")
    naming: str = setting("default", "default: {sample_id}.{ext} + {sample_id}.json; actbench: "
                                     "NUSCENES_ACTION_{sample_id:06d}.mp4 (+ .json), as ACT-Bench's scorer reads",
                          choices=tuple(NAMING))
    video_pattern: Optional[str] = setting(None, "overrides the preset; fields {sample_id} {ext} {line} {label}")
    sidecar_pattern: Optional[str] = setting(None, "overrides the preset; must end with .json")
    formats: Any = setting(["mp4"], f"any of {', '.join(FORMATS)} (png: a folder <stem>_frames/)")
    fps: float = setting(10.0, "", Range(MIN_FPS, MAX_FPS, 10))
    writer_threads: int = setting(4, "threads decoding and writing finished samples while the engine runs",
                                  Range(1, 64, 4, whole=True))
    mark_context: Any = flag(False, "border + label on context frames (keep off for ACT-Bench scoring)")
    overlay_trajectory: Any = flag(None, "inset of the commanded path and the route told (magenta); null: on, but off "
                                         "with naming=actbench (ACT-Bench's scorer reads the frames)")
    save_codes: Any = flag(False, "also write <sidecar stem>.codes.npy: every frame's codes (int32)")
    manifest: str = setting("manifest.jsonl", "per-sample records (manifest.shard-<i>-of-<n>.jsonl when sharded)")


@dataclass
class RolloutConfig(RunConfig):
    """terra-rollout's settings."""

    refiner: Dict[str, Any] = group()
    samples: Any = setting(None, "JSONL file (or a list of files); lines are numbered over all of them")
    image_root: Optional[str] = setting(None, "relative image paths resolve against it; null = the JSONL's folder")
    allow_paths_outside_image_root: Any = flag(False, "true: context paths may be absolute or ../ outside image_root "
                                                      "(false: such a sample fails alone, so a JSONL from elsewhere "
                                                      "cannot read other files)")
    num_context: int = setting(3, "context frames used: the last ones of each sample's context; at least 1 and "
                                  "below the world model's window")
    num_frames: int = setting(16, "frames generated after the context (a sample's \"num_frames\" overrides it)",
                              SAMPLE_SETTINGS["num_frames"])
    default_manoeuvre: Optional[str] = setting(None, f"for Terra-format samples without a trajectory: "
                                                     f"{' | '.join(MANOEUVRES)}")
    seed: int = setting(0, "the sample on input line i (0-based) uses seed + i unless it sets \"seed\"",
                        SAMPLE_SETTINGS["seed"])
    decoder: str = setting("tokenizer", "how codes become frames: tokenizer (its decoder, at the tokenizer's image "
                                        "size: 144x256 for the demo's) | refiner (Terra's video refiner, 384x640, GPU; "
                                        "in-process with vLLM: lower backend.options.gpu_memory_utilization, e.g. "
                                        "0.5)", check=check_decoder_name)
    max_concurrent: Any = setting("auto", "rollouts in flight per engine; a finished one's slot goes to the next "
                                          "sample at once. auto: on vLLM what the KV cache holds for the run's window "
                                          "(up to 512 on a GPU; 64 on a CPU); on Transformers 1 where it decodes "
                                          "speculatively (decoding=auto on a CPU), else 64. On vLLM it also sets "
                                          "backend.options.max_num_seqs. backend.options.kv_cache_dtype=fp8 halves "
                                          "the KV cache per rollout: twice the rollouts fit; auto or 1 .. 4096",
                                  check=_concurrency)
    resume: Any = flag(True, "skip samples whose outputs are complete; false = regenerate everything")
    shard_index: int = setting(0, "this machine's shard: input lines with index % num_shards == shard_index",
                               Range(0, (1 << 20) - 1, 0, whole=True))
    num_shards: int = setting(1, "", Range(1, 1 << 20, 4, whole=True))
    executor: str = setting("local", "local: one engine in this process (Ray is not imported); ray: one engine per "
                                     "GPU (or per backend.options.tensor_parallel_size GPUs) as Ray actors on the "
                                     "cluster at ray.address; samples stream to them, dead actors restart",
                            choices=EXECUTORS)
    ray: RayBlock = setting(RayBlock(), "")
    progress: Any = flag(True, "bars on a terminal: frames generated (frames/s, ETA), samples written; in a log lines")
    output: OutputBlock = setting(OutputBlock(), "")


# BatchConfig's own settings whose key in RolloutConfig differs
KEYS = {"output_dir": "output.dir",
        **{f.name: f"output.{f.name}" for f in dataclasses.fields(OutputBlock) if f.name != "dir"}}
# BatchConfig's settings that are the batch's own (the rest are the model's and engine's: BatchConfig.run_config)
BATCH_SETTINGS = ("samples", "output_dir", "num_frames", "seed", "image_root", "allow_paths_outside_image_root",
                  "default_manoeuvre", "max_concurrent", "resume", "shard_index", "num_shards", "executor", "ray",
                  "naming", "video_pattern", "sidecar_pattern", "formats", "fps", "writer_threads", "mark_context",
                  "overlay_trajectory", "save_codes", "manifest", "progress")


@dataclass(frozen=True)
class BatchSpec:
    """A batch run's checked settings: the model and engine as :attr:`run`, the batch's own beside it."""

    run: RunSpec  # checkpoints, backend, device, sampling, window, decoder, threads
    sample_files: tuple[Path, ...]  # the JSONL file(s), in reading order
    output_dir: str
    num_frames: int
    seed: int
    image_root: str | None
    allow_paths_outside_image_root: bool
    default_manoeuvre: str | None
    max_concurrent: int | str  # or "auto"
    resume: bool
    shard_index: int
    num_shards: int
    executor: str
    ray: RaySettings
    naming: str
    patterns: tuple[str, str]  # (video pattern, sidecar pattern): the naming preset unless overridden
    formats: tuple[str, ...]
    fps: float
    writer_threads: int
    mark_context: bool
    overlay_trajectory: bool
    save_codes: bool
    manifest: str
    progress: bool
    record: dict  # the run's configuration as the sidecars store it

    @property
    def manifest_path(self) -> Path:
        """``output_dir/manifest.jsonl``, or its shard's."""
        return Path(self.output_dir) / manifest_name(self.manifest, self.shard_index, self.num_shards)

    @property
    def summary_path(self) -> Path:
        """``manifest.jsonl`` → ``manifest.summary.json`` (per shard like the manifest)."""
        return self.manifest_path.with_name(summary_name(self.manifest_path.name))

    def generation_settings(self) -> dict:
        """The settings that shape a sample's outputs (part of its fingerprint)."""
        return {**self.run.output_settings(), "formats": sorted(self.formats), "fps": float(self.fps),
                "mark_context": self.mark_context, "overlay_trajectory": self.overlay_trajectory,
                "save_codes": self.save_codes, "default_manoeuvre": self.default_manoeuvre}


@dataclass(frozen=True)
class BatchConfig:
    """The Python API's keywords for a batch run (terra-rollout's settings, named flat); :meth:`spec` checks them."""

    samples: str | Sequence[str]  # JSONL file(s); lines are numbered over all files in order
    output_dir: str
    world_model: str = ""  # default: the shipped demo model
    tokenizer: str = ""  # default: the shipped demo tokenizer
    backend: str = "auto"  # auto | vllm | hf
    backend_options: dict = field(default_factory=dict)  # e.g. max_num_seqs, tensor_parallel_size, max_batch_size
    device: str = RolloutConfig.device
    dtype: str = RolloutConfig.dtype
    sampling: dict = field(default_factory=dict)  # temperature, top_k, top_p (terra.generation.sampling.SamplingConfig)
    num_frames: int = RolloutConfig.num_frames
    num_context: int = RolloutConfig.num_context
    overlap: int = 3  # frames carried into the next window for rollouts longer than one window
    zero_embed_code_0: bool = False  # code 0 embeds as zeros
    resize: str = "crop"  # context frames: crop (cover + center-crop) | stretch
    seed: int = RolloutConfig.seed
    image_root: str | None = None  # relative image paths resolve against it; None = the JSONL's folder
    allow_paths_outside_image_root: bool = False  # absolute or ../ context paths may leave image_root
    default_manoeuvre: str | None = None  # for samples of Terra's format that give no trajectory
    max_concurrent: int | str = RolloutConfig.max_concurrent
    resume: bool = RolloutConfig.resume
    shard_index: int = RolloutConfig.shard_index
    num_shards: int = RolloutConfig.num_shards
    executor: str = RolloutConfig.executor
    ray: dict = field(default_factory=dict)  # executor=ray's settings
    num_threads: int | str | None = DEFAULT_THREADS  # torch CPU threads: auto, N or None
    memory: str = RolloutConfig.memory
    naming: str = OutputBlock.naming
    video_pattern: str | None = None  # overrides the naming preset
    sidecar_pattern: str | None = None
    formats: Sequence[str] = ("mp4",)
    fps: float = OutputBlock.fps
    writer_threads: int = OutputBlock.writer_threads
    decoder: str = RolloutConfig.decoder
    refiner: dict = field(default_factory=dict)  # the refiner's settings (decoder=refiner)
    mark_context: bool = OutputBlock.mark_context
    overlay_trajectory: bool = False  # draw the commanded path
    save_codes: bool = OutputBlock.save_codes
    manifest: str = OutputBlock.manifest
    progress: bool = RolloutConfig.progress
    record: dict | None = None  # run configuration stored in every sidecar (default: this config)
    terra_root: str | None = None  # a downloaded Terra snapshot the checkpoints come from, named in error lines

    def __post_init__(self) -> None:
        for name, demo in zip(("world_model", "tokenizer"), demo_checkpoints()):
            if not getattr(self, name):
                object.__setattr__(self, name, str(demo))

    def run_config(self) -> dict:
        """The model and engine settings in the rollout config's shape."""
        return {"model": {"world_model": self.world_model, "overlap": self.overlap,
                          "zero_embed_code_0": self.zero_embed_code_0},
                "tokenizer": {"path": self.tokenizer, "resize": self.resize},
                "backend": {"name": self.backend, "options": self.backend_options},
                "device": self.device, "dtype": self.dtype, "sampling": self.sampling,
                "num_context": self.num_context, "decoder": self.decoder, "refiner": self.refiner,
                "terra_root": self.terra_root, "num_threads": self.num_threads, "memory": self.memory}

    def spec(self) -> BatchSpec:
        """Every setting checked once; user errors raise :class:`TerraInputError`."""
        run = run_spec(OmegaConf.create(_escaped(self.run_config())))
        own = {name: getattr(self, name) for name in BATCH_SETTINGS}
        return _batch_spec(run, own, self.record if self.record is not None else dataclasses.asdict(self))


def batch_spec(cfg: DictConfig, progress: bool = True) -> BatchSpec:
    """A Hydra rollout config -> :class:`BatchSpec`, every setting checked once."""
    samples = plain(cfg.samples)
    if samples is None or samples == "":
        raise TerraInputError("no samples file given; pass samples=path/to/samples.jsonl")
    first = samples if isinstance(samples, str) else samples[0]
    own = {name: select(cfg, KEYS.get(name, name)) for name in BATCH_SETTINGS}
    own.update(samples=samples, output_dir=str(cfg.output.dir or Path("outputs") / "rollouts" / Path(first).stem),
               image_root=None if cfg.image_root is None else str(cfg.image_root), ray=own["ray"] or {})
    spec = _batch_spec(run_spec(cfg), own, plain(cfg))
    return spec if progress else dataclasses.replace(spec, progress=False)


def _escaped(value: Any) -> Any:
    """``value`` with every ``${`` in its strings escaped, so OmegaConf does not interpolate paths."""
    if isinstance(value, str):
        return value.replace("${", "\\${")
    if isinstance(value, dict):
        return {key: _escaped(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_escaped(item) for item in value]
    return value


def check_config(config: BatchConfig) -> tuple[BatchSpec, OutputDir]:
    """:meth:`BatchConfig.spec` and the output folder it names, claimed (:func:`claim_output`)."""
    spec = config.spec()
    return spec, claim_output(spec)


def claim_output(spec: BatchSpec) -> OutputDir:
    """Claim the run's output folder against its inputs, before any work."""
    refiner = spec.run.refiner.get("path") if spec.run.decoder == "refiner" else None
    # each sample's own files are checked where they are known (plan_batch)
    return claim_output_dir(spec.output_dir, "output.dir", files=[spec.manifest_path.name, spec.summary_path.name],
                            inputs=[("samples file", spec.sample_files), ("world model", spec.run.world_model),
                                    ("tokenizer", spec.run.tokenizer), ("refiner weights", refiner)], app=APP)


def _batch_spec(run: RunSpec, own: dict[str, Any], record: dict) -> BatchSpec:
    """The batch's own settings (``own``, by name) checked beside the checked ``run``."""
    items = schema_settings(RolloutConfig)
    own = {name: items[KEYS.get(name, name)].check(value) if KEYS.get(name, name) in items else value
           for name, value in own.items()}
    if own["overlay_trajectory"] is None:
        own = {**own, "overlay_trajectory": own["naming"] != "actbench"}
    if own["shard_index"] >= own["num_shards"]:
        raise TerraInputError(f"shard_index={own['shard_index']} must be below num_shards={own['num_shards']} "
                              f"(shards are numbered 0..{own['num_shards'] - 1})")
    check_executor(own["executor"])
    ray = RaySettings.parse(own["ray"])
    naming = own["naming"]
    video, sidecar = own["video_pattern"] or NAMING[naming][0], own["sidecar_pattern"] or NAMING[naming][1]
    _check_pattern(video, "output.video_pattern", needs_ext=True)
    _check_pattern(sidecar, "output.sidecar_pattern", needs_ext=False)
    if not sidecar.endswith(".json"):
        raise TerraInputError(f"output.sidecar_pattern {sidecar!r} must end with .json")
    manifest = own["manifest"]
    if (not isinstance(manifest, str) or not manifest.endswith(".jsonl") or manifest.startswith(".")
            or any(c in manifest for c in "/\\\0")):
        raise TerraInputError(f"output.manifest {shown(manifest)} must be a file name ending in .jsonl")
    if own["default_manoeuvre"] is not None and own["default_manoeuvre"] not in MANOEUVRES:
        raise TerraInputError(f"unknown default_manoeuvre {own['default_manoeuvre']!r}; "
                              f"choose one of: {', '.join(MANOEUVRES)}")
    samples = own["samples"]
    if not (isinstance(samples, (str, os.PathLike)) and str(samples)) and not (
            isinstance(samples, Sequence) and samples and all(isinstance(f, (str, os.PathLike)) for f in samples)):
        raise TerraInputError(f"samples must be a JSONL file or a list of them (got {shown(samples)})")
    files = tuple(Path(f).expanduser() for f in ([samples] if isinstance(samples, (str, os.PathLike)) else samples))
    for file in files:
        open_input_file(file, "samples file", MAX_SAMPLES_BYTES).close()  # regular, readable, bounded
    image_root = own["image_root"]
    if image_root is not None and not (isinstance(image_root, (str, os.PathLike))
                                       and Path(image_root).expanduser().is_dir()):
        raise TerraInputError(f"image_root {shown(image_root)} is not a folder; point it at the images' root")
    replaced = ("samples", "ray", "video_pattern", "sidecar_pattern", "formats")
    kept = {name: own[name] for name in BATCH_SETTINGS if name not in replaced}
    return BatchSpec(run=run, sample_files=files, ray=ray, patterns=(video, sidecar), record=record,
                     formats=tuple(check_output_formats(own["formats"], distinct=True)), **kept)


def _check_pattern(pattern: Any, name: str, needs_ext: bool) -> None:
    """Raise unless ``pattern`` is a file name pattern of known fields, with ``{sample_id}``, inside output.dir."""
    if not isinstance(pattern, str) or not pattern:
        raise TerraInputError(f"{name} must be a file name pattern such as '{{sample_id}}.{{ext}}' (got {pattern!r})")
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None}
    except ValueError as err:
        raise TerraInputError(f"{name} {pattern!r} is not a valid pattern ({err})") from None
    unknown = fields - PATTERN_FIELDS
    if unknown:
        raise TerraInputError(f"{name} {pattern!r} uses unknown fields {sorted(unknown)}; "
                              f"available: {sorted(PATTERN_FIELDS)}")
    if "sample_id" not in fields:
        raise TerraInputError(f"{name} {pattern!r} must contain {{sample_id}} so that samples get distinct files")
    if needs_ext and "ext" not in fields:
        raise TerraInputError(f"{name} {pattern!r} must contain {{ext}} (e.g. '{{sample_id}}.{{ext}}')")
    if pattern.startswith("/") or ".." in Path(pattern).parts:
        raise TerraInputError(f"{name} {pattern!r} must stay inside output.dir (no leading / or ..)")
