"""How faithful a world model is: the same drives in the model, the truth and known-wrong worlds, judged."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Hashable, Sequence

import numpy as np

from terra.closedloop.policies.builtin import NO_PIXELS, PROBE_POLICIES
from terra.closedloop.loop import DriveSpec
from terra.closedloop.recording.files import APP, claim_drive_folder
from terra.closedloop.recording.run import DriveRunner, LocalDrives, RunResult, RunSettings, record_run
from terra.closedloop.study.control_worlds import MODEL_WORLDS
from terra.closedloop.study.exploit import ExploitStudy, exploit_lines
from terra.closedloop.study.horizons import PARTS, WorldHorizon, cut_at, within, world_horizon
from terra.closedloop.study.statistics import (
    OUTCOMES, RANK_METRIC, STATISTICS, finite_mean, following_gain, paired_values, statistic, value_or_reason,
)
from terra.closedloop.study.verdict import (
    FLAGGED, MIN_SCENARIOS, NO_PAIRS, PASSED, TOO_FEW, WorldVerdict, judge_pairs, pairs_of, path_distance_m,
)
from terra.closedloop.worlds import TRUTH, World
from terra.config.manifest import MANIFEST
from terra.config.output_dir import Inputs, OutputDir, claim_output_dir
from terra.core.atomic import json_text, write_text
from terra.fidelity.horizon import horizon_text, shown_seconds
from terra.stats import FAIL, INCONCLUSIVE, PASS, Bootstrap, Interval, mean, paired_difference

REPORT_FILES = ("fidelity.json", "fidelity.md")
COLUMNS = {  # per policy: name -> its title in fidelity.md and where a drive's record holds it (metrics block, metric)
    "time_in_lane": ("time in lane", ("truth", "time_in_lane")),  # truth
    "mean_abs_lane_offset_m": ("lane offset m", ("truth", "mean_abs_lane_offset_m")),
    "off_road": ("off road", ("truth", "off_road")),
    "collision": ("collisions", ("truth", "collision")),
    "progress_along_road_m": ("progress m", ("truth", "progress_along_road_m")),
    "scene_score": ("AlpaSim score", ("alpasim", "score")),  # alpasim
}

PROBE_REWARD = ("scene_score", "time_in_lane", "progress_along_road_m")  # a probe's outcomes compared world - truth
MARKS = {PASS: "pass", FAIL: "**fail**", INCONCLUSIVE: "?", TOO_FEW: "too few"}
MOST_SCENARIOS = 100  # a statistic that would need more to decide is said to sit near its band's edge
GPU_PRESET = "study=gpu (16 scenarios x 20 s on a GPU)"
GPU_PRESET_SIZE = (16, 200)  # its scenarios and steps: a study as large is not told to run it


def shown(value: Interval | None) -> str:
    """An interval as the tables write it: ``estimate [low, high]``, ``n/a`` without an estimate."""
    return "n/a" if value is None or not np.isfinite(value.estimate) else str(value)


def plain(text: str) -> str:
    """Markdown's bold marks taken out: the terminal's text."""
    return text.replace("**", "")


def _value(verdict: WorldVerdict, name: str) -> str:
    band = statistic(name).band
    return f"{name} {shown(verdict.values[name])}, band [{band[0]:g}, {band[1]:g}]"


def _margin(verdict: WorldVerdict, name: str) -> float:
    """How far inside its band a passing statistic's interval lies (m or its unit; the smaller the closer)."""
    low, high = statistic(name).band
    value = verdict.values[name]
    return min(value.low - low, high - value.high)


