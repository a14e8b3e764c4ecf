#!/usr/bin/env python
"""The plan of ``terra-drive study=gpu`` (conf/study/gpu.yaml), the CPU's share of it measured on this machine, and
the study's wall time projected from both.

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python scripts/bench/benchmark_study_plan.py --scenarios 1 --steps 200 \\
        --out plan.json

``study=gpu`` runs as shard processes of one machine (terra/closedloop/study/processes.py): ``shard_processes.engine``
shards, each with an engine on the GPU, drive the worlds the world model draws; ``shard_processes.scene`` shards drive
the truth and the scene controls on the CPU; the exploitability study runs beside them in the command's own process
on an engine of its own (terra/closedloop/study/drives.py); then the report. The GPU's part cannot be measured without
a GPU; this script counts every world's frames from the preset (the route controls too, for a model with route
slots) and measures, in one process on one thread (CPU seconds, which a shared machine does not inflate), what the CPU
does per frame: the truth's drives (a pixel policy's plan and the vehicle, and the true render, timed apart by
rendering the same poses again); the measurement of a frame (terra/closedloop/outcomes/frames.py; ``--device``: in
numpy or in torch on a device) by part, on the
``mirrored`` control's drives (frames that are not the truth's), with the true renders its world made at the drive's
poses (as the model worlds, ``mirrored``, ``late`` and ``stutter`` hand them on) and without them (the other scene
controls), and on the ``frozen`` control's (a frame shown again: its ground and motions made once); and the report
step on records of the preset's size. It prints each group's CPU seconds and the projected wall time: the engines'
frames at a rate (``--engine-rate``: the 4 engines' model frames a second), the exploitability study's drives beside
them on one engine (``--exploit-rate``), every group's CPU work over the preset's cores, and the report.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from terra.closedloop.loop import drive_specs, run_drives
from terra.closedloop.outcomes import frames as frame_measures
from terra.closedloop.policies.builtin import policy_factories, policy_names
from terra.closedloop.recording.files import drive_json, metrics_of
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.control_worlds import CONTROL_WORLDS, MODEL_CONTROLS, ROUTE_CONTROLS, SCENE_CONTROLS
from terra.closedloop.study.exploit import GRID, METRICS, TRUTH_PROCESSES
from terra.closedloop.study.report import compare
from terra.closedloop.worlds import TrueWorld
from terra.core.atomic import json_text, write_text
from terra.core.device import usable_cores
from terra.decoder.sidecar import to_jsonable
from terra.sim.renderer import render

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import Parser, check_output, compose_config, exit_2_on_input_error, in_range  # noqa: E402

SIZE = (144, 256)  # the demo tokenizer's frames
ENGINE_START_S = 75.0  # an engine's start, vLLM's compilation and graphs (benchmarks/drives.md)
KEEPING = ("mirrored", "late", "stutter")  # scene controls that hand their true renders on (control_worlds.py)
STILL = ("frozen", "gray")  # scene controls that render nothing while driving, their frames shown again
PARTS = ("render", "recover", "temporal_lag", "lane_agreement", "frame_fidelity", "frame_changes")  # frames.py's


def preset() -> dict:
    """study=gpu's sizes, from its config (the route controls with ``controls=[all]`` for a model with route slots,
    as terra/closedloop/study/settings.py adds them)."""
    cfg = compose_config("drive", ["study=gpu"])
    route = json.loads((Path(cfg.model.world_model) / "config.json").read_text()).get("num_route_tokens", 0)
    every = [name for name in CONTROL_WORLDS if route or name not in ROUTE_CONTROLS]
    controls = every if list(cfg.controls) == ["all"] else list(cfg.controls)
    return {"scenarios": cfg.num_scenarios, "control_scenarios": cfg.num_control_scenarios, "steps": cfg.num_steps,
            "policies": policy_names(list(cfg.policies)),
            "scene_controls": [c for c in controls if c in SCENE_CONTROLS],
            "model_controls": [c for c in controls if c in MODEL_CONTROLS],
            "exploitability": bool(cfg.exploitability), "engine": cfg.shard_processes.engine,
            "scene": cfg.shard_processes.scene, "writers": cfg.writer_processes, "cores": 16}


def cpu_seconds(call):
    start = time.process_time()
    result = call()
    return result, time.process_time() - start


class PartTimes:
    """CPU seconds of each of frames.py's parts (:data:`PARTS`) while measuring: its functions wrapped in place."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        for name in PARTS:
            setattr(frame_measures, name, self._timed(name, getattr(frame_measures, name)))

    def _timed(self, name, function):
        def timed(*args, **kwargs):
            result, seconds = cpu_seconds(lambda: function(*args, **kwargs))
            self.seconds[name] += seconds
            return result
        return timed

    def measure(self, drives, frames: int, renders: bool = True, device: str | None = None) -> dict[str, float]:
        """Seconds a frame of ``drives`` measured (``renders``: with the true renders their world made; on torch's
        ``device``, None: numpy), by part."""
        self.seconds.clear()
        _, total = cpu_seconds(lambda: [frame_measures.measure_frames(d if renders else replace(d, truths=None),
                                                                      device) for d in drives])
        parts = {name: self.seconds[name] / frames for name in PARTS}
        return {"total": total / frames, **parts, "other": total / frames - sum(parts.values())}


