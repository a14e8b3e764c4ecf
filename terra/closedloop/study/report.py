"""How faithful a world model is: the same drives in the model, the truth and known-wrong worlds, judged."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Callable, Hashable, Sequence

import numpy as np

from terra.closedloop.policies.builtin import NO_PIXELS, PROBE_POLICIES
from terra.closedloop.loop import DriveSpec
from terra.closedloop.recording.files import APP, claim_drive_folder
from terra.closedloop.recording.run import DriveRunner, LocalDrives, RunResult, RunSettings, record_run
from terra.closedloop.study.control_worlds import MODEL_WORLDS
from terra.closedloop.study.exploit import ExploitStudy, exploit_lines, exploit_study
from terra.closedloop.study.horizons import cut_at, within, world_horizon
from terra.closedloop.study.report_text import (
    headline, horizon_table, legend, plain, probe_line, run_lines, separation_lines, shown, text_table,
    verdict_table, within_line, world_rows,
)
from terra.closedloop.study.statistics import STATISTICS, following_gain, metric_value, value_or_reason
from terra.closedloop.study.verdict import (
    MIN_SCENARIOS, NO_PAIRS, WorldVerdict, judge_pairs, pairs_of, path_distance_m,
)
from terra.closedloop.worlds import TRUTH, World
from terra.config.manifest import MANIFEST
from terra.config.output_dir import Inputs, OutputDir, claim_output_dir
from terra.core.atomic import json_text, write_text
from terra.stats import FAIL, PASS, Bootstrap, mean, paired_difference

REPORT_FILES = ("fidelity.json", "fidelity.md")
SHARD_WORLDS = ("all", "engine", "scene")  # which of a study's worlds a process drives (in_shard)
COLUMNS = {  # per policy: name -> its title in fidelity.md and where a drive's record holds it (metrics block, metric)
    "time_in_lane": ("time in lane", ("truth", "time_in_lane")),  # truth
    "mean_abs_lane_offset_m": ("lane offset m", ("truth", "mean_abs_lane_offset_m")),
    "off_road": ("off road", ("truth", "off_road")),
    "collision": ("collisions", ("truth", "collision")),
    "progress_along_road_m": ("progress m", ("truth", "progress_along_road_m")),
    "scene_score": ("AlpaSim score", ("alpasim", "score")),  # alpasim
}


@dataclass
class StudyReport:
    """The verdict on every world but the true one, per-policy outcomes, and the exploitability study if run."""

    verdicts: list[WorldVerdict]
    policies: dict[str, dict]
    exploitability: ExploitStudy | None = None
    settings: dict = field(default_factory=dict)  # the run's settings, as the report lists them (study_settings_of)

    def separations(self) -> dict[str, list[str]]:
        """Per control, the statistics that pass the model and fail the control."""
        model, *controls = self.verdicts
        return {control.world: [s.name for s in STATISTICS if model.decisions[s.name] == PASS
                                and control.decisions[s.name] == FAIL] for control in controls}

    def sentences(self) -> list[str]:
        """A world's sentences each (the model's first), then the probes' lines."""
        lines = []
        for v in self.verdicts:
            lines.append(f"- {headline(v)}")
            inner = within_line(v)
            if inner is not None:
                lines.append(inner)
        return lines + [probe_line(name, row["difference"]) for name, row in self.policies.items()
                        if name in PROBE_POLICIES]

    def as_dict(self) -> dict:
        return {"headline": [headline(v) for v in self.verdicts], "settings": self.settings,
                "verdicts": [v.as_dict() for v in self.verdicts], "separations": self.separations(),
                "policies": {name: {**{k: v for k, v in row.items() if k != "following_gain_dx_reason"},
                                    "difference": {k: None if v is None else v.as_dict()
                                                   for k, v in row["difference"].items()},
                                    "following_gain_dx": {**({} if row["following_gain_dx"] is None
                                                             else row["following_gain_dx"].as_dict()),
                                                          "reason": row["following_gain_dx_reason"]}}
                             for name, row in self.policies.items()},
                "exploitability": None if self.exploitability is None else self.exploitability.as_dict()}

    def opening(self) -> list[str]:
        """A sentence per world, the probes' lines, then the run's settings."""
        return ["# Fidelity verdict", "", *self.sentences(), "", "## Run", *run_lines(self.settings)]

    def terminal(self) -> str:
        """What the terminal shows, as plain text."""
        lines = ["Fidelity verdict (the whole report: fidelity.md)", "", text_table(world_rows(self.verdicts)), "",
                 *separation_lines(self.separations(), self.verdicts), "", *self.sentences()]
        return "\n".join(plain(line) for line in lines)

    def table(self) -> str:
        """Markdown (fidelity.md)."""
        lines = [*self.opening(), "", "## Statistics", *legend(), "", "## Fidelity horizons",
                 *horizon_table(self.verdicts), "", "## Verdicts", verdict_table(self.verdicts),
                 *separation_lines(self.separations(), self.verdicts), "", "## Policies"]
        titles = " | ".join(f"{title} (model / truth; model - truth)" for title, _ in COLUMNS.values())
        lines += [f"\n| policy | {titles} | path distance m | following gain dx (model) |",
                  "|---|" + "---:|" * (len(COLUMNS) + 2)]
        for name, row in self.policies.items():
            cells = [f"{row['model'][key]:.3f} / {row[TRUTH][key]:.3f}; {shown(row['difference'][key])}"
                     for key in COLUMNS]
            label = name if row["reads_pixels"] else f"{name} (reads no pixels)"
            gain, why = row["following_gain_dx"], row["following_gain_dx_reason"]
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {shown(row['difference']['path_distance_m'])} | "
                         f"{shown(gain)}{f': {why}' if why else ''} |")
        if self.exploitability is not None:
            lines += ["", exploit_lines(self.exploitability)]
        return "\n".join(lines) + "\n"


