"""How faithful a world model is as a simulator: the same drives in the model and in the synthetic world itself.

Each scenario x policy is driven twice with the same seed: once on the world model's frames (:class:`ModelWorld`)
and once on the renderer's true frames (:class:`TrueWorld`), both behind the same loop and policy contract. Both
drives' poses are then judged in the true scene (terra/closedloop/truth.py, and AlpaSim's scene score:
terra/closedloop/alpasim_metrics.py). Per policy: the closed-loop metrics in both worlds (means over scenarios), the
mean distance between the two ego paths at the same frames, and over policies the Spearman rank correlation of their
time in lane in the two worlds: would a policy ranking made inside the model hold in reality?
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from terra.closedloop.loop import DriveSpec
from terra.closedloop.record import APP, claim_drive_folder
from terra.closedloop.run import DriveRunner, LocalDrives, RunResult, RunSettings, record_run
from terra.closedloop.worlds import World
from terra.config.manifest import MANIFEST
from terra.config.output_dir import Inputs, OutputDir, claim_output_dir
from terra.core.atomic import json_text, write_text

REPORT_FILES = ("fidelity.json", "fidelity.md")
WORLDS = ("model", "truth")  # each world's drives go to a sub-folder of this name
COLUMNS = ("time_in_lane", "mean_abs_lane_offset_m", "off_road", "collision", "progress_along_road_m")
SCORE = "scene_score"  # AlpaSim's, of each world's drive (terra/closedloop/alpasim_metrics.py)


@dataclass
class FidelityReport:
    """Per policy, both worlds' metrics and the paths' distance; the rank correlation over policies."""

    policies: dict[str, dict]
    spearman_time_in_lane: float | None
    drives: int

    def table(self) -> str:
        """A Markdown table: per policy, time in lane / lane offset / off road / collisions / AlpaSim's scene score
        in both worlds."""
        head = ("| policy | time in lane (model) | time in lane (truth) | lane offset m (model / truth) | "
                "off road (model / truth) | collisions (model / truth) | AlpaSim score (model / truth) | "
                "path distance m |")
        lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, row in self.policies.items():
            m, t = row["model"], row["truth"]
            lines.append(f"| {name} | {m['time_in_lane']:.3f} | {t['time_in_lane']:.3f} | "
                         f"{m['mean_abs_lane_offset_m']:.2f} / {t['mean_abs_lane_offset_m']:.2f} | "
                         f"{m['off_road']:.2f} / {t['off_road']:.2f} | {m['collision']:.2f} / {t['collision']:.2f} | "
                         f"{m[SCORE]:.2f} / {t[SCORE]:.2f} | {row['path_distance_m']:.2f} |")
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
        row = policies.setdefault(m["policy"], {"model": {k: [] for k in (*COLUMNS, SCORE)},
                                                "truth": {k: [] for k in (*COLUMNS, SCORE)},
                                                "path_distance_m": [], "drives": 0, "failed": 0})
        row["drives"] += 1
        row["failed"] += (m["status"] != "ok") + (t["status"] != "ok")
        for world, content in (("model", m), ("truth", t)):
            truth_metrics = content["metrics"].get("truth") or {}
            for key in COLUMNS:
                row[world][key].append(truth_metrics.get(key))
            row[world][SCORE].append((content["metrics"].get("alpasim") or {}).get("score"))
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


@dataclass(frozen=True)
class FidelityFolders:
    """Where a fidelity study writes, claimed (terra/config/output_dir.py): its report in ``top``, each world's
    drives in a sub-folder of its own (``model/``, ``truth/``)."""

    top: OutputDir
    worlds: dict[str, OutputDir]
    report: bool = True  # False for a shard of the study: its drives only (the unsharded rerun writes the report)


def claim_fidelity_folders(path: str | Path, drive_ids: list[str], videos: bool = True, manifest: str = MANIFEST,
                           inputs: Inputs = (), setting: str = "output_dir") -> FidelityFolders:
    """The folders of a fidelity study of ``drive_ids``, checked before any work; a shard (``manifest`` not
    ``manifest.jsonl``) writes no report."""
    report = manifest == MANIFEST
    top = claim_output_dir(path, setting, files=REPORT_FILES if report else (), folders=WORLDS, inputs=inputs,
                           app=APP)
    worlds = {world: claim_drive_folder(top.path / world, drive_ids, videos, manifest, setting=f"{setting}/{world}")
              for world in WORLDS}
    return FidelityFolders(top, worlds, report)


def run_fidelity(model_world: World, true_world: World, specs: Sequence[DriveSpec], settings: RunSettings,
                 model_settings: dict | None = None, plan_following=None,
                 folders: FidelityFolders | None = None) -> FidelityReport | None:
    """Drive every spec (terra/closedloop/loop.py, ``drive_specs``) in both worlds (``settings.output_dir``/model
    and /truth), compare, and write ``fidelity.json`` and ``fidelity.md`` into ``settings.output_dir``;
    ``plan_following`` scores both worlds' clips (terra/closedloop/plan_following.py). ``folders``: as the caller
    claimed them (None: claimed here, apart from the scenarios' files). A shard's run writes no report (None)."""
    ids = [spec.id for spec in specs]
    if folders is None:
        folders = claim_fidelity_folders(settings.output_dir, ids, settings.videos, settings.manifest,
                                         [item for spec in specs for item in spec.scenario.reads])
    runner = LocalDrives({"model": model_world, "truth": true_world}, specs, model_settings or {}, plan_following)
    report, _ = fidelity_run(runner, ids, settings, folders)
    return report


def fidelity_run(runner: DriveRunner, drive_ids: Sequence[str], settings: RunSettings,
                 folders: FidelityFolders) -> tuple[FidelityReport | None, dict[str, RunResult]]:
    """The drives ``drive_ids`` made by ``runner`` in both worlds, each world's run in its folder, then the report
    (None when ``folders`` are a shard's), holding the study folder's lock throughout; the report and each world's
    run."""
    runs: dict[str, RunResult] = {}
    main = REPORT_FILES[0] if folders.report else settings.manifest  # names the lock of the study's folder
    with folders.top.hold(main) as out:
        for world in WORLDS:
            runs[world] = record_run(runner, world, drive_ids, settings, folders.worlds[world])
        if not folders.report:
            return None, runs
        report = compare(runs["model"].drives, runs["truth"].drives)
        write_text(out / "fidelity.json", json_text({"policies": report.policies,
                                                    "spearman_time_in_lane": report.spearman_time_in_lane,
                                                    "drives": report.drives}, indent=2) + "\n")
        write_text(out / "fidelity.md", report.table())
    return report, runs