def horizon_sentence(world: str, horizon: WorldHorizon | None) -> str:
    """How long the world stays a simulator: its closed-loop median horizon with its interval and 10th percentile."""
    found = None if horizon is None else horizon.closed_loop
    if found is None:
        return ""
    median, p10, longest = found.median, found.p10, found.longest_s
    if not np.isfinite(median.estimate):
        return (f"**{world}** stays a simulator for a median of at least its drives' {longest:g} s ({found.departed} "
                f"of {found.drives} drives' roads departed from the truth's; 10th percentile "
                f"{shown_seconds(p10.estimate, longest)}). ")
    bounds = ", ".join(shown_seconds(v, longest) for v in (median.low, median.high))
    return (f"**{world}** stays a simulator for a median of {median.estimate:.1f} s [{bounds}] (10th percentile "
            f"{shown_seconds(p10.estimate, longest)}; {found.departed} of {found.drives} drives departed). ")


def scenarios_to_decide(name: str, value: Interval, scenarios: int) -> float:
    """About how many scenarios would decide statistic ``name`` of interval ``value`` if its estimate held."""
    low, high = statistic(name).band
    if not (np.isfinite(value.low) and np.isfinite(value.high)):
        return float("inf")
    edge = min((low, high), key=lambda e: abs(value.estimate - e))
    distance = abs(value.estimate - edge)
    width = value.estimate - value.low if edge < value.estimate else value.high - value.estimate
    return float("inf") if distance <= 0 else scenarios * (width / distance) ** 2


def next_step(verdict: WorldVerdict) -> str:
    """What would decide an undecided world."""
    needs = {name: scenarios_to_decide(name, verdict.values[name], verdict.scenarios[name])
             for name in verdict.undecided if verdict.decisions[name] == INCONCLUSIVE and name not in verdict.reasons}
    finite = {name: n for name, n in needs.items() if n <= MOST_SCENARIOS}
    parts = []
    if verdict.too_few is not None:
        parts.append(f"num_scenarios={MIN_SCENARIOS} or more (every statistic needs {MIN_SCENARIOS} scenarios)")
    if finite:
        most = max(finite, key=finite.get)
        parts.append(f"about num_scenarios={int(np.ceil(finite[most]))} if the estimates held (the widest: {most})")
    edge = [name for name in needs if name not in finite]
    if edge:
        parts.append(f"{', '.join(edge)} sit{'s' * (len(edge) == 1)} near a band's edge (more than "
                     f"{MOST_SCENARIOS} scenarios): more narrow the interval but may not decide it")
    if any("23 steps" in reason for reason in verdict.reasons.values()):
        parts.append("num_steps=23 or more for the lag")
    if max(verdict.scenarios.values(), default=0) < GPU_PRESET_SIZE[0] or verdict.steps < GPU_PRESET_SIZE[1]:
        parts.append(f"or {GPU_PRESET}, which decides what short drives cannot"
                     + (" (the demo world models' verdicts over 20 s: docs/fidelity.md, \"The demo model's verdict\")"
                        if verdict.world == "model" else ""))
    return f" To decide it: {'; '.join(parts)}." if parts else ""


def verdict_sentence(verdict: WorldVerdict) -> str:
    """Is the world a simulator of the synthetic world over its whole drives, and which statistic decided it."""
    if verdict.state == FLAGGED:
        first, *rest = verdict.flagged_by
        more = f" (and {len(rest)} more: {', '.join(rest)})" if rest else ""
        return f"**{verdict.world}** is not a simulator of the synthetic world: {_value(verdict, first)} fails{more}."
    if verdict.state == PASSED:
        closest = min(verdict.decisions, key=lambda name: _margin(verdict, name))
        return (f"**{verdict.world}** passes as a simulator of the synthetic world, every one of "
                f"{len(verdict.decisions)} statistics decided inside its band (the closest to an edge: "
                f"{_value(verdict, closest)}).")
    others = [name for name in verdict.undecided if verdict.decisions[name] != TOO_FEW]
    listed = ", ".join(f"{name} ({verdict.reasons.get(name, 'interval straddles the band')})" for name in others)
    few = verdict.too_few
    small = (f"the study is too small to judge it ({few} scenario{'s' * (few != 1)}, fewer than {MIN_SCENARIOS})"
             if few is not None else "the study is too small to judge it" if verdict.too_small else "")
    undecided = f"{len(others)} statistic{'s' * (len(others) != 1)} undecided: {listed}" if others else ""
    return (f"**{verdict.world}** is undecided: nothing fails, but {'; '.join(p for p in (small, undecided) if p)}."
            + next_step(verdict))


