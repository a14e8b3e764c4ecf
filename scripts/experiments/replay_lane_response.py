"""Open-loop replay of recorded drives: how far the world model moves the lane when the car moves across it.

    python scripts/experiments/replay_lane_response.py --drives 'runs/fid/model/*__lane_follower_near.json' \\
        --model terra/assets/demo/world_model --told forecast driven held --frames 66
    python scripts/experiments/replay_lane_response.py --weave 8 0.3 --scenarios 8 --told driven --frames 60

Each drive's recorded poses are fed step by step to the model world (which also keeps the true frame at each pose
through its tokenizer, terra/closedloop/worlds.py) and to the true renderer, so both worlds show the same motion;
the model is told, a step, one of three paths: ``forecast``, the action the loop told it (the vehicle's forecast of
the plan, the drive's recorded actions); ``driven``, the path the car then drove (from the recorded poses);
``held``, the arc held from the car's next step (its speed and turn over 0.1 s, kept for 3 s). The lane is read in
every frame (terra/fidelity/lanes.py, ``find_lane``: the lane centre's offset at the car); the response is the gain
through the origin of the model's lane offset on the true one over the frames whose true lane lies within
``--within`` m, pooled over the drives, with a 95 % bootstrap interval over drives (seeded), the noise about it, and
how far the model's error moves from one frame to the next (``step_m``: what a policy steering by a near point
turns into steering at once). ``--weave WAVELENGTH AMPLITUDE`` replays drives made up instead of recorded ones: the
first ``--scenarios`` synthetic scenarios, the car swinging about its start's offset from the road at that
wavelength and amplitude (m) at the scenario's speed, told the path it drives.
Its control: the true frames through the tokenizer against the true frames, what a perfect model of that tokenizer
would read (near 1). A gain under 1 is a world that draws the car's sideways motion short; the noise is how far its
lane wanders about where that gain puts it, which a policy steering by a near point turns into steering.

It backs benchmarks/fidelity.md, "Why the near follower left the road" (``--weave``) and "The near follower's lane
response, replayed" (``--drives``).
"""

from __future__ import annotations

import glob
import json
import re
import sys
from pathlib import Path

import numpy as np

from terra.closedloop.recording.config import DriveRunConfig
from terra.config.assets import demo_checkpoints
from terra.config.schema import schema_settings
from terra.contract.actions import ACTION_TIMES, FRAME_RATE_HZ
from terra.core.atomic import atomic_path, json_text, write_text
from terra.core.errors import TerraInputError
from terra.inputs.ego_motion import action_arc, along_arc, to_ego

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, exit_2_on_input_error, existing, in_range  # noqa: E402

TOLD = ("forecast", "driven", "held")
FUTURE_STEPS = int(np.ceil(ACTION_TIMES[-1] * FRAME_RATE_HZ))  # the steps of poses an action reads past its own
BOOTSTRAPS = 2000
DRIVE = {key: item.range for key, item in schema_settings(DriveRunConfig).items()}  # terra-drive's bounds
MAX_FRAMES, MAX_SCENARIOS = int(DRIVE["num_steps"].high), int(DRIVE["num_scenarios"].high)


def driven_action(poses: np.ndarray, k: int) -> np.ndarray:
    """The action ``[6, 3]`` of the path the car drove from step ``k``: its poses at the action times (interpolated
    between frames), in the ego frame of pose ``k``."""
    at = k + ACTION_TIMES * FRAME_RATE_HZ
    points = np.stack([np.interp(at, np.arange(len(poses)), poses[:, i]) for i in (0, 1)], axis=-1)
    ego = to_ego(points, poses[k])
    return np.stack([ego[:, 1], ego[:, 0], ACTION_TIMES], axis=-1).astype(np.float32)