def policy_outcomes(model: dict[str, dict], truth: dict[str, dict],
                    bootstrap: Bootstrap = Bootstrap()) -> dict[str, dict]:
    """Per policy of the model's drives (drive id -> JSON content, files), over the drives made well in both worlds."""
    pairs = pairs_of(model, truth)
    policies: dict[str, dict] = {}
    for drive_id, record in model.items():
        row = policies.setdefault(record["policy"], {"reads_pixels": record["policy"] not in NO_PIXELS, "drives": 0,
                                                     "failed": 0})
        row["drives"] += 1
        row["failed"] += (record["status"] != "ok") + (truth.get(drive_id, {}).get("status") != "ok")
    for name, row in policies.items():
        mine = [p for p in pairs if p.world["policy"] == name]
        scenarios = [p.scenario for p in mine]
        values = {side: {key: np.array([metric_value(getattr(p, side), *source) for p in mine])
                         for key, (_, source) in COLUMNS.items()} for side in ("world", "truth")}
        for world, side in (("model", "world"), (TRUTH, "truth")):
            row[world] = {key: _mean(v) for key, v in values[side].items()}
        row["difference"] = {key: paired_difference(scenarios, values["world"][key], values["truth"][key], bootstrap)
                             for key in COLUMNS} if mine else {key: None for key in COLUMNS}
        row["difference"]["path_distance_m"] = (mean(scenarios, np.array([path_distance_m(p) for p in mine]),
                                                     bootstrap) if mine else None)
        row["following_gain_dx"], row["following_gain_dx_reason"] = (
            value_or_reason(following_gain("dx"), mine, bootstrap) if mine else (None, NO_PAIRS))
    return policies


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else float("nan")


def study_settings_of(runs: dict[str, dict[str, dict]]) -> dict:
    """What the study was, read from its drive records (world -> drive id -> JSON content)."""
    model = list(runs["model"].values())
    return {"worlds": ", ".join(f"{world} ({len(drives)} drives)" for world, drives in runs.items()),
            "scenarios": len({r["scenario"] for r in model}),
            "policies": ", ".join(dict.fromkeys(r["policy"] for r in model)),
            "steps per drive": max((r.get("steps") or 0 for r in model), default=0),
            "seeds": len({r.get("seed") for r in model}) // max(1, len({r["scenario"] for r in model})),
            "vehicle": ", ".join(sorted({str(r.get("vehicle")) for r in model})),
            "verdict": f"95 % cluster bootstrap over scenarios ({Bootstrap().draws} draws), widened for few "
                       f"scenarios; at least {MIN_SCENARIOS} scenarios to decide"}


def world_verdict(world: str, drives: dict[str, dict], truth: dict[str, dict], within_horizon: bool = False,
                  bootstrap: Bootstrap = Bootstrap()) -> WorldVerdict:
    """A world's verdict with its fidelity horizon, and with ``within_horizon`` the verdict within it too."""
    pairs = pairs_of(drives, truth)
    verdict = replace(judge_pairs(world, pairs, bootstrap), horizon=world_horizon(pairs, bootstrap))
    seconds = cut_at(verdict.horizon, pairs) if within_horizon else None
    if seconds is None:
        return verdict
    kept = [s for s in STATISTICS if s.cut]
    return replace(verdict, within=judge_pairs(world, within(pairs, seconds), bootstrap, kept), within_s=seconds)


def compare(runs: dict[str, dict[str, dict]], exploit: ExploitStudy | None = None,
            within_horizon: bool = False) -> StudyReport:
    """The report from every world's drive records; ``within_horizon``: judge each world within its horizon too."""
    truth = runs[TRUTH]
    verdicts = [world_verdict(world, drives, truth, within_horizon) for world, drives in runs.items()
                if world != TRUTH]
    return StudyReport(verdicts, policy_outcomes(runs["model"], truth), exploit, study_settings_of(runs))


@dataclass(frozen=True)
class StudyFolders:
    """Where a fidelity study writes, claimed."""

    top: OutputDir
    worlds: dict[str, OutputDir]  # the worlds this run drives (a shard of shard_worlds: some of the study's)
    drive_ids: dict[str, list[str]]  # world -> the drives it makes (study_drives)
    report: bool = True  # False for a shard of the study: its drives only (the unsharded rerun writes the report)
    lock: str = REPORT_FILES[0]  # the file naming the lock of ``top`` this run holds (one run of each part at a time)


