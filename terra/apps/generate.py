"""``terra-generate``: context frames + a trajectory → generated driving video."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

import hydra
import numpy as np
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, remove_empty_run_dir, run_app, shielded, task
from terra.config.files import declared_route_tokens
from terra.config.checks import MAX_FRAMES, SEED, Range, check_whole_number, plain, select
from terra.config.output_dir import claim_output_dir, unmark_unused
from terra.config.outputs import OutputSpec
from terra.config.schema import block_values, check_schema, group, setting
from terra.config.spec import RunConfig, RunSpec, check_decoder_name, run_spec
from terra.contract.routes import route_summary
from terra.core.errors import TerraInputError, clipped
from terra.core.folders import missing_folders, remove_empty_folders
from terra.inputs.actions import check_input_files
from terra.inputs.routes import ROAD, GivenRoutes, road_of_setting
from terra.inputs.trajectory import FOLLOW_LANE, MANOEUVRE_RANGES, MANOEUVRES, manoeuvre_trajectory

APP = "terra-generate"


def _parameter(name: str, used_by: str) -> Any:
    default = inspect.signature(manoeuvre_trajectory).parameters[name].default
    return setting(None, f"null: {default:g}; {used_by}", dataclasses.replace(MANOEUVRE_RANGES[name], nullable=True))


@dataclass
class ManoeuvreParams:
    speed_kmh: Optional[float] = _parameter("speed_kmh", "every manoeuvre, follow_lane's too")
    radius_m: Optional[float] = _parameter("radius_m", "curves")
    accel_mps2: Optional[float] = _parameter("accel_mps2", "accelerate, decelerate, stop")
    lane_width_m: Optional[float] = _parameter("lane_width_m", "lane changes")
    change_s: Optional[float] = _parameter("change_s", "lane changes")


@dataclass
class GenerateConfig(RunConfig):
    output: Dict[str, Any] = group()
    refiner: Dict[str, Any] = group()
    context: Any = setting(None, "folder, glob, image list or video file; null = built-in frames rendered by "
                                 "terra.sim")
    num_context: int = setting(3, "context frames (the last ones of `context`); at least 1 and below the world "
                                  "model's window")
    trajectory: Optional[str] = setting(None, "trajectory file (.json / .csv / .npy: Trajectories above); frame 0 = "
                                              "first context frame. A JSON one may give a road beside it: \"road\": "
                                              "[[x, y], ...] (its world frame) or \"ego_routes\" (each frame's route, "
                                              "rows [x, y]): docs/generate.md, \"Routes\"")
    road: Any = setting(None, "the road every frame's route is told from, in the drive's world frame (the "
                              "trajectory's, or the manoeuvre's: from the origin heading +x): road.json / road.csv, a "
                              "clipgt .zip or folder, or inline [[x, y], ...]; checked before any model loads")
    manoeuvre: str = setting("accelerate", "used when trajectory is null; follow_lane: the built-in scene's road, "
                                           "bends and all (context null; its route is the road); the default stays "
                                           "in its lane (every built-in scene starts on a straight of 30 m or more)",
                             choices=(*MANOEUVRES, FOLLOW_LANE))
    manoeuvre_params: ManoeuvreParams = setting(ManoeuvreParams(), "")
    num_frames: int = setting(16, "frames to generate after the context; 1 .. max_num_frames")
    max_num_frames: int = setting(1000, "cap on num_frames (100 s at 10 Hz): a typo such as num_frames=16000 fails "
                                        "at once", Range(1, MAX_FRAMES, 1000, whole=True))
    num_samples: int = setting(1, "rollouts with seeds seed, seed+1, ...; more than one also writes a grid video",
                               Range(1, 256, 4, whole=True))
    seed: int = setting(0, "", SEED)
    decoder: str = setting("tokenizer", "how codes become frames: tokenizer (its decoder, at the tokenizer's image "
                                        "size: 144x256 for the demo's) | refiner (Terra's video refiner, 384x640, GPU)",
                           check=check_decoder_name)


@dataclass(frozen=True)
class GenerateSpec:
    """A ``terra-generate`` run, checked: the shared :class:`RunSpec` and this app's own settings."""

    run: RunSpec
    output: OutputSpec
    num_frames: int
    num_samples: int
    seed: int
    context: str | list[str] | None  # None: frames rendered by terra.sim
    trajectory: str | None  # a trajectory file; None: the manoeuvre
    road: str | list | None  # the road every frame's route is told from
    manoeuvre: str
    manoeuvre_params: dict[str, float]
    record: dict  # the settings as given, stored in the sidecar (with the backend and device that ran)