def headline(verdict: WorldVerdict) -> str:
    """A world's sentences: how long it stays a simulator, then its verdict over the whole drives."""
    return horizon_sentence(verdict.world, verdict.horizon) + verdict_sentence(verdict)


def within_line(verdict: WorldVerdict) -> str | None:
    """The verdict within the world's horizon, when one was judged."""
    if verdict.within is None:
        return None
    inner = verdict_sentence(verdict.within).replace(f"**{verdict.world}**", f"**{verdict.world}** within its "
                                                     f"first {verdict.within_s:.1f} s")
    return f"  - {inner}"


def legend() -> list[str]:
    """Every judged statistic: its band, what it rests on and what it shows; then how decisions are made."""
    lines = ["| statistic | band | rests on | what it shows |", "|---|---|---|---|"]
    lines += [f"| {s.name} | [{s.band[0]:g}, {s.band[1]:g}] | {s.rests_on} | {s.meaning} |" for s in STATISTICS]
    lines += ["", "Each interval is a 95 % cluster bootstrap over scenarios, widened for their number (Student's t "
                  "over the scenarios); **pass**: inside the band, **fail**: entirely outside, **?**: it straddles an "
                  f"edge or has no value (reason below), **too few**: fewer than {MIN_SCENARIOS} scenarios, not "
                  "decided. A world is flagged when a statistic fails, passed when every one passes, undecided "
                  f"otherwise. The ranking is by each policy's mean {RANK_METRIC}. A world's frames are compared "
                  "with the true frames at the same poses, for a world model the true frames through its tokenizer "
                  "(what a perfect model of that tokenizer shows). The fidelity horizon is the time "
                  "a drive's road departs from the truth's (the lane 10 m ahead 0.5 m off, or the forward motion "
                  "half off, for 0.5 s): its median and 10th percentile over drives (Kaplan-Meier, censored at the "
                  "drive's end) with intervals over scenarios."]
    return lines


def horizon_table(verdicts: Sequence[WorldVerdict]) -> list[str]:
    """Markdown."""
    lines = ["| world | drives | horizon | surviving at 1 / 2 / 5 / 10 / 20 s |", "|---|---|---|---|"]
    for v in verdicts:
        for name, found in ({} if v.horizon is None else v.horizon.parts()).items():
            surviving = " / ".join(f"{found.curve[int(round(t * 10)) - 1]:.2f}" if t * 10 <= len(found.curve) else "-"
                                   for t in (1, 2, 5, 10, 20))
            lines.append(f"| {v.world} | {PARTS[name]} | {horizon_text(found)} | {surviving} |")
    return lines