def held_action(poses: np.ndarray, k: int) -> np.ndarray:
    """The action ``[6, 3]`` of the arc through the car's next step (the circle leaving pose ``k`` straight ahead that
    reaches pose ``k + 1``), driven on at that step's speed: the session's rule read the other way
    (terra/inputs/ego_motion.py, ``ego_motion``)."""
    x, y = to_ego(poses[k + 1, :2], poses[k])
    curvature, length, step_s = action_arc(np.array([[y, x, 1.0 / FRAME_RATE_HZ]]))
    ax, ay, _ = along_arc(curvature, length / step_s * ACTION_TIMES)
    return np.stack([ay, ax, ACTION_TIMES], axis=-1).astype(np.float32)


def told_action(record: dict, poses: np.ndarray, k: int, told: str) -> np.ndarray:
    """What the model is told at step ``k`` of a recorded drive (module docstring)."""
    if told == "forecast":
        return np.asarray(record["actions"][k], np.float32)
    return driven_action(poses, k) if told == "driven" else held_action(poses, k)


def lane_gain(world: np.ndarray, truth: np.ndarray, within: float, seed: int = 0) -> dict:
    """Gain through the origin of ``world`` on ``truth`` (lane offsets ``[drives, frames]``, NaN where no lane was
    found) over the frames with ``|truth| < within``, pooled, its 95 % bootstrap interval over drives, and the noise
    about it (root mean square of ``world - gain * truth``, m)."""
    used = np.isfinite(world) & np.isfinite(truth) & (np.abs(truth) < within)
    cross = np.where(used, world * truth, 0.0).sum(axis=1)
    square = np.where(used, truth * truth, 0.0).sum(axis=1)
    picks = np.random.default_rng(seed).integers(0, len(cross), (BOOTSTRAPS, len(cross)))
    drawn = cross[picks].sum(axis=1) / np.maximum(square[picks].sum(axis=1), 1e-12)
    low, high = np.percentile(drawn, [2.5, 97.5])
    gain = float(cross.sum() / square.sum())
    noise = float(np.sqrt(np.mean((world[used] - gain * truth[used]) ** 2)))
    step = np.diff(world - truth, axis=1)[used[:, 1:] & used[:, :-1]]
    return {"gain": gain, "interval": [float(low), float(high)], "noise_m": noise,
            "step_m": float(np.sqrt(np.mean(step**2))) if step.size else float("nan"), "frames": int(used.sum())}


def weave_record(index: int, steps: int, wavelength_m: float, amplitude_m: float) -> dict:
    """A drive record (the fields :func:`replay` reads) of synthetic scenario ``index``: ``steps`` + 3 s of poses
    swinging ``amplitude_m`` about the start's offset from the road every ``wavelength_m`` at the scenario's speed,
    the swing grown over the first 10 m; its actions the path it drives."""
    from terra.closedloop.scenarios import synthetic_scenarios

    scenario = synthetic_scenarios(index + 1, 0, (144, 256), indices=[index])[0]
    scene = scenario.scene
    along = scenario.speed_kmh / 3.6 / FRAME_RATE_HZ * np.arange(steps + 1 + FUTURE_STEPS)
    s0, d0 = (float(v[0]) for v in scene.road_coords(scenario.start_pose[:1], scenario.start_pose[1:2]))
    grown = np.minimum(along / 10.0, 1.0)
    offset = d0 + amplitude_m * grown * np.sin(2 * np.pi * along / wavelength_m)
    poses = scene.lane_pose(s0 + along, offset)
    poses[:, 2] += np.arctan(np.gradient(offset, along))  # heading along the swing
    actions = [driven_action(poses, k).tolist() for k in range(steps)]
    return {"scenario": scenario.id, "actions": actions, "world_poses": poses.tolist()}


