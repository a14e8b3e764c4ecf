"""``terra-generate``: context frames + a trajectory → generated driving video (Hydra app, ``conf/generate.yaml``).

Inputs are checked before any model loads where possible; every user mistake ends with exit code 2, one line
on stderr naming the input and the fix, and no output files left behind.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from terra.actions import actions_for_manoeuvre, load_actions
from terra.generation.backends import create_backend, resolve_device
from terra.errors import TerraInputError, check_whole_number
from terra.pipeline import WorldModelPipeline, check_compatible, read_world_model_config
from terra.generation.rollout import RolloutRequest
from terra.generation.sampling import SamplingConfig
from terra.trajectory import MANOEUVRES, check_manoeuvre_params

ASSETS = Path(__file__).resolve().parent / "assets"
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

OmegaConf.register_new_resolver("terra_asset", lambda name: str(ASSETS / name), replace=True)


def builtin_context(manoeuvre: str, num_frames: int, image_size: tuple[int, int], seed: int, params: dict):
    """Frames rendered by the synthetic world driving ``manoeuvre``, with their actions (exact ground truth)."""
    from terra.sim import Scene, make_clip

    clip = make_clip(Scene.generate(seed), manoeuvre, num_frames, image_size[0], image_size[1], **params)
    images = torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return images, clip.actions


def load_context(source, num_context: int, image_size: tuple[int, int]) -> torch.Tensor:
    """The last ``num_context`` frames of a folder, glob, list of images or video, resized to the model."""
    from tokenizer.images import load_images

    sources = list(source) if OmegaConf.is_list(source) else str(source)
    return load_images(sources, image_size, last_n=num_context)


def _whole_number(cfg: DictConfig, key: str, minimum: int, example: int) -> int:
    """``cfg[key]`` (a dotted key) checked to be an integer of at least ``minimum``."""
    return check_whole_number(OmegaConf.select(cfg, key, throw_on_missing=True), key, minimum, f"{key}={example}")


def _required_path(group: DictConfig, key: str, name: str) -> str:
    """A path setting that a config group (``model=terra_v1``, ...) leaves to the user (``???``)."""
    if OmegaConf.is_missing(group, key):
        raise TerraInputError(
            f"{name}={group.get('name', '?')} needs a checkpoint folder; add {name}.{key}=/path/to/it"
        )
    return str(group[key])


def check_config(cfg: DictConfig) -> tuple[SamplingConfig, dict]:
    """Check every setting that needs no file or model (fails fast, before anything is loaded or written)."""
    from terra.outputs import check_output

    check_output(cfg.output)
    num_frames = _whole_number(cfg, "num_frames", 1, 16)
    max_frames = _whole_number(cfg, "max_num_frames", 1, 1000)
    if num_frames > max_frames:
        raise TerraInputError(
            f"num_frames={num_frames} is more than max_num_frames={max_frames}; generate fewer frames "
            f"or raise the cap, e.g. max_num_frames={num_frames}"
        )
    _whole_number(cfg, "num_samples", 1, 4)
    _whole_number(cfg, "num_context", 1, 3)
    if _whole_number(cfg, "seed", 0, 0) >= 2**62:
        raise TerraInputError(f"seed must be smaller than 2**62 (got {cfg.seed}); e.g. seed=0")
    _whole_number(cfg, "model.overlap", 1, 3)
    raw = cfg.manoeuvre_params
    params = check_manoeuvre_params(OmegaConf.to_container(raw) if OmegaConf.is_config(raw) else raw)
    if cfg.trajectory is None and cfg.manoeuvre not in MANOEUVRES:
        raise TerraInputError(f"unknown manoeuvre {cfg.manoeuvre!r}; choose one of: {', '.join(MANOEUVRES)}")
    options = OmegaConf.to_container(cfg.sampling) if OmegaConf.is_dict(cfg.sampling) else {}
    unknown = sorted(set(options) - {f.name for f in dataclasses.fields(SamplingConfig)})
    if unknown or not OmegaConf.is_dict(cfg.sampling):
        raise TerraInputError(f"sampling settings {unknown or cfg.sampling} are unknown; use temperature, top_k, top_p")
    return SamplingConfig(**options), params


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Generate the rollouts of one configuration and write them under ``out_dir``; return the summary."""
    from terra.outputs import prepare_output_dir, write_outputs

    t_start = time.perf_counter()
    sampling, params = check_config(cfg)
    world_model_path = _required_path(cfg.model, "world_model", "model")
    tokenizer_path = _required_path(cfg.tokenizer, "path", "tokenizer")
    world_model_config = read_world_model_config(world_model_path)
    window = world_model_config.get("num_temporal_embeddings", 25)
    if cfg.num_context >= window:
        raise TerraInputError(f"num_context={cfg.num_context} does not fit a window of {window} frames; use at most {window - 1}")
    if cfg.model.overlap >= window:
        raise TerraInputError(f"model.overlap={cfg.model.overlap} does not fit a window of {window} frames; "
                              f"use at most {window - 1} (Terra: 3)")
    device = resolve_device(str(cfg.device))
    prepare_output_dir(out_dir)

    from tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    check_compatible(world_model_config, tokenizer)
    image_size = tuple(tokenizer.image_size)
    total = cfg.num_context + cfg.num_frames
    if cfg.context is None:
        images, actions = builtin_context(cfg.manoeuvre if cfg.trajectory is None else "straight", total,
                                          image_size, cfg.seed, params if cfg.trajectory is None else {})
        ground_truth, images = images[cfg.num_context :], images[: cfg.num_context]
    else:
        images, ground_truth = load_context(cfg.context, cfg.num_context, image_size), None
        actions = None
    num_context = len(images)
    if cfg.trajectory is not None:
        actions = load_actions(cfg.trajectory, num_frames=num_context + cfg.num_frames - 1)
    elif actions is None:
        actions = actions_for_manoeuvre(cfg.manoeuvre, num_context + cfg.num_frames, **params)

    backend = create_backend(str(cfg.backend.name), world_model_path, device=device, dtype=str(cfg.dtype),
                             **OmegaConf.to_container(cfg.backend.options))
    pipeline = WorldModelPipeline(tokenizer, backend, device)
    try:
        context_codes = pipeline.encode(images)
        requests = [
            RolloutRequest(context_codes, actions, cfg.num_frames, seed=cfg.seed + i, overlap=cfg.model.overlap)
            for i in range(cfg.num_samples)
        ]
        t_gen = time.perf_counter()
        results = pipeline.generate(requests, sampling)
        generate_s = time.perf_counter() - t_gen
    finally:
        pipeline.close()
    files = write_outputs(
        out_dir, cfg.output, results, actions=actions,
        ground_truth=None if ground_truth is None else ((ground_truth.permute(0, 2, 3, 1) + 1) * 127.5).round().byte().numpy(),
        config=OmegaConf.to_container(cfg, resolve=True),
        timings={"generate_s": generate_s, "total_s": time.perf_counter() - t_start,
                 "s_per_frame": generate_s / (cfg.num_frames * cfg.num_samples)},
    )
    return {
        "files": [str(f) for f in files],
        "frames": int(num_context + cfg.num_frames),
        "generated_frames": int(cfg.num_frames),
        "samples": int(cfg.num_samples),
        "s_per_frame": generate_s / (cfg.num_frames * cfg.num_samples),
        "backend": type(backend).__name__,
    }


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _remove_empty_run_dir(hydra_dir: Path) -> None:
    """Remove Hydra's run folder when nothing was written there, with its empty parents below the working
    directory (``outputs/<date>/<time>`` → nothing left of ``outputs/``)."""
    cwd = Path.cwd().resolve()
    path = hydra_dir.resolve()
    if _is_empty_dir(path):
        path.rmdir()
    if cwd not in path.parents:  # a run folder outside the working directory: leave its parents alone
        return
    path = path.parent
    while path != cwd and _is_empty_dir(path):
        path.rmdir()
        path = path.parent