def verdict_table(verdicts: Sequence[WorldVerdict]) -> str:
    """Markdown: a row per statistic (its band), a column per world: the estimate, its interval and the decision."""
    worlds = " | ".join(v.world for v in verdicts)
    lines = [f"| statistic | band | {worlds} |", "|---|---|" + "---|" * len(verdicts)]
    for s in STATISTICS:
        cells = [f"{shown(v.values[s.name])} {MARKS[v.decisions[s.name]]}" for v in verdicts]
        lines.append(f"| {s.name} | [{s.band[0]:g}, {s.band[1]:g}] | " + " | ".join(cells) + " |")
    lines.append("")
    for v in verdicts:
        failed = f" by {', '.join(v.flagged_by)}" if v.flagged_by else ""
        lines.append(f"- **{v.world}** ({v.drives} drives): {v.state}{failed}; undecided: "
                     f"{', '.join(v.undecided) or 'none'}")
        lines += [f"  - {name}: {'n/a' if not np.isfinite(v.values[name].estimate) else MARKS[v.decisions[name]]}"
                  f" because {reason}" for name, reason in v.reasons.items()]
        lines.append(f"  - outcome statistics ({OUTCOMES}) rest on: {', '.join(v.policies) or 'no policy'}")
        if v.ranking is not None:
            order = ", ".join(f"{p} {w:.3f} / {t:.3f}" for p, w, t in zip(v.ranking.policies, v.ranking.world,
                                                                         v.ranking.truth))
            ties = v.ranking.ties
            tied = (f"; {len(ties)} pair{'s' * (len(ties) != 1)} tie in truth: "
                    + ", ".join(f"{a} = {b}" for a, b in ties)) if ties else "; no two policies tie in truth"
            lines.append(f"  - ranking by {RANK_METRIC} (world / truth): {order}{tied}")
    for title, table in (("measured (not judged)", "measured"), ("world - truth, paired drives", "differences")):
        names = list(dict.fromkeys(name for v in verdicts for name in getattr(v, table)))
        lines += ["", f"| {title} | {worlds} |", "|---|" + "---|" * len(verdicts)]
        lines += [f"| {name} | " + " | ".join(shown(getattr(v, table).get(name)) for v in verdicts) + " |"
                  for name in names]
    return "\n".join(lines) + "\n"


def world_rows(verdicts: Sequence[WorldVerdict]) -> list[list[str]]:
    """A row per world: its drives, its closed-loop median horizon, its state, what failed, what stayed undecided."""
    rows = [["world", "drives", "horizon", "state", "failed", "undecided"]]
    for v in verdicts:
        found = None if v.horizon is None else v.horizon.closed_loop
        horizon = "-" if found is None else shown_seconds(found.median.estimate, found.longest_s)
        rows.append([v.world, str(v.drives), horizon, v.state, _names(v.flagged_by), _names(v.undecided)])
    return rows


def _names(names: Sequence[str], most: int = 2) -> str:
    """A table cell of statistics' names: the first ``most``, then how many more."""
    return ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "") if names else "-"


def text_table(rows: Sequence[Sequence[str]]) -> str:
    """Rows as plain text, each column padded to its widest cell."""
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def probe_line(policy: str, difference: dict[str, Interval | None]) -> str:
    """Whether the world rewards probe policy ``brake_hard`` more than the truth does."""
    parts = []
    for key in PROBE_REWARD:
        value = difference.get(key)
        if value is None or not np.isfinite(value.estimate):
            parts.append(f"{key} n/a")
            continue
        verdict = "more" if value.low > 0 else "less" if value.high < 0 else "as much (the interval holds 0)"
        parts.append(f"{key} {shown(value)}: {verdict}")
    score = difference.get("scene_score")
    rewarded = score is not None and np.isfinite(score.low) and score.low > 0
    head = "rewards it more than the truth does" if rewarded else "does not reward it more than the truth does"
    return f"- probe **{policy}** (model - truth, paired drives): the model {head}; " + "; ".join(parts)