def replay(pipeline, records: list[dict], told: str, frames: int, seed: int, temperature: float) -> np.ndarray:
    """Lane offsets ``[drives, frames, 3]``: the model's, the truth's and the truth through the tokenizer."""
    from terra.closedloop.scenarios import synthetic_scenarios
    from terra.closedloop.worlds import ModelWorld, TrueWorld
    from terra.config.sampling import SamplingConfig
    from terra.fidelity.lanes import find_lane

    size = tuple(pipeline.image_size)
    model_world = ModelWorld(pipeline, SamplingConfig(temperature=temperature), references=True)
    true_world = TrueWorld(size)
    drives, truths, poses = [], [], []
    for record in records:
        index = int(record["scenario"].rsplit("-", 1)[1])
        scenario = synthetic_scenarios(index + 1, 0, size, indices=[index])[0]
        drives.append(model_world.open(scenario, seed, frames))
        truths.append(true_world.open(scenario, seed, frames))
        poses.append(np.asarray(record["world_poses"], np.float64))
    offsets = np.full((len(records), frames, 3), np.nan)
    for k in range(frames):
        actions = [told_action(r, p, k, told) for r, p in zip(records, poses)]
        at = [p[k + 1] for p in poses]
        drawn, true = model_world.step(drives, actions, at), true_world.step(truths, actions, at)
        for i, drive in enumerate(drives):
            for j, frame in enumerate((drawn[i], true[i], drive.references[-1])):
                lane = find_lane(frame)
                offsets[i, k, j] = np.nan if lane is None else lane.offset
    return offsets


def read_drive(path: Path, told: list[str]) -> dict:
    """A recorded drive's fields :func:`replay` reads, checked once: the scenario's name ending in its index, finite
    ``world_poses [N, 3]`` and, told ``forecast``, finite ``actions [M, 6, 3]``; one line naming the file otherwise."""
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise TerraInputError(f"--drives {path} line {err.lineno}: not JSON ({err.msg}); give terra-drive's drive "
                              "JSON files") from None
    except (OSError, UnicodeDecodeError) as err:
        raise TerraInputError(f"--drives {path}: cannot be read ({err}); give terra-drive's drive JSON files") from None
    if not isinstance(record, dict):
        raise TerraInputError(f"--drives {path} holds no JSON object; give terra-drive's drive JSON files")
    name = record.get("scenario")
    index = re.fullmatch(r".*-(\d+)", name) if isinstance(name, str) else None
    if index is None or int(index[1]) >= MAX_SCENARIOS:
        raise TerraInputError(f"--drives {path}: 'scenario' is {name!r}, not a synthetic scenario's name "
                              f"(NAME-INDEX, INDEX below {MAX_SCENARIOS})")
    wanted = {"world_poses": (3,)} | ({"actions": (6, 3)} if "forecast" in told else {})
    for key, shape in wanted.items():
        try:
            value = np.asarray(record.get(key))
        except ValueError:  # ragged
            value = np.asarray(None)
        if value.dtype.kind not in "iuf" or value.ndim != 1 + len(shape) or value.shape[1:] != shape \
                or not np.isfinite(value).all():
            raise TerraInputError(f"--drives {path}: {key!r} is not a list of finite numbers of shape "
                                  f"[N, {', '.join(map(str, shape))}]")
    return record