def exploit_frames(scenarios: int, steps: int) -> dict[str, dict[str, int]]:
    """The exploitability study's frames at most (terra/closedloop/study/exploit.py), phase by phase: every candidate
    on the search half, both worlds side by side; per metric the model's choice in both and the truth's best in truth
    on the test half, one after another; the brake-hard probe, both worlds side by side."""
    search, test = scenarios // 2, scenarios - scenarios // 2
    return {"search": {"model": len(GRID) * search * steps, "truth": len(GRID) * search * steps},
            "tests": {"model": len(METRICS) * test * steps, "truth": 2 * len(METRICS) * test * steps},
            "probe": {"model": test * steps, "truth": test * steps}}


def exploit_seconds(phases: dict[str, dict[str, int]], rate: float, truth_frame_s: float) -> float:
    """The exploitability study's wall time beside the shards: on its engine (model frames at ``rate`` a second, its
    start first) and on its true world's processes (the truth's frames at ``truth_frame_s`` each, over
    ``TRUTH_PROCESSES``), the worlds side by side where it drives so."""
    model = {phase: frames["model"] / rate for phase, frames in phases.items()}
    truth = {phase: frames["truth"] * truth_frame_s / TRUTH_PROCESSES for phase, frames in phases.items()}
    return ENGINE_START_S + sum(model[p] + truth[p] if p == "tests" else max(model[p], truth[p]) for p in phases)


