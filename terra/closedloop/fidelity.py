"""How faithful a world model is as a simulator: the same drives in the model, in the synthetic world itself and in
worlds known to be wrong, then the verdict (terra/closedloop/verdict.py).

Each scenario x policy is driven with the same seed in every world of the study: the world model
(:class:`~terra.closedloop.worlds.ModelWorld`), the renderer's true frames (:class:`~terra.closedloop.worlds.
TrueWorld`) and the controls (terra/closedloop/control_worlds.py, or worlds of the user's). Every drive's poses are
judged in the true scene (terra/closedloop/truth.py, and AlpaSim's scene score: terra/closedloop/alpasim_metrics.py)
and every frame of a world but the true one is measured against the true render at its pose (terra/closedloop/drive_fidelity.py). The report: per world, each statistic with its
interval and decision, whether the world is flagged, which statistics separate the model from each control; and
per policy, the model's and the truth's outcomes side by side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np

from terra.closedloop.loop import DriveSpec
from terra.closedloop.record import APP, claim_drive_folder
from terra.closedloop.run import DriveRunner, LocalDrives, RunResult, RunSettings, record_run
from terra.closedloop.verdict import WorldVerdict, judge, separation, verdict_table
from terra.closedloop.worlds import TRUTH, World
from terra.config.manifest import MANIFEST
from terra.config.output_dir import Inputs, OutputDir, claim_output_dir
from terra.core.atomic import json_text, write_text

REPORT_FILES = ("fidelity.json", "fidelity.md")
COLUMNS = ("time_in_lane", "mean_abs_lane_offset_m", "off_road", "collision", "progress_along_road_m")
SCORE = "scene_score"  # AlpaSim's, of each world's drive (terra/closedloop/alpasim_metrics.py)


@dataclass
class FidelityReport:
    """The verdict on every world but the true one (the model's first), and per policy the model's and the truth's
    outcomes."""

    verdicts: list[WorldVerdict]
    policies: dict[str, dict]

    def separations(self) -> dict[str, list[str]]:
        """Per control, the statistics that pass the model and fail the control."""
        model, *controls = self.verdicts
        return {control.world: separation(model, control) for control in controls}

    def as_dict(self) -> dict:
        return {"verdicts": [v.as_dict() for v in self.verdicts], "separations": self.separations(),
                "policies": self.policies}

    def table(self) -> str:
        """Markdown: the verdict table, the separations, then per policy the outcomes in both worlds."""
        lines = [verdict_table(self.verdicts)]
        for control, names in self.separations().items():
            lines.append(f"- the model told from **{control}** by: {', '.join(names) if names else 'no statistic'}")
        head = ("\n| policy | time in lane (model / truth) | lane offset m (model / truth) | off road (model / truth) | "
                "collisions (model / truth) | AlpaSim score (model / truth) | path distance m |")
        lines += [head, "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in self.policies.items():
            m, t = row["model"], row[TRUTH]
            lines.append(f"| {name} | {m['time_in_lane']:.3f} / {t['time_in_lane']:.3f} | "
                         f"{m['mean_abs_lane_offset_m']:.2f} / {t['mean_abs_lane_offset_m']:.2f} | "
                         f"{m['off_road']:.2f} / {t['off_road']:.2f} | {m['collision']:.2f} / {t['collision']:.2f} | "
                         f"{m[SCORE]:.2f} / {t[SCORE]:.2f} | {row['path_distance_m']:.2f} |")
        return "\n".join(lines) + "\n"


def _mean(values: list) -> float:
    values = [float(v) for v in values if v is not None]
    return float(np.mean(values)) if values else float("nan")


def policy_outcomes(model: dict[str, dict], truth: dict[str, dict]) -> dict[str, dict]:
    """Per policy, the means over its drives of the true-scene metrics in the model and in the true world, and the
    mean distance between the two paths at the same frames (drive id -> JSON content, terra/closedloop/record.py)."""
    policies: dict[str, dict] = {}
    for drive_id, m in model.items():
        t = truth.get(drive_id)
        if t is None:
            continue
        row = policies.setdefault(m["policy"], {"model": {k: [] for k in (*COLUMNS, SCORE)},
                                                TRUTH: {k: [] for k in (*COLUMNS, SCORE)},
                                                "path_distance_m": [], "drives": 0, "failed": 0})
        row["drives"] += 1
        row["failed"] += (m["status"] != "ok") + (t["status"] != "ok")
        for world, content in (("model", m), (TRUTH, t)):
            truth_metrics = content["metrics"].get("truth") or {}
            for key in COLUMNS:
                row[world][key].append(truth_metrics.get(key))
            row[world][SCORE].append((content["metrics"].get("alpasim") or {}).get("score"))
        n = min(len(m["world_poses"]), len(t["world_poses"]))
        if n:
            a, b = np.array(m["world_poses"][:n])[:, :2], np.array(t["world_poses"][:n])[:, :2]
            row["path_distance_m"].append(float(np.hypot(*(a - b).T).mean()))
    for row in policies.values():
        for world in ("model", TRUTH):
            row[world] = {k: _mean(v) for k, v in row[world].items()}
        row["path_distance_m"] = _mean(row["path_distance_m"])
    return policies


def compare(runs: dict[str, dict[str, dict]]) -> FidelityReport:
    """The report from every world's drive records (world -> drive id -> JSON content)."""
    truth = runs[TRUTH]
    verdicts = [judge(world, drives, truth) for world, drives in runs.items() if world != TRUTH]
    return FidelityReport(verdicts, policy_outcomes(runs["model"], truth))


@dataclass(frozen=True)
class FidelityFolders:
    """Where a fidelity study writes, claimed (terra/config/output_dir.py): its report in ``top``, each world's
    drives in a sub-folder of the world's name (``model/``, ``truth/``, ``frozen/``, ...)."""

    top: OutputDir
    worlds: dict[str, OutputDir]
    report: bool = True  # False for a shard of the study: its drives only (the unsharded rerun writes the report)


def claim_fidelity_folders(path: str | Path, drive_ids: list[str], worlds: Sequence[str], videos: bool = True,
                           manifest: str = MANIFEST, inputs: Inputs = (), setting: str = "output_dir") -> FidelityFolders:
    """The folders of a fidelity study of ``drive_ids`` in ``worlds`` (the model's and the truth's first), checked
    before any work; a shard (``manifest`` not ``manifest.jsonl``) writes no report."""
    report = manifest == MANIFEST
    top = claim_output_dir(path, setting, files=REPORT_FILES if report else (), folders=tuple(worlds), inputs=inputs,
                           app=APP)
    folders = {world: claim_drive_folder(top.path / world, drive_ids, videos, manifest, setting=f"{setting}/{world}")
               for world in worlds}
    return FidelityFolders(top, folders, report)


def run_fidelity(worlds: dict[str, World], specs: Sequence[DriveSpec], settings: RunSettings,
                 model_settings: dict | None = None, plan_following=None,
                 folders: FidelityFolders | None = None) -> FidelityReport | None:
    """Drive every spec (terra/closedloop/loop.py, ``drive_specs``) in every world of ``worlds`` (name -> world:
    ``model`` and ``truth`` first, then the controls), each into ``settings.output_dir``/<world>, judge them and write
    ``fidelity.json`` and ``fidelity.md`` into ``settings.output_dir``; ``plan_following`` scores every world's clips
    (terra/closedloop/plan_following.py). ``folders``: as the caller claimed them (None: claimed here, apart from the
    scenarios' files). A shard's run writes no report (None)."""
    ids = [spec.id for spec in specs]
    if folders is None:
        folders = claim_fidelity_folders(settings.output_dir, ids, list(worlds), settings.videos, settings.manifest,
                                         [item for spec in specs for item in spec.scenario.reads])
    runner = LocalDrives(worlds, specs, model_settings or {}, plan_following)
    report, _ = fidelity_run(runner, ids, settings, folders)
    return report


def fidelity_run(runner: DriveRunner, drive_ids: Sequence[str], settings: RunSettings,
                 folders: FidelityFolders) -> tuple[FidelityReport | None, dict[str, RunResult]]:
    """The drives ``drive_ids`` made by ``runner`` in every world of ``folders``, each world's run in its folder,
    then the report (None when ``folders`` are a shard's), holding the study folder's lock throughout; the report and
    each world's run. Every drive is measured (``settings.measure``)."""
    runs: dict[str, RunResult] = {}
    main = REPORT_FILES[0] if folders.report else settings.manifest  # names the lock of the study's folder
    measured = replace(settings, measure=True)
    with folders.top.hold(main) as out:
        for world, folder in folders.worlds.items():
            runs[world] = record_run(runner, world, drive_ids, measured, folder)
        if not folders.report:
            return None, runs
        report = compare({world: run.drives for world, run in runs.items()})
        write_text(out / "fidelity.json", json_text(report.as_dict(), indent=2) + "\n")
        write_text(out / "fidelity.md", report.table())
    return report, runs