@exit_2_on_input_error("replay_lane_response")
def main(argv: list[str] | None = None) -> None:
    world_model, tokenizer = demo_checkpoints()
    parser = Parser("replay_lane_response", description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--drives", help="a glob of recorded drives' JSON files (terra-drive's)")
    source.add_argument("--weave", nargs=2, type=in_range(float, 0, 1000), metavar=("WAVELENGTH_M", "AMPLITUDE_M"),
                        help="replay made-up drives swinging about their lane instead (module docstring)")
    parser.add_argument("--scenarios", type=in_range(int, 1, MAX_SCENARIOS), default=8,
                        help="--weave: the synthetic scenarios driven")
    parser.add_argument("--model", type=existing("folder", "config.json"), default=world_model,
                        help="the world model's folder (default: the demo model)")
    parser.add_argument("--tokenizer", type=existing("folder", "config.json"), default=tokenizer,
                        help="the tokenizer's folder (default: the demo tokenizer)")
    parser.add_argument("--told", nargs="+", choices=TOLD, default=list(TOLD), help="the paths the model is told")
    parser.add_argument("--frames", type=in_range(int, 1, MAX_FRAMES), default=66,
                        help="steps replayed from each drive's start")
    parser.add_argument("--within", type=in_range(float, 0, 100, above=True), default=0.5,
                        help="frames whose true lane lies within this (m)")
    parser.add_argument("--seed", type=in_range(int, 0, 2**32 - 1), default=0, help="the drives' sampling seed")
    parser.add_argument("--temperature", type=in_range(float, 0, 100), default=1.0,
                        help="the model's sampling temperature (0: greedy)")
    parser.add_argument("--out", type=Path, help="also write the figures (and the offsets, .npz) here (.json)")
    args = parser.parse_args(argv)
    paths = [] if args.weave else [Path(p) for p in sorted(glob.glob(args.drives))]
    if args.drives and not paths:
        parser.error(f"--drives {args.drives!r} matches no file; give a glob of terra-drive's drive JSON files")
    if args.out:
        inputs = [*paths, args.model, args.tokenizer]
        check_output(args.out, "--out", inputs)
        check_output(args.out.with_suffix(".npz"), "--out", inputs)
    if args.weave:
        wavelength, amplitude = args.weave
        if wavelength <= 0:
            parser.error("--weave takes a wavelength > 0 and an amplitude >= 0 (m)")
        records = [weave_record(i, args.frames, wavelength, amplitude) for i in range(args.scenarios)]
    else:
        records = [read_drive(p, args.told) for p in paths]
    frames = min(args.frames, *(len(r["world_poses"]) - 1 - FUTURE_STEPS for r in records))
    if "forecast" in args.told:
        frames = min(frames, *(len(r["actions"]) for r in records))
    if frames < 1:
        parser.error("the drives are too short to replay: each needs 3 s of poses past the first step")
    report: dict = {"drives": len(records), "frames": frames, "within_m": args.within,
                    "temperature": args.temperature, "told": {}}
    from terra.generation.backends import model_backend
    from terra.pipeline import WorldModelPipeline
    from terra.tokenizer import load_tokenizer

    pipeline = WorldModelPipeline(load_tokenizer(str(args.tokenizer)), model_backend(str(args.model)))
    arrays = {}
    for told in args.told:
        offsets = replay(pipeline, records, told, frames, args.seed, args.temperature)
        arrays[told] = offsets
        model, truth, reference = offsets[..., 0], offsets[..., 1], offsets[..., 2]
        report["told"][told] = {"model_on_truth": lane_gain(model, truth, args.within),
                                "model_on_tokenizer": lane_gain(model, reference, args.within)}
        row = report["told"][told]
        print(f"told {told:8s}: model on truth {fmt(row['model_on_truth'])}; on the truth through the tokenizer "
              f"{fmt(row['model_on_tokenizer'])}", flush=True)
    # the true frames and their tokenizer round trips are the same whatever the model was told: the last replay's
    report["control_tokenizer_on_truth"] = lane_gain(reference, truth, args.within)
    print(f"control: the truth through the tokenizer on the truth {fmt(report['control_tokenizer_on_truth'])} "
          f"({len(records)} drives x {frames} steps, true lane within {args.within} m)")
    if args.out:
        with atomic_path(args.out.with_suffix(".npz")) as tmp:
            np.savez(tmp, **arrays)
        write_text(args.out, json_text(report, indent=1) + "\n")


def fmt(figure: dict) -> str:
    low, high = figure["interval"]
    return (f"{figure['gain']:.3f} [{low:.3f}, {high:.3f}], noise {figure['noise_m']:.3f} m, step to step "
            f"{figure['step_m']:.3f} m ({figure['frames']} frames)")


if __name__ == "__main__":
    sys.exit(main())