@exit_2_on_input_error("benchmark_study_plan")
def main(argv: list[str] | None = None) -> None:
    parser = Parser("benchmark_study_plan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=in_range(int, 1, 1000), default=1,
                        help="scenarios driven here (each with every policy)")
    parser.add_argument("--steps", type=in_range(int, 1, 10_000), default=200, help="steps a drive")
    parser.add_argument("--engine-rate", type=in_range(float, 1.0, 1e6), default=25_600 / 92.5,
                        help="model frames a second of the preset's engine shards together (measured: 25,600 every "
                             "90-95 s on 4 engines, benchmarks/drives.md)")
    parser.add_argument("--exploit-rate", type=in_range(float, 1.0, 1e6), default=65.0,
                        help="model frames a second of the exploitability study's one engine")
    parser.add_argument("--device", choices=("numpy", "cpu", "cuda"), default="numpy",
                        help="where the measurement runs: numpy (a study on the CPU), or torch on cpu or cuda (a study "
                             "on a GPU measures there)")
    parser.add_argument("--out", type=Path, help="the numbers as JSON")
    args = parser.parse_args(argv)
    if args.out:
        check_output(args.out, "--out")
    plan = preset()
    device = None if args.device == "numpy" else args.device
    specs = drive_specs(synthetic_scenarios(args.scenarios, 0, SIZE), policy_factories(plan["policies"]))
    truth, truth_s = cpu_seconds(lambda: run_drives(TrueWorld(SIZE), specs, args.steps))
    frames = sum(d.steps for d in truth)
    _, render_s = cpu_seconds(lambda: [render(d.spec.scenario.scene, pose, *SIZE) for d in truth
                                       for pose in d.world_poses()[1:]])
    timer = PartTimes()
    measured = {}
    for name in ("mirrored", "frozen"):
        drives = [d.finished() for d in run_drives(SCENE_CONTROLS[name](SIZE), specs, args.steps)]
        count = sum(d.steps for d in drives)
        if name == "mirrored":
            timer.measure(drives[:1], drives[0].steps, device=device)  # loads torch, makes the grids, warms the device
            measured["kept"] = timer.measure(drives, count, device=device)
            measured["rendered"] = timer.measure(drives, count, renders=False, device=device)
        else:
            measured["still"] = timer.measure(drives, count, device=device)
    records = []
    for drive in truth:
        content = drive_json(drive.finished(), metrics_of(drive), {}, [])
        content["fidelity"] = frame_measures.measure_frames(drive)
        records.append(json.loads(json_text(to_jsonable(content))))
    per_frame = {"truth": truth_s / frames, "render": render_s / frames,
                 "policy_and_vehicle": (truth_s - render_s) / frames, "measured_kept": measured["kept"]["total"],
                 "measured_rendered": measured["rendered"]["total"], "measured_still": measured["still"]["total"]}

    def replicated(count: int) -> dict[str, dict]:  # the truth's drives made here, as the preset's scenarios
        out = {}
        for k in range(count):
            for record in records:
                copy = {**record, "scenario": f"{record['scenario']}-{k}", "drive": f"{record['drive']}-{k}"}
                out[copy["drive"]] = copy
        return out

    runs = {"model": replicated(plan["scenarios"]), "truth": replicated(plan["scenarios"])}
    runs.update({name: replicated(plan["control_scenarios"]) for name in plan["model_controls"] +
                 plan["scene_controls"]})
    texts = [json_text(r) for world in runs.values() for r in world.values()]
    _, read_s = cpu_seconds(lambda: [json.loads(t) for t in texts])
    _, report_s = cpu_seconds(lambda: compare(runs, within_horizon=True))
    steps, policies = plan["steps"], len(plan["policies"])
    drive_frames, control_frames = plan["scenarios"] * policies * steps, plan["control_scenarios"] * policies * steps
    counts = {"model": drive_frames, "truth": drive_frames, "model_controls": len(plan["model_controls"]) *
              control_frames, "scene_controls": len(plan["scene_controls"]) * control_frames}
    phases = exploit_frames(plan["scenarios"], steps) if plan["exploitability"] else {}
    exploit = {world: sum(frames[world] for frames in phases.values()) for world in ("model", "truth")}
    f = per_frame
    scene = counts["truth"] * f["truth"] + control_frames * sum(
        f["policy_and_vehicle"] + f["measured_still"] if name in STILL else
        f["truth"] + (f["measured_kept"] if name in KEEPING else f["measured_rendered"])
        for name in plan["scene_controls"])  # a control's frame: driven (as the truth, or rendering nothing), measured
    # a model world's frame: its policy, the vehicle and the true render its reference needs, then its measurement with
    # that render (the tokenizer's round trip of the reference and the world model's frame are the GPU's)
    engine = (counts["model"] + counts["model_controls"]) * (f["truth"] + f["measured_kept"])
    beside = exploit["model"] * f["policy_and_vehicle"] + exploit["truth"] * f["truth"]  # nothing measured
    cpu = scene + engine + beside
    engines_s = ENGINE_START_S + (counts["model"] + counts["model_controls"]) / args.engine_rate
    exploit_s = exploit_seconds(phases, args.exploit_rate, f["truth"]) if phases else 0.0
    drives_s = max(engines_s, exploit_s, cpu / plan["cores"])
    found = {"preset": {k: v for k, v in plan.items() if k != "policies"}, "policies": policies,
             "frames": counts, "exploit_frames": phases,
             "measured_here": {"drives": len(truth), "frames": frames, "per_frame_s": per_frame,
                               "measured_by_part_s": measured},
             "cpu_s": {"scene_shards": scene, "engine_shards_besides_the_gpu": engine, "exploitability": beside,
                       "all": cpu, "report_read_s": read_s, "report_judge_s": report_s},
             "projected_s": {"engines": engines_s, "exploitability_beside": exploit_s,
                             "cpu_work_on_all_cores": cpu / plan["cores"], "drives": drives_s,
                             "study": drives_s + read_s + report_s},
             "rates": {"engine_frames_per_s": args.engine_rate, "exploit_frames_per_s": args.exploit_rate},
             "cores_here": usable_cores(), "measured_on": args.device}
    print(json.dumps(found, indent=2))
    if args.out:
        write_text(args.out, json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
