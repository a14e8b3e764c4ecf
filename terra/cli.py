"""``terra-generate``: context frames + a trajectory → generated driving video (Hydra app, ``conf/generate.yaml``).

The work goes in order of cost, each step checked before the next begins: the settings (before torch or
Transformers is imported; ranges in :mod:`terra.validation` and :mod:`terra.trajectory`), the output folder
and names, the checkpoint configs, the tokenizer, the context frames and the trajectory, and only then the
world model. A user mistake ends with exit code 2 and one line on stderr naming the input and the fix; Ctrl-C
or SIGTERM stops the engine and exits with 130 / 143; either way no output file of the run is left behind
(terra/hydra_app.py prints the line and sets the exit code).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from terra.actions import load_actions
from terra.errors import TerraInputError
from terra.hydra_app import CONFIG_PATH, check_added_settings, run_app, shielded, task
from terra.outputs import check_output, output_file_names, prepare_output_dir
from terra.snapshot import checkpoint_path
from terra.trajectory import MANOEUVRES, check_manoeuvre_params
from terra.validation import (
    DTYPES,
    MAX_FRAMES,
    Range,
    check_backend,
    check_choice,
    check_context_paths,
    check_device,
    check_flag,
    check_output_dir,
    check_sampling,
    check_settings,
    select,
)

SETTINGS = {  # documented in conf/generate.yaml; num_frames is capped by max_num_frames
    "num_frames": Range(1, 2**62, 16, whole=True),
    "max_num_frames": Range(1, MAX_FRAMES, 1000, whole=True),
    "num_samples": Range(1, 256, 4, whole=True),
    "num_context": Range(1, MAX_FRAMES, 3, whole=True),
    "seed": Range(0, 2**62 - 1, 0, whole=True),
    "model.overlap": Range(1, MAX_FRAMES, 3, whole=True),
}


def check_config(cfg: DictConfig) -> tuple[dict, dict]:
    """Check every setting that needs no file, model or torch (fails fast, before anything is loaded or
    written); return the sampling settings and the manoeuvre parameters."""
    check_output(cfg.output)
    values = check_settings(cfg, SETTINGS)
    if values["num_frames"] > values["max_num_frames"]:
        raise TerraInputError(
            f"num_frames={values['num_frames']} is more than max_num_frames={values['max_num_frames']}; generate "
            f"fewer frames or raise the cap, e.g. max_num_frames={values['num_frames']}"
        )
    params = check_manoeuvre_params(select(cfg, "manoeuvre_params"))
    if cfg.trajectory is None and cfg.manoeuvre not in MANOEUVRES:
        raise TerraInputError(f"unknown manoeuvre {cfg.manoeuvre!r}; choose one of: {', '.join(MANOEUVRES)}")
    check_device(cfg.device)
    check_choice(cfg.dtype, "dtype", DTYPES)
    check_backend(cfg.backend.name, select(cfg, "backend.options"))
    check_flag(cfg.model.get("zero_embed_code_0", False), "model.zero_embed_code_0")
    return check_sampling(select(cfg, "sampling")), params


def run(cfg: DictConfig, out_dir: Path) -> dict:
    """Generate the rollouts of one configuration and write them under ``out_dir``; return the summary."""
    t_start = time.perf_counter()
    sampling_options, params = check_config(cfg)
    world_model_path = checkpoint_path(cfg, "model", "world_model")
    tokenizer_path = checkpoint_path(cfg, "tokenizer", "path")
    file_names = output_file_names(cfg.output, cfg.num_samples)
    check_output_dir(out_dir, file_names)
    if cfg.context is not None:
        check_context_paths(select(cfg, "context"))  # no decoding yet: a FIFO or a typo fails at once
    if cfg.trajectory is not None:  # read and checked now; sized again once the context frames are counted
        load_actions(str(cfg.trajectory), cfg.num_frames)

    # Every setting is fine: now the heavy modules (torch, Transformers).
    import torch

    from terra.generation.backends import resolve_backend, resolve_device
    from terra.generation.sampling import SamplingConfig
    from terra.inputs import (
        builtin_context, check_window, load_context, manoeuvre_actions, rollout_requests, trajectory_actions,
    )
    from terra.models.checkpoint import read_world_model_config
    from terra.outputs import write_outputs
    from terra.pipeline import WorldModelPipeline, check_compatible
    from terra.refiner import check_run_decoding
    from tokenizer import load_tokenizer
    from tokenizer.images import RESIZE_MODES

    if not sys.stderr.isatty():  # no progress bars in logs: stderr holds at most the one error line
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
    device = resolve_device(str(cfg.device))
    if device.startswith("cuda:") and int(device[5:]) >= torch.cuda.device_count():
        raise TerraInputError(f"device={device} does not exist: {torch.cuda.device_count()} GPU(s) are visible "
                              "(cuda:0 is the first); use another index or device=auto")
    backend, options = check_backend(resolve_backend(str(cfg.backend.name), device), select(cfg, "backend.options"))
    resize = check_choice(cfg.tokenizer.get("resize", "crop"), "tokenizer.resize", RESIZE_MODES)
    sampling = SamplingConfig(**sampling_options)
    refiner = check_run_decoding(cfg, device)  # decoding=refiner: its file and device, checked before any load
    config = read_world_model_config(world_model_path)
    check_window(config.num_temporal_embeddings, cfg.num_context, cfg.model.overlap, "model.overlap")
    prepare_output_dir(out_dir, file_names)

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
        context = select(cfg, "context")
        images, _ = load_context(context if isinstance(context, list) else str(context), image_size, cfg.num_context,
                                 resize=resize)
        actions = None
    num_context = len(images)
    if cfg.trajectory is not None:
        actions = trajectory_actions(str(cfg.trajectory), num_context, cfg.num_frames)
    elif actions is None:
        actions = manoeuvre_actions(cfg.manoeuvre, num_context, cfg.num_frames, **params)

    pipeline = WorldModelPipeline.from_pretrained(
        world_model_path, tokenizer, backend=backend, device=device, dtype=str(cfg.dtype), config=config,
        zero_embed_code_0=cfg.model.get("zero_embed_code_0", False), **options,
    )
    try:
        seeds = [cfg.seed + i for i in range(cfg.num_samples)]
        requests = rollout_requests(pipeline.encode(images), actions, cfg.num_frames, seeds, cfg.model.overlap,
                                    pipeline.backend.layout)
        backend_class = type(pipeline.backend).__name__
        print(f"terra-generate: generating {cfg.num_frames} frames x {cfg.num_samples} sample(s) with "
              f"{backend_class} on {device}", flush=True)
        t_gen = time.perf_counter()
        results = pipeline.generate(requests, sampling, progress=sys.stderr.isatty())
        generate_s = time.perf_counter() - t_gen
    finally:
        pipeline.close()
    if refiner is not None:  # loaded once the world model's memory is free; frames at the refiner's size
        results = pipeline.refine(results, refiner.load(), progress=sys.stderr.isatty())
        ground_truth = None
    record = OmegaConf.to_container(cfg, resolve=True)
    record["backend"]["name"], record["device"] = backend, device  # what ran, where the config says auto
    s_per_frame = generate_s / (cfg.num_frames * cfg.num_samples)
    files = write_outputs(
        out_dir, cfg.output, results, actions=actions,
        ground_truth=None if ground_truth is None else ((ground_truth.permute(0, 2, 3, 1) + 1) * 127.5).round().byte().numpy(),
        config=record, timings={"generate_s": generate_s, "total_s": time.perf_counter() - t_start,
                                "s_per_frame": s_per_frame},
        backend={"name": backend, "class": backend_class}, device=device,
    )
    return {"files": [str(f) for f in files], "frames": int(num_context + cfg.num_frames),
            "generated_frames": int(cfg.num_frames), "samples": int(cfg.num_samples), "s_per_frame": s_per_frame,
            "backend": backend_class}


def _is_empty_dir(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _missing_folders(path: Path) -> list[Path]:
    """``path`` and its parents that do not exist yet, deepest first (what a run may create and must remove)."""
    missing = []
    path = path.expanduser().absolute()
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


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
@task
def _main(cfg: DictConfig) -> None:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    out_dir = Path(str(cfg.output.dir)).expanduser() if cfg.output.dir else hydra_dir
    created = _missing_folders(out_dir)
    try:
        check_added_settings("terra-generate", allowed=("backend.options.",))
        summary = run(cfg, out_dir)
    except BaseException:  # a failed or interrupted run leaves nothing behind (its files are gone already)
        with shielded():
            for folder in created:
                if _is_empty_dir(folder):
                    folder.rmdir()
            _remove_empty_run_dir(hydra_dir)
        raise
    _remove_empty_run_dir(hydra_dir)
    print(f"wrote {summary['generated_frames']} generated frames x {summary['samples']} sample(s) "
          f"({summary['frames']} frames per video) with {summary['backend']}: "
          f"{summary['s_per_frame']:.3f} s per generated frame")
    for f in summary["files"]:
        print(f"  {f}")


def main() -> None:
    """Console-script entry point; how it ends (exit codes, one line on stderr) is terra/hydra_app.run_app's."""
    np.set_printoptions(precision=3)
    run_app(_main, "terra-generate")


if __name__ == "__main__":
    main()
