"""``terra-generate``: context frames + a trajectory → generated driving video (Hydra app, ``conf/generate.yaml``).

Inputs are checked before any model loads where possible; every user mistake ends with exit code 2, one line
on stderr naming the input and the fix, and no output files left behind.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from terra.errors import TerraInputError, check_whole_number
from terra.generation.backends import resolve_device
from terra.generation.sampling import SamplingConfig
from terra.hydra_app import CONFIG_PATH, run_app
from terra.inputs import (
    builtin_context,
    check_window,
    load_context,
    manoeuvre_actions,
    rollout_requests,
    trajectory_actions,
)
from terra.models.checkpoint import read_world_model_config
from terra.pipeline import WorldModelPipeline, check_compatible
from terra.refiner import check_run_decoding
from terra.snapshot import checkpoint_path
from terra.trajectory import MANOEUVRES, check_manoeuvre_params
from tokenizer import load_tokenizer


def _whole_number(cfg: DictConfig, key: str, minimum: int, example: int) -> int:
    """``cfg[key]`` (a dotted key) checked to be an integer of at least ``minimum``."""
    return check_whole_number(OmegaConf.select(cfg, key, throw_on_missing=True), key, minimum, f"{key}={example}")


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
    world_model_path = checkpoint_path(cfg, "model", "world_model")
    tokenizer_path = checkpoint_path(cfg, "tokenizer", "path")
    config = read_world_model_config(world_model_path)
    check_window(config.num_temporal_embeddings, cfg.num_context, cfg.model.overlap, "model.overlap")
    device = resolve_device(str(cfg.device))
    refiner = check_run_decoding(cfg, device)  # decoding=refiner: weights and GPU checked before loading
    prepare_output_dir(out_dir)

    tokenizer = load_tokenizer(tokenizer_path)
    check_compatible(config, tokenizer)
    image_size = tuple(tokenizer.image_size)
    ground_truth = None
    if cfg.context is None:
        manoeuvre = cfg.manoeuvre if cfg.trajectory is None else "straight"
        images, actions = builtin_context(manoeuvre, cfg.num_context + cfg.num_frames, image_size, cfg.seed,
                                          params if cfg.trajectory is None else {})
        ground_truth, images = images[cfg.num_context :], images[: cfg.num_context]
    else:
        context = list(cfg.context) if OmegaConf.is_list(cfg.context) else str(cfg.context)
        images, _ = load_context(context, image_size, cfg.num_context, resize=str(cfg.tokenizer.get("resize", "crop")))
        actions = None
    num_context = len(images)
    if cfg.trajectory is not None:
        actions = trajectory_actions(str(cfg.trajectory), num_context, cfg.num_frames)
    elif actions is None:
        actions = manoeuvre_actions(cfg.manoeuvre, num_context, cfg.num_frames, **params)

    pipeline = WorldModelPipeline.from_pretrained(
        world_model_path, tokenizer, backend=str(cfg.backend.name), device=device, dtype=str(cfg.dtype),
        config=config, zero_embed_code_0=bool(cfg.model.get("zero_embed_code_0", False)),
        **OmegaConf.to_container(cfg.backend.options),
    )
    try:
        seeds = [cfg.seed + i for i in range(cfg.num_samples)]
        requests = rollout_requests(pipeline.encode(images), actions, cfg.num_frames, seeds, cfg.model.overlap,
                                    pipeline.backend.layout)
        t_gen = time.perf_counter()
        results = pipeline.generate(requests, sampling)
        generate_s = time.perf_counter() - t_gen
    finally:
        pipeline.close()
    if refiner is not None:  # after close(): the world model's GPU memory is free for the refiner
        results = pipeline.refine(results, refiner.load(), progress=True)
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
        "backend": type(pipeline.backend).__name__,
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


@hydra.main(config_path=CONFIG_PATH, config_name="generate", version_base=None)
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


def main() -> None:
    """Console-script entry point; a bad override or config value exits with code 2 and one line on stderr."""
    np.set_printoptions(precision=3)
    run_app(_main, "terra-generate")


if __name__ == "__main__":
    main()
