"""How faithful a world model is as a simulator: the same drives in the model and in the synthetic world itself.

Each scenario x policy is driven twice with the same seed: once on the world model's frames (:class:`ModelWorld`)
and once on the renderer's true frames (:class:`TrueWorld`), both behind the same loop and policy contract. Both
drives' poses are then judged in the true scene (terra/closedloop/truth.py). Per policy: the closed-loop metrics
in both worlds (means over scenarios), the mean distance between the two ego paths at the same frames, and over
policies the Spearman rank correlation of their time in lane in the two worlds: would a policy ranking made inside
the model hold in reality?
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from terra.closedloop.loop import DriveSpec
from terra.closedloop.plans import Policy
from terra.closedloop.run import RunSettings, drive_and_record
from terra.closedloop.scenarios import Scenario
from terra.closedloop.worlds import World
from terra.core.atomic import write_text

COLUMNS = ("time_in_lane", "mean_abs_lane_offset_m", "off_road", "collision", "progress_along_road_m")


@dataclass
class FidelityReport:
    """Per policy, both worlds' metrics and the paths' distance; the rank correlation over policies."""

    policies: dict[str, dict]
    spearman_time_in_lane: float | None
    drives: int

    def table(self) -> str:
        """A Markdown table: per policy, time in lane / lane offset / off road / collisions in both worlds."""
        head = ("| policy | time in lane (model) | time in lane (truth) | lane offset m (model / truth) | "
                "off road (model / truth) | collisions (model / truth) | path distance m |")
        lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in self.policies.items():
            m, t = row["model"], row["truth"]
            lines.append(f"| {name} | {m['time_in_lane']:.3f} | {t['time_in_lane']:.3f} | "
                         f"{m['mean_abs_lane_offset_m']:.2f} / {t['mean_abs_lane_offset_m']:.2f} | "
                         f"{m['off_road']:.2f} / {t['off_road']:.2f} | {m['collision']:.2f} / {t['collision']:.2f} | "
                         f"{row['path_distance_m']:.2f} |")
        rho = "n/a" if self.spearman_time_in_lane is None else f"{self.spearman_time_in_lane:.3f}"
        return "\n".join(lines) + f"\n\nSpearman rank correlation of time in lane, model vs truth: {rho}\n"


def _mean(values: list) -> float:
    values = [float(v) for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def compare(model: dict[str, dict], truth: dict[str, dict]) -> FidelityReport:
    """The report from both runs' drive records (drive id -> JSON content, terra/closedloop/record.py)."""
    from scipy.stats import spearmanr

    policies: dict[str, dict] = {}
    for drive_id, m in model.items():
        t = truth.get(drive_id)
        if t is None:
            continue
        row = policies.setdefault(m["policy"], {"model": {k: [] for k in COLUMNS}, "truth": {k: [] for k in COLUMNS},
                                                "path_distance_m": [], "drives": 0, "failed": 0})
        row["drives"] += 1
        row["failed"] += (m["status"] != "ok") + (t["status"] != "ok")
        for world, content in (("model", m), ("truth", t)):
            truth_metrics = content["metrics"].get("truth") or {}
            for key in COLUMNS:
                row[world][key].append(truth_metrics.get(key))
        n = min(len(m["world_poses"]), len(t["world_poses"]))
        if n:
            a, b = np.array(m["world_poses"][:n])[:, :2], np.array(t["world_poses"][:n])[:, :2]
            row["path_distance_m"].append(float(np.hypot(*(a - b).T).mean()))
    for row in policies.values():
        for world in ("model", "truth"):
            row[world] = {k: _mean(v) for k, v in row[world].items()}
        row["path_distance_m"] = _mean(row["path_distance_m"])
    rho = None
    if len(policies) >= 2:
        x = [row["model"]["time_in_lane"] for row in policies.values()]
        y = [row["truth"]["time_in_lane"] for row in policies.values()]
        if np.ptp(x) > 0 and np.ptp(y) > 0:  # a rank correlation needs some spread on both sides
            value = spearmanr(x, y).statistic
            rho = float(value) if np.isfinite(value) else None
    return FidelityReport(policies, rho, sum(row["drives"] for row in policies.values()))


def run_fidelity(model_world: World, true_world: World, scenarios: Sequence[Scenario],
                 policies: dict[str, Callable[[], Policy]], settings: RunSettings, seed: int = 0,
                 model_settings: dict | None = None, plan_following=None) -> FidelityReport:
    """Drive every scenario x policy in both worlds (``settings.output_dir``/model and /truth), compare, and write
    ``fidelity.json`` and ``fidelity.md`` into ``settings.output_dir``; ``plan_following`` scores both worlds'
    clips (terra/closedloop/plan_following.py)."""
    specs = [DriveSpec(s, name, factory, seed=seed + i) for i, s in enumerate(scenarios)
             for name, factory in policies.items()]
    out = Path(settings.output_dir).expanduser()
    runs = {}
    for name, world, extra in (("model", model_world, model_settings or {}), ("truth", true_world, {})):
        result = drive_and_record(world, specs, RunSettings(**{**settings.__dict__, "output_dir": out / name}), extra,
                                  plan_following)
        runs[name] = result.drives
    report = compare(runs["model"], runs["truth"])
    write_text(out / "fidelity.json", json.dumps({"policies": report.policies,
                                                  "spearman_time_in_lane": report.spearman_time_in_lane,
                                                  "drives": report.drives}, indent=2) + "\n")
    write_text(out / "fidelity.md", report.table())
    return report