def separation_lines(separations: dict[str, list[str]], verdicts: Sequence[WorldVerdict]) -> list[str]:
    """Per control, the statistics that pass the model and fail the control; where there is none, why."""
    by_world = {v.world: v for v in verdicts}
    lines = []
    for control, names in separations.items():
        failed = by_world[control].flagged_by
        why = (f"{control} fails {', '.join(failed)}, which the model fails or leaves undecided too" if failed else
               f"{control} fails none")
        told = ", ".join(names) or f"no statistic (none passes the model and fails {control}: {why})"
        lines.append(f"- the model told from **{control}** by: {told}")
    return lines


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
        lines = [line for v in self.verdicts for line in (f"- {headline(v)}", within_line(v)) if line is not None]
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

    def terminal(self) -> str:
        """What the terminal shows, as plain text."""
        lines = ["Fidelity verdict (the whole report: fidelity.md)", "", text_table(world_rows(self.verdicts)), "",
                 *separation_lines(self.separations(), self.verdicts), "", *self.sentences()]
        return "\n".join(plain(line) for line in lines)

    def table(self) -> str:
        """Markdown (fidelity.md)."""
        lines = ["# Fidelity verdict", "", *self.sentences(), "", "## Run",
                 *(f"- {key}: {value}" for key, value in self.settings.items()), "", "## Statistics", *legend(), "",
                 "## Fidelity horizons", *horizon_table(self.verdicts), "", "## Verdicts", verdict_table(self.verdicts),
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
        values = {key: paired_values(mine, *source) for key, (_, source) in COLUMNS.items()}
        row["model"], row[TRUTH] = ({key: finite_mean(v[side]) for key, v in values.items()} for side in (0, 1))
        row["difference"] = {key: paired_difference(scenarios, *values[key], bootstrap)
                             for key in COLUMNS} if mine else {key: None for key in COLUMNS}
        row["difference"]["path_distance_m"] = (mean(scenarios, np.array([path_distance_m(p) for p in mine]),
                                                     bootstrap) if mine else None)
        row["following_gain_dx"], row["following_gain_dx_reason"] = (
            value_or_reason(following_gain("dx"), mine, bootstrap) if mine else (None, NO_PAIRS))
    return policies


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


def world_verdict(world: str, drives: dict[str, dict], truth: dict[str, dict], within_horizon: bool = False
                  ) -> WorldVerdict:
    """A world's verdict with its fidelity horizon, and with ``within_horizon`` the verdict within it too."""
    pairs = pairs_of(drives, truth)
    verdict = replace(judge_pairs(world, pairs), horizon=world_horizon(pairs))
    seconds = cut_at(verdict.horizon, pairs) if within_horizon else None
    if seconds is None:
        return verdict
    kept = [s for s in STATISTICS if s.cut]
    return replace(verdict, within=judge_pairs(world, within(pairs, seconds), statistics=kept), within_s=seconds)


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
                        manifest: str = MANIFEST, inputs: Inputs = (), shard_worlds: str = "all") -> StudyFolders:
    """The folders of a fidelity study of ``drive_ids`` that this run drives, checked before any work."""
    report = manifest == MANIFEST and shard_worlds == "all"
    drive_ids = {world: ids for world, ids in drive_ids.items()
                 if shard_worlds == "all" or (world in MODEL_WORLDS) == (shard_worlds == "engine")}
    top = claim_output_dir(path, "output_dir", files=REPORT_FILES if report else (), folders=tuple(drive_ids),
                           inputs=inputs, app=APP)
    folders = {world: claim_drive_folder(top.path / world, ids, videos, manifest, setting=f"output_dir/{world}")
               for world, ids in drive_ids.items()}
    lock = REPORT_FILES[0] if report else manifest if shard_worlds == "all" else f"{shard_worlds}.{manifest}"
    return StudyFolders(top, folders, drive_ids, report, lock)


def run_study(worlds: dict[str, World], specs: Sequence[DriveSpec], settings: RunSettings,
              num_control_scenarios: int | None = None) -> StudyReport | None:
    """Drive every spec in every world into ``settings.output_dir``/<world>, judge them and write the report."""
    scenarios = list(dict.fromkeys(spec.scenario.id for spec in specs))
    ids = study_drives([(spec.scenario.id, spec.replica, spec.id) for spec in specs], scenarios, list(worlds),
                       num_control_scenarios)
    folders = claim_study_folders(settings.output_dir, ids, settings.videos, settings.manifest,
                                  [item for spec in specs for item in spec.scenario.reads])
    report, _ = study_run(LocalDrives(worlds, specs), settings, folders)
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