@hydra.main(config_path=CONF_DIR, config_name="generate", version_base=None)
def _main(cfg: DictConfig) -> None:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    out_dir = Path(str(cfg.output.dir)) if cfg.output.dir else hydra_dir
    fresh = not out_dir.exists() or _is_empty_dir(out_dir)
    try:
        summary = run(cfg, out_dir)
    except BaseException as err:
        if fresh and out_dir.exists():  # a failed run leaves nothing behind
            shutil.rmtree(out_dir, ignore_errors=True)
        _remove_empty_run_dir(hydra_dir)
        if isinstance(err, TerraInputError):
            print(f"terra-generate: error: {err}", file=sys.stderr)
            sys.exit(2)
        raise
    _remove_empty_run_dir(hydra_dir)
    print(f"wrote {summary['generated_frames']} generated frames x {summary['samples']} sample(s) "
          f"({summary['frames']} frames per video) with {summary['backend']}: "
          f"{summary['s_per_frame']:.3f} s per generated frame")
    for f in summary["files"]:
        print(f"  {f}")


def _one_line(err: BaseException) -> str:
    """Hydra's / OmegaConf's multi-line message on one line, without the config search path and key details."""
    message, previous_item = "", False
    for line in str(err).splitlines():
        text = line.strip()
        if text.startswith("Config search path"):
            break
        if not text or text.startswith(("full_key:", "object_type=", "reference_type=")):
            continue
        item = line[:1].isspace()  # Hydra lists options as indented lines
        message = f"{message}{', ' if item and previous_item else ' '}{text}" if message else text
        previous_item = item
    return message or type(err).__name__


def main() -> None:
    """Console-script entry point; a bad override or config value exits with code 2 and one line on stderr."""
    np.set_printoptions(precision=3)
    user_wants_traces = os.environ.get("HYDRA_FULL_ERROR") == "1"
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises config errors instead of printing them and exiting 1
    try:
        _main()
    except (HydraException, OmegaConfBaseException) as err:
        if user_wants_traces:
            raise
        message = _one_line(err)
        unknown = re.match(r"Could not override '([^']+)'", message)
        if unknown and isinstance(err.__cause__, (ConfigKeyError, ConfigAttributeError)):
            message = f"unknown setting {unknown.group(1)!r} (`terra-generate --cfg job` lists the settings)"
        print(f"terra-generate: error: {message}; see terra-generate --help", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