def in_shard(world: str, shard_worlds: str) -> bool:
    """Whether a process of ``shard_worlds`` (:data:`SHARD_WORLDS`) drives the study's ``world``."""
    return shard_worlds == "all" or (world in MODEL_WORLDS) == (shard_worlds == "engine")


def study_drives(drives: Sequence[tuple[Hashable, int, str]], scenarios: Sequence[Hashable], worlds: Sequence[str],
                 num_control_scenarios: int | None = None, num_control_seeds: int | None = None
                 ) -> dict[str, list[str]]:
    """Per world, the drive ids it makes from ``drives``: all in model and truth, a subset in each control."""
    first = set(scenarios if num_control_scenarios is None else scenarios[:num_control_scenarios])
    seeds = float("inf") if num_control_seeds is None else num_control_seeds
    controls = [drive for scenario, replica, drive in drives if scenario in first and replica < seeds]
    every = [drive for _, _, drive in drives]
    return {world: every if world in ("model", TRUTH) else controls for world in worlds}


def study_plan(drive_ids: dict[str, list[str]], num_steps: int) -> str:
    """One line, before any world opens."""
    engine = sum(len(ids) for world, ids in drive_ids.items() if world in MODEL_WORLDS) * num_steps
    worlds = ", ".join(f"{world} {len(ids) * num_steps}" for world, ids in drive_ids.items())
    return (f"terra-drive: fidelity study: frames per world: {worlds}; the world model draws {engine} of them (the "
            "long part on a CPU, first: its bar's ETA shows after one step), the others are rendered and measured")


def claim_study_folders(path: str | Path, drive_ids: dict[str, list[str]], videos: bool = True,
                        manifest: str = MANIFEST, inputs: Inputs = (), setting: str = "output_dir",
                        shard_worlds: str = "all") -> StudyFolders:
    """The folders of a fidelity study of ``drive_ids`` that this run drives, checked before any work."""
    report = manifest == MANIFEST and shard_worlds == "all"
    drive_ids = {world: ids for world, ids in drive_ids.items() if in_shard(world, shard_worlds)}
    top = claim_output_dir(path, setting, files=REPORT_FILES if report else (), folders=tuple(drive_ids),
                           inputs=inputs, app=APP)
    folders = {world: claim_drive_folder(top.path / world, ids, videos, manifest, setting=f"{setting}/{world}")
               for world, ids in drive_ids.items()}
    lock = REPORT_FILES[0] if report else manifest if shard_worlds == "all" else f"{shard_worlds}.{manifest}"
    return StudyFolders(top, folders, drive_ids, report, lock)


def run_study(worlds: dict[str, World], specs: Sequence[DriveSpec], settings: RunSettings,
              model_settings: dict | None = None, plan_following=None,
              folders: StudyFolders | None = None, exploit: bool = False,
              num_control_scenarios: int | None = None, num_control_seeds: int | None = None,
              within_horizon: bool = False) -> StudyReport | None:
    """Drive every spec in every world into ``settings.output_dir``/<world>, judge them and write the report."""
    if folders is None:
        scenarios = list(dict.fromkeys(spec.scenario.id for spec in specs))
        ids = study_drives([(spec.scenario.id, spec.replica, spec.id) for spec in specs], scenarios, list(worlds),
                           num_control_scenarios, num_control_seeds)
        folders = claim_study_folders(settings.output_dir, ids, settings.videos, settings.manifest,
                                      [item for spec in specs for item in spec.scenario.reads])
    runner = LocalDrives(worlds, specs, model_settings or {}, plan_following)
    study = partial(exploit_study, worlds, specs, settings) if exploit else None
    report, _ = study_run(runner, settings, folders, study, within_horizon)
    return report


def measured_settings(settings: RunSettings) -> RunSettings:
    """How a study's drives run."""
    return replace(settings, measure=True, model_worlds=MODEL_WORLDS)


def study_run(runner: DriveRunner, settings: RunSettings, folders: StudyFolders,
              exploit: Callable[[], ExploitStudy] | None = None, within_horizon: bool = False
              ) -> tuple[StudyReport | None, dict[str, RunResult]]:
    """Every world's drives made by ``runner``, then the report (None for a shard), under the study's lock."""
    runs: dict[str, RunResult] = {}
    measured = measured_settings(settings)
    with folders.top.hold(folders.lock) as out:
        for world, folder in folders.worlds.items():
            runs[world] = record_run(runner, world, folders.drive_ids[world], measured, folder)
        if not folders.report:
            return None, runs
        study = None if exploit is None else exploit()
        report = compare({world: run.drives for world, run in runs.items()}, study, within_horizon)
        write_text(out / "fidelity.json", json_text(report.as_dict(), indent=2) + "\n")
        write_text(out / "fidelity.md", report.table())
    return report, runs
