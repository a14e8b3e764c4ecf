#!/usr/bin/env python
"""The plan of ``terra-drive study=gpu`` (conf/study/gpu.yaml) and the CPU's share of it, measured on this machine.

    OMP_NUM_THREADS=1 python scripts/bench/benchmark_study_plan.py --scenarios 1 --steps 200 --out plan.json

``study=gpu`` runs as shard processes of one machine (terra/closedloop/study/processes.py): ``shard_processes.engine``
shards, each with an engine on the GPU, drive the worlds the world model draws; ``shard_processes.scene`` shards drive
the truth and the scene controls on the CPU; then the report step (and the exploitability study, on one engine) runs
in the command's own process. The GPU's part (the engines' frames) cannot be measured without a GPU; this script
counts every world's frames from the preset and measures, in one process on one thread (CPU seconds, which a shared
machine does not inflate), what the CPU does per frame: a pixel policy's plan and the vehicle's forecast with the true
render (the truth's drives), the measurement of a world's frame against the true render (every other world's), and
the report step on records of the preset's size (the study's drives made here replicated over its scenarios). It
prints the plan and the CPU seconds each group of processes needs, and the least wall time the CPU's work takes on
the preset's cores.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from hydra import compose, initialize_config_dir

from terra.apps.runner import CONF_DIR
from terra.closedloop.policies.builtin import policy_factories, policy_names
from terra.closedloop.loop import drive_specs, run_drives
from terra.closedloop.recording.files import drive_json, metrics_of
from terra.closedloop.outcomes.frames import measure_frames
from terra.closedloop.scenarios import synthetic_scenarios
from terra.closedloop.study.control_worlds import MODEL_CONTROLS, SCENE_CONTROLS
from terra.closedloop.study.report import compare
from terra.closedloop.worlds import TrueWorld
from terra.decoder.sidecar import to_jsonable
from terra.core.atomic import json_text

SIZE = (144, 256)  # the demo tokenizer's frames


def preset() -> dict:
    """study=gpu's sizes, from its config."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("drive", overrides=["study=gpu"])
    controls = list(SCENE_CONTROLS) + list(MODEL_CONTROLS) if list(cfg.controls) == ["all"] else list(cfg.controls)
    return {"scenarios": cfg.num_scenarios, "control_scenarios": cfg.num_control_scenarios, "steps": cfg.num_steps,
            "policies": policy_names(list(cfg.policies)),
            "scene_controls": [c for c in controls if c in SCENE_CONTROLS],
            "model_controls": [c for c in controls if c in MODEL_CONTROLS], "engine": cfg.shard_processes.engine,
            "scene": cfg.shard_processes.scene, "writers": cfg.writer_processes, "cores": 16}


def cpu_seconds(call):
    start = time.process_time()
    result = call()
    return result, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", type=int, default=1, help="scenarios driven here (each with every policy)")
    parser.add_argument("--steps", type=int, default=200, help="steps a drive")
    parser.add_argument("--out", type=Path, help="the numbers as JSON")
    args = parser.parse_args()
    plan = preset()
    policies = policy_factories(plan["policies"])
    specs = drive_specs(synthetic_scenarios(args.scenarios, 0, SIZE), policies)
    drives, truth_s = cpu_seconds(lambda: run_drives(TrueWorld(SIZE), specs, args.steps))
    frames = sum(d.steps for d in drives)
    records, measure_s = [], 0.0
    for drive in drives:
        content = drive_json(drive.finished(), metrics_of(drive), "", [])
        content["fidelity"], seconds = cpu_seconds(lambda drive=drive: measure_frames(drive))
        measure_s += seconds
        records.append(json.loads(json_text(to_jsonable(content))))
    per_frame = {"truth_frame_s": truth_s / frames, "measured_frame_s": measure_s / frames}

    def replicated(count: int) -> dict[str, dict]:  # the drives made here, as the preset's scenarios
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
    steps, drives_model = plan["steps"], plan["scenarios"] * len(plan["policies"])
    drives_control = plan["control_scenarios"] * len(plan["policies"])
    counts = {"model": drives_model * steps, "truth": drives_model * steps,
              "model_controls": len(plan["model_controls"]) * drives_control * steps,
              "scene_controls": len(plan["scene_controls"]) * drives_control * steps}
    scene = counts["truth"] * per_frame["truth_frame_s"] + counts["scene_controls"] * (
        per_frame["truth_frame_s"] + per_frame["measured_frame_s"])  # a control's frame: driven as truth, measured
    # a model world's frame: its policy and the true render its reference needs (as the truth's frame costs), then
    # its measurement; the tokenizer's round trip of the reference runs on the GPU
    engine = (counts["model"] + counts["model_controls"]) * (per_frame["truth_frame_s"] + per_frame["measured_frame_s"])
    found = {"preset": {k: v for k, v in plan.items() if k != "policies"}, "policies": len(plan["policies"]),
             "frames": counts, "measured_here": {"drives": len(drives), "frames": frames, **per_frame},
             "cpu_s": {"scene_shards": scene, "engine_shards_besides_the_gpu": engine, "report_read_s": read_s,
                       "report_judge_s": report_s},
             "least_wall_s": {"scene_shards": scene / plan["scene"], "cpu_work_on_all_cores": (scene + engine) /
                              plan["cores"]}, "cores_here": os.cpu_count()}
    print(json.dumps(found, indent=2))
    if args.out:
        args.out.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