def generate_spec(cfg: DictConfig) -> GenerateSpec:
    """Every setting checked once, without reading a file or importing torch."""
    values = check_schema(cfg, GenerateConfig)
    num_frames, cap = values["num_frames"], values["max_num_frames"]
    if isinstance(num_frames, int) and not isinstance(num_frames, bool) and num_frames > cap:
        raise TerraInputError(f"num_frames={num_frames} is more than max_num_frames={cap}; generate fewer frames or "
                              f"raise the cap, e.g. max_num_frames={num_frames}")
    num_frames = check_whole_number(num_frames, "num_frames", 1, "num_frames=16", cap,
                                    bounds=f"from 1 to max_num_frames ({cap})")
    output = OutputSpec.from_mapping(select(cfg, "output"))
    params = {key: value for key, value in block_values(values, "manoeuvre_params").items() if value is not None}
    context, road, trajectory, manoeuvre = values["context"], values["road"], values["trajectory"], values["manoeuvre"]
    if trajectory is None and manoeuvre == FOLLOW_LANE and context is not None:
        raise TerraInputError(f"manoeuvre={FOLLOW_LANE} keeps the lane of the built-in scene's road, which frames of "
                              "your own do not have; leave context unset, or give your drive as trajectory=FILE")
    if road is not None and trajectory is None and manoeuvre == FOLLOW_LANE:
        raise TerraInputError(f"road= with manoeuvre={FOLLOW_LANE}: follow_lane drives the built-in scene's own road; "
                              "give another manoeuvre, or your drive as trajectory=FILE")
    return GenerateSpec(run_spec(cfg), output, num_frames, values["num_samples"], values["seed"],
                        context if context is None or isinstance(context, list) else str(context),
                        None if trajectory is None else str(trajectory),
                        road if road is None or isinstance(road, list) else str(road), manoeuvre, params, plain(cfg))


def check_road_drive(drive: Any, num_context: int, num_frames: int, route_tokens: int,
                     beside: GivenRoutes) -> None:
    """Refuse a road that tells no frame of ``drive`` a route, whether the context frames still to load are 1 or
    ``num_context`` (one line; a drive that fits only fewer context frames is checked once they are read)."""
    from terra.inputs import trajectory_inputs

    try:
        trajectory_inputs(drive, num_context, num_frames, route_tokens, beside=beside)
    except TerraInputError:
        trajectory_inputs(drive, 1, num_frames, route_tokens, beside=beside)


