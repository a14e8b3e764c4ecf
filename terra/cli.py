"""``terra-generate``: context frames + a trajectory → generated driving video (Hydra app, ``conf/generate.yaml``).

Inputs are checked before any model loads where possible; every user mistake ends with exit code 2, one line
on stderr naming the input and the fix, and no output files left behind.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from terra.actions import actions_for_manoeuvre, load_actions
from terra.backends import create_backend, resolve_device
from terra.errors import TerraInputError
from terra.pipeline import WorldModelPipeline, check_compatible, read_world_model_config
from terra.rollout import RolloutRequest
from terra.sampling import SamplingConfig

ASSETS = Path(__file__).resolve().parent / "assets"
CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

OmegaConf.register_new_resolver("terra_asset", lambda name: str(ASSETS / name), replace=True)


def builtin_context(manoeuvre: str, num_frames: int, image_size: tuple[int, int], seed: int, params: dict):
    """Frames rendered by the synthetic world driving ``manoeuvre``, with their actions (exact ground truth)."""
    from terra.world import Scene, make_clip

    clip = make_clip(Scene.generate(seed), manoeuvre, num_frames, image_size[0], image_size[1], **params)
    images = torch.from_numpy(clip.frames).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    return images, clip.actions


def load_context(source, num_context: int, image_size: tuple[int, int]) -> torch.Tensor:
    """The last ``num_context`` frames of a folder, glob, list of images or video, resized to the model."""
    from tokenizer.images import load_images

    sources = list(source) if OmegaConf.is_list(source) else str(source)
    return load_images(sources, image_size, last_n=num_context)


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Generate the rollouts of one configuration and write them under ``out_dir``; return the summary."""
    from terra.outputs import check_output_formats, prepare_output_dir, write_outputs

    t_start = time.perf_counter()
    check_output_formats(cfg.output.formats)
    if cfg.num_frames < 1:
        raise TerraInputError(f"num_frames must be at least 1 (got {cfg.num_frames}); e.g. num_frames=16")
    if cfg.num_samples < 1:
        raise TerraInputError(f"num_samples must be at least 1 (got {cfg.num_samples})")
    if cfg.num_context < 1:
        raise TerraInputError(f"num_context must be at least 1 (got {cfg.num_context})")
    params = OmegaConf.to_container(cfg.manoeuvre_params) or {}
    sampling = SamplingConfig(**OmegaConf.to_container(cfg.sampling))
    world_model_config = read_world_model_config(cfg.model.world_model)
    window = world_model_config.get("num_temporal_embeddings", 25)
    if cfg.num_context >= window:
        raise TerraInputError(f"num_context={cfg.num_context} does not fit a window of {window} frames; use at most {window - 1}")
    device = resolve_device(cfg.device)
    if cfg.context is None and cfg.trajectory is None:
        from terra.trajectory import MANOEUVRES

        if cfg.manoeuvre not in MANOEUVRES:
            raise TerraInputError(f"unknown manoeuvre {cfg.manoeuvre!r}; choose one of: {', '.join(MANOEUVRES)}")
    prepare_output_dir(out_dir)

    from tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(cfg.tokenizer.path))
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

    backend = create_backend(cfg.backend.name, cfg.model.world_model, device=device, dtype=cfg.dtype,
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


@hydra.main(config_path=CONF_DIR, config_name="generate", version_base=None)
def _main(cfg: DictConfig) -> None:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    out_dir = Path(cfg.output.dir) if cfg.output.dir else hydra_dir
    fresh = not out_dir.exists() or _is_empty_dir(out_dir)
    try:
        summary = run(cfg, out_dir)
    except BaseException as err:
        if fresh and out_dir.exists():  # a failed run leaves nothing behind
            shutil.rmtree(out_dir, ignore_errors=True)
        if _is_empty_dir(hydra_dir):
            hydra_dir.rmdir()
        if isinstance(err, TerraInputError):
            print(f"terra-generate: error: {err}", file=sys.stderr)
            sys.exit(2)
        raise
    if out_dir != hydra_dir and _is_empty_dir(hydra_dir):
        hydra_dir.rmdir()
    print(f"wrote {summary['generated_frames']} generated frames x {summary['samples']} sample(s) "
          f"({summary['frames']} frames per video) with {summary['backend']}: "
          f"{summary['s_per_frame']:.3f} s per generated frame")
    for f in summary["files"]:
        print(f"  {f}")


def main() -> None:
    """Console-script entry point."""
    np.set_printoptions(precision=3)
    _main()


if __name__ == "__main__":
    main()