def run(spec: GenerateSpec, out_dir: Path) -> dict:
    """Generate the rollouts of a checked :class:`GenerateSpec`, write them under ``out_dir`` and return the summary."""
    t_start = time.perf_counter()
    # 1. the input files checked, the output names and folder: nothing read, nothing heavy imported
    check_input_files(spec.context, spec.trajectory)
    road = None if spec.road is None else road_of_setting(spec.road)  # read and checked before anything loads
    beside = None if road is None else GivenRoutes(ROAD, road, f"road={clipped(spec.road)}")
    drive = spec.trajectory if spec.trajectory is not None or beside is None else {  # the road's poses
        "manoeuvre": {"name": spec.manoeuvre, **spec.manoeuvre_params}}
    route_tokens = 0 if beside is None else declared_route_tokens(spec.run.world_model)
    if route_tokens:  # the road against the drive's poses, before torch loads
        check_road_drive(drive, spec.run.num_context, spec.num_frames, route_tokens, beside)
    names = spec.output.names(spec.num_samples)  # planned once: claimed here, written in step 5
    output = claim_output_dir(out_dir, "output.dir", files=names.files, folders=names.folders, inputs=[
        ("context", spec.context), ("trajectory file", spec.trajectory), ("world model", spec.run.world_model),
        ("tokenizer", spec.run.tokenizer), ("refiner weights", spec.run.refiner.get("path"))], app=APP)

    from terra.generation.pass_stats import PassStats
    from terra.inputs import UNUSED_ROUTES, load_context, manoeuvre_actions, rollout_requests, trajectory_inputs
    from terra.outputs import write_outputs
    from terra.pipeline import WorldModelPipeline
    from terra.run import resolve_run
    from terra.sim import builtin_context, builtin_road
    from terra.tokenizer import load_tokenizer

    # 2. the run made concrete (threads, device, backend, vLLM's decoding, the refiner's settings, the window),
    # the tokenizer, the context frames and the trajectory
    run = resolve_run(spec.run, spec.num_samples, refine_after=True, max_rollouts=spec.num_samples)
    run_settings, refiner = run.spec, run.refiner
    num_context, num_frames = run_settings.num_context, spec.num_frames
    ground_truth = actions = routes = route_source = route_told = given = None
    named_drive = spec.trajectory or f"road={clipped(spec.road)}"
    if drive is not None and spec.context is None:  # read once, its routes checked, before the tokenizer loads
        given = trajectory_inputs(drive, num_context, num_frames, run.model.num_route_tokens, beside=beside)
    tokenizer = load_tokenizer(run_settings.tokenizer)
    image_size = tuple(tokenizer.image_size)
    if spec.context is not None:
        images, _ = load_context(spec.context, image_size, num_context, resize=run_settings.resize)
        if drive is not None:  # sized for the context frames there are
            given = trajectory_inputs(drive, len(images), num_frames, run.model.num_route_tokens, beside=beside)
    if given is not None:
        actions, routes, route_source, route_told = given.actions, given.routes, given.route_source, given.route_told
        if given.unused_routes:
            print(f"terra-generate: {named_drive} carries routes; {UNUSED_ROUTES}", file=sys.stderr, flush=True)
        summary = None if route_told is None else route_summary(route_told)
        if summary is not None:
            print(f"terra-generate: {summary}", flush=True)
    if spec.context is None:  # the built-in scene driven by the manoeuvre (of the file: as manoeuvre= drives it)
        named = given is None or given.manoeuvre is not None
        manoeuvre = spec.manoeuvre if given is None else given.manoeuvre.name if named else "straight"
        params = spec.manoeuvre_params if given is None else given.manoeuvre.params if named else {}
        images, scene_actions = builtin_context(manoeuvre, num_context + num_frames, image_size, spec.seed, params)
        ground_truth, images = images[num_context:], images[:num_context]
        actions = scene_actions if named else actions
        told_none = given is not None and given.no_route  # "road": null
        if named and routes is None and run.model.num_route_tokens and not told_none:  # the scene's road
            scene, poses = builtin_road(manoeuvre, num_context + num_frames, spec.seed, params)
            routes, route_source = scene.route(poses, run.model.num_route_tokens), "scene"
    elif actions is None:
        actions = manoeuvre_actions(spec.manoeuvre, len(images), num_frames, **spec.manoeuvre_params)

    # 3. the world model, its engine sized for the samples when the run was resolved
    pipeline = WorldModelPipeline.from_run(run, tokenizer)
    # 4. requests → generate (frames decoded now, or by the refiner once the engine's memory is free)
    try:
        seeds = [spec.seed + i for i in range(spec.num_samples)]
        requests = rollout_requests(pipeline.encode(images), actions, num_frames, seeds, run_settings.overlap, routes)
        backend_class = type(pipeline.backend).__name__
        print(f"terra-generate: generating {num_frames} frames x {spec.num_samples} sample(s) with "
              f"{backend_class} on {pipeline.device}", flush=True)
        t_gen = time.perf_counter()
        results = pipeline.generate(requests, run_settings.sampling, progress=True,
                                    decode=refiner is None)
        generate_s = time.perf_counter() - t_gen
    finally:
        pipeline.close()
    if refiner is not None:
        results = pipeline.refine(results, refiner.load(), progress=True)
        ground_truth = None  # frames at the refiner's size
    # 5. the files
    output.record()
    record = copy.deepcopy(spec.record)
    record["backend"]["name"], record["device"] = run_settings.backend, run_settings.device  # what ran
    record["backend"]["options"] = dict(pipeline.engine_options)  # as the engine ran
    s_per_frame = generate_s / (num_frames * spec.num_samples)
    stats = sum((result.pass_stats for result in results), PassStats())
    truth = None if ground_truth is None else ((ground_truth.permute(0, 2, 3, 1) + 1) * 127.5).round().byte().numpy()
    files = write_outputs(
        out_dir, spec.output, names, results, actions=actions, ground_truth=truth, route_source=route_source,
        route_told=route_told, config=record,
        timings={"generate_s": generate_s, "total_s": time.perf_counter() - t_start, "s_per_frame": s_per_frame},
        backend={"name": run_settings.backend, "class": backend_class}, device=run_settings.device,
    )
    return {"files": [str(f) for f in files], "frames": int(len(images) + num_frames),
            "generated_frames": int(num_frames), "samples": int(spec.num_samples), "s_per_frame": s_per_frame,
            "backend": backend_class, "decoding": results[0].sampling.decoding, "pass_stats": stats}


@hydra.main(config_path=CONFIG_PATH, config_name="generate", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    out_dir = Path(str(cfg.output.dir)).expanduser() if cfg.output.dir else hydra_dir
    created = missing_folders(out_dir)
    try:
        check_added_settings("terra-generate", allowed=("backend.options.",), cfg=cfg)
        summary = run(generate_spec(cfg), out_dir)
    except BaseException:  # a failed or interrupted run leaves nothing behind (its files are gone already)
        with shielded():
            unmark_unused(out_dir)  # the files of a failed run are gone; so goes the marker that lists them
            remove_empty_folders(created)  # Hydra's run folder, empty
        raise
    remove_empty_run_dir()  # output.dir elsewhere: nothing was written into Hydra's run folder
    print(f"wrote {summary['generated_frames']} generated frames x {summary['samples']} sample(s) "
          f"({summary['frames']} frames per video) with {summary['backend']}: "
          f"{summary['s_per_frame']:.3f} s per generated frame")
    print(f"  {summary['decoding']} decoding: {summary['pass_stats'].line()}")
    for f in summary["files"]:
        print(f"  {f}")


def main() -> None:
    """Console-script entry point; how it ends (exit codes, one line on stderr) is :func:`run_app`'s."""
    np.set_printoptions(precision=3)
    run_app(_main, APP)


if __name__ == "__main__":
    main()
