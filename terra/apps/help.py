"""Every app's ``--help`` page, made one way for all of them."""

from __future__ import annotations

import dataclasses
import importlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

import terra.conf
from terra.config.checks import Range
from terra.config.schema import allowed_values, register_schema, settings_help

CONF_DIR = Path(terra.conf.__file__).resolve().parent
EXIT_CODES = ("Exit codes: 0 done, 2 bad input or setting (one line on stderr), 130 / 143 interrupted,\n1 internal "
              "error (--verbose shows its traceback).")
WIDTH = 118  # a page's wrapped lines


@dataclass(frozen=True)
class Page:
    """What an app's page adds to its config file: console script, docs page, sections, choices, exit codes and
    the schema of its settings (``module:Class``)."""

    prog: str
    docs: str
    schema: str
    sections: tuple[tuple[str, str], ...] = ()
    choices: Callable[[], dict[str, str]] | None = None
    exit_codes: str = EXIT_CODES

    def schema_class(self) -> type:
        module, _, name = self.schema.partition(":")
        return getattr(importlib.import_module(module), name)


def _drive_choices() -> dict[str, str]:
    # what terra-drive's settings accept
    from terra.closedloop.policies.builtin import (
        ALL_PIXEL, ALL_REFERENCE, NO_PIXELS, PROBE_POLICIES, REFERENCE_POLICIES,
    )
    from terra.closedloop.recording.settings import WORLDS
    from terra.closedloop.study.settings import CONTROL_WORLDS

    pixel = [name for name in REFERENCE_POLICIES if name not in NO_PIXELS]
    return {
        "policies": (f"{', '.join(pixel)} (read the camera); {', '.join(sorted(NO_PIXELS))} (read no pixels); "
                     f"{', '.join(PROBE_POLICIES)} (the lane follower stopping hard: the study's probe); "
                     f"{ALL_PIXEL}, {ALL_REFERENCE}; grpc:HOST:PORT or unix:///PATH (an AlpaSim egodriver); "
                     "navsim:package.module:Class (a NAVSIM agent, from the working folder or PYTHONPATH)"),
        "world": f"{' | '.join(WORLDS)} | package.module:Class (your own, from the working folder)",
        "controls": f"{', '.join(CONTROL_WORLDS)}, all, package.module:Class (world=both)",
    }


def _group_settings(schema: type) -> str:
    """The ranges of ``schema``'s groups' settings (sampling, backend, output), from the tables that check them."""
    from terra.config.backend import BACKEND_OPTIONS
    from terra.config.sampling import DECODINGS, GUESSES, SAMPLING
    from terra.decoder.writers import MAX_FPS, MIN_FPS

    groups = {field.name for field in dataclasses.fields(schema) if field.metadata.get("group")}
    rows = {}
    if "sampling" in groups:
        rows |= {f"sampling.{name}": allowed_values(limits) for name, limits in SAMPLING.items()}
        rows |= {"sampling.draft_tokens": f"auto | {rows['sampling.draft_tokens']}",
                 "sampling.decoding": allowed_values(DECODINGS), "sampling.guesses": allowed_values(GUESSES)}
    if "output" in groups:
        rows["output.fps"] = allowed_values(Range(MIN_FPS, MAX_FPS, 10))
    if "backend" in groups:
        for backend, options in BACKEND_OPTIONS.items():
            rows |= {f"backend.options.{name}": f"{allowed_values(kind)} ({backend})" for name, kind in options.items()
                     if isinstance(kind, (Range, tuple))}
    if not rows:
        return ""
    notes = {"sampling.temperature": "0 = greedy", "sampling.top_k": "0 = off",
             "sampling.decoding": "speculative: several tokens per forward pass, the same codes",
             "sampling.guesses": "vllm: auto | previous"}
    return _rows({key: f"{value} ({notes[key]})" if key in notes else value for key, value in rows.items()})


TRAJECTORIES = """\
.json  an object with one trajectory form: "instruction_trajs" [T, 60, 2|3] (ACT-Bench, ego frame of each frame,
       20 Hz), "trajectory" {"x": [...], "y": [...], "yaw"?, "t"? or "rate_hz"?} (world frame, metres, 10 Hz),
       "actions" [T, 6, 3], or "manoeuvre" (a name or {"name": ..., "num_frames"?, "speed_kmh"?, ...});
       and, for a model with route slots, optionally a route beside it:
       "road" [[x, y], ...] or a list of lanes, in the trajectory's world frame (each frame's route is computed
       at its pose), or "ego_routes" [num_context + num_frames, K, 2|3], each frame's route in its ego frame,
       rows [x, y] or [x, y, s] at 80 m * (k + 1) / K along the road ([[10, 0], [20, 0], ...]: straight ahead);
       any other key is an error. Or a bare array of one of those shapes. Without context, a manoeuvre file
       drives the built-in scene and gets its road, as manoeuvre= does.
.csv   a header naming x, y and optionally t (or timestamp) and yaw; one row per pose
.npy   [T, 6, 3] actions, [T, 60, 3] instruction trajectories or [N, 2|3] world-frame x, y[, yaw] at 10 Hz
Axes: the ego frame's x points forward, y to the left; yaw in radians, counter-clockwise. Positions in metres,
times in seconds; the car may not move faster than 100 m/s. An example of each: docs/generate.md, "Trajectories"."""

SAMPLES = """\
One JSON object per line (blank lines ignored); every sample_id unique (a number, or a name without slashes).
ACT-Bench's: sample_id, context_frames (image paths under image_root), instruction_trajs [T, 60, 3], label?
Terra's: sample_id, context (an image, video, folder, glob or a list), and at most one of trajectory (a file or
  {"x": [...], "y": [...]}), actions [T, 6, 3], instruction_trajs, manoeuvre (a name or {"name": ..., ...});
  without one, default_manoeuvre. Both may set seed, num_frames and label, and give a "road" or "ego_routes"
  (docs/rollout.md, "Routes").
Frame 0 of the trajectory is the first context frame used. An example of each: docs/rollout.md, "Samples"."""

LOGS = """\
A sub-folder of logs per clip (its name is the clip's id):
frames   *.jpg / *.jpeg / *.png in name order (at frame_rate_hz, or timestamps.txt: seconds, one per line),
         or one *.mp4 (its own timestamps)
motion   trajectory.json / .csv / .npy (or the folder's only such file): world-frame x, y[, yaw] with t
         or at 10 Hz, or per-frame instruction_trajs [T, 60, 2|3] / actions [T, 6, 3], one per source frame
An example: docs/train.md, "Driving logs" (the rules: terra/inputs/driving_logs.py)."""

PAGES: dict[str, Page] = {  # config name -> its page
    "generate": Page("terra-generate", "docs/generate.md", "terra.apps.generate:GenerateConfig", (
        ("Trajectories (trajectory=FILE; frame 0 is the first context frame)", TRAJECTORIES),)),
    "rollout": Page("terra-rollout", "docs/rollout.md", "terra.batch.config:RolloutConfig",
                    (("Samples (samples=FILE.jsonl)", SAMPLES),), None,
                    "Exit codes: 0 every sample succeeded (or was complete), 1 some failed (each in the manifest with "
                    "its one-line error),\n2 bad setting or input before any work, 130 / 143 interrupted (a rerun "
                    "resumes)."),
    "serve": Page("terra-serve", "docs/serve.md", schema="terra.serve.settings:ServeConfig"),
    "drive": Page("terra-drive", "docs/drive.md; world=both, the fidelity study: docs/fidelity.md",
                  "terra.closedloop.study.config:DriveConfig", (
        ("Scenarios (scenarios=)",
         "synthetic: num_scenarios drawn from scenario_seed; a folder of driving-log clips, laid out as\n"
         "terra-prepare-logs reads them (docs/train.md, \"Driving logs\"); or a batch JSONL of samples\n"
         "(docs/rollout.md, \"Samples\")."),), _drive_choices,
        "Exit codes: 0 every drive ended well, 1 some drive failed (its reason is in the manifest), 2 bad input or\n"
        "setting (one line on stderr), 130 / 143 interrupted (a rerun resumes)."),
    "alpasim": Page("terra-alpasim", "docs/alpasim.md", schema="terra.alpasim.settings:AlpasimConfig"),
    "train_world_model": Page("terra-train", "docs/train.md", "terra.training.settings:TrainConfig", (
        ("Data (data.tokens=)", "a shard folder of terra-prepare-logs (its own train/val split) or a tokenized-clips "
                                "file of terra-tokenize"),)),
    "train_tokenizer": Page("terra-train-tokenizer", "docs/train.md",
                            schema="terra.training.tokenizer_settings:TrainTokenizerConfig"),
    "tokenize_dataset": Page("terra-tokenize", "docs/train.md", schema="terra.training.tokenize:TokenizeConfig"),
    "make_dataset": Page("terra-make-dataset", "docs/train.md", schema="terra.sim.dataset:MakeDatasetConfig"),
    "prepare_driving_logs": Page(
        "terra-prepare-logs", "docs/train.md", "terra.training.prepare_logs:PrepareLogsConfig", (
        ("Clips (logs=DIR)", LOGS),
        ("Tokenizer", "tokenizer=demo (default) | terra_lfq tokenizer.path=DIR | vq16 tokenizer.path=DIR, "
                      "tokenizer.resize=crop|stretch;\nor model=terra_v1 | terra_v2 terra_root=DIR: the tokenizer "
                      "that world model was trained with")),
        exit_codes="Exit codes: 0 done (unusable clips are skipped, one line each on stderr), 2 bad setting (one "
                   "line, nothing written),\n130 / 143 interrupted (rerun to resume), 1 internal error (--verbose "
                   "shows its traceback)."),
    "blend_world_models": Page("terra-blend", "docs/train.md", exit_codes=(
        "Exit codes: 0 written, 2 bad setting or two models of different architectures (one line, nothing written),\n"
        "130 / 143 interrupted (nothing written), 1 internal error (--verbose shows its traceback)."),
        schema="terra.training.blend:BlendConfig"),
    "score_actbench": Page("terra-score", "docs/score.md", "terra.scoring.settings:ScoreConfig", (
        ("Inputs", "videos: <name>_<sample_id>.mp4 files (terra-rollout output.naming=actbench); samples: ACT-Bench's "
                   "act_bench.jsonl\n(sample_id, label, reference_traj, ...; docs/score.md); estimator: a download "
                   "of turing-motors/ACT-Estimator"),)),
    "evaluate": Page("terra-evaluate", "docs/score.md", exit_codes=(
        "Exit codes: 0 report written, 2 bad setting (one line, nothing written), 130 / 143 interrupted (the phases\n"
        "finished are kept in out_dir; a line names the command that resumes), 1 internal error (--verbose shows its "
        "traceback)."), schema="terra.evaluation.settings:EvaluateConfig"),
}


def opening_comment(text: str) -> str:
    """A config file's opening comment (what the app does, its example commands), without the ``#``."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[2:] if line.startswith("# ") else line[1:])
    return "\n".join(lines)


def config_groups(text: str) -> dict[str, str]:
    """The configuration groups a config file's defaults list picks, each with its options and its default."""
    defaults = (yaml.safe_load(text) or {}).get("defaults") or []
    groups = {}
    for entry in defaults:
        if not isinstance(entry, dict) or next(iter(entry)).startswith("override "):
            continue
        (key, chosen), = entry.items()
        group = key.removeprefix("optional ").split("@")[0].strip("/")  # Hydra's `optional g@package: option`
        options = sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))
        groups[group] = ", ".join(f"{name} (default)" if name == chosen else name for name in options) + (
            "; none by default" if chosen is None else "")
    return groups


def _literal(text: str) -> str:
    """``text`` as it must stand in a Hydra help template (a ``string.Template``): every ``$`` doubled."""
    return text.replace("$", "$$")


def page_template(config_name: str, prog: str | None = None) -> str:
    """The Hydra help template of ``conf/<config_name>.yaml``: its page, every literal ``$`` doubled."""
    page = PAGES.get(config_name)
    if page is None or (prog is not None and page.prog != prog):
        return foreign_page(config_name, prog)
    text = (CONF_DIR / f"{config_name}.yaml").read_text()
    parts = [_literal(opening_comment(text)),
             _literal(f"Usage: {page.prog} [KEY=VALUE ...] [--cfg job] [--verbose]\nQuote a value with spaces or "
                      "non-ASCII letters for Hydra: \"output_dir='/data/Fahrten 1/'\".")]
    parts += [f"== {_literal(title)} ==\n{_literal(_indented(body))}" for title, body in page.sections]
    if page.choices is not None:
        try:
            choices = _rows(page.choices())
        except ModuleNotFoundError as err:  # the app's extra is not installed (make demo installs none)
            choices = (f"  not listed here: they need {err.name}, which is not installed; {page.prog} without --help "
                       "names the extra to install")
        parts.append(f"== Choices ==\n{_literal(choices)}")
    groups = config_groups(text)
    if groups:
        parts.append(f"== Configuration groups (GROUP=OPTION; conf/GROUP/OPTION.yaml) ==\n{_literal(_rows(groups))}")
    schema = page.schema_class()
    group_settings = _group_settings(schema)
    if group_settings:
        parts.append(f"== Settings of the groups ==\n{_literal(group_settings)}")
    settings = settings_help(schema, WIDTH)
    parts.append(f"== Settings (KEY=VALUE; `{page.prog} --cfg job [KEY=VALUE ...]` prints them as a run would "
                 f"take them) ==\n{_literal(settings)}")
    parts.append(_literal(f"{page.exit_codes}\nDocs: {page.docs}"))
    return re.sub(r"\n{3,}", "\n\n", "\n\n".join(parts))


def foreign_page(config_name: str, prog: str | None) -> str:
    """The page of ``prog`` run with a config not its own: the config as composed, exit codes and docs page."""
    own = next((page for page in PAGES.values() if page.prog == prog), None)
    prog = prog or "this app"
    parts = [_literal(textwrap.fill(
                 f"{prog} was given the config {config_name!r} (--config-name / --config-dir), not its own. It runs "
                 "with what that config holds, and a setting it needs that the config lacks, or one it does not "
                 f"know, stops it with one line (exit 2). Its own page: {prog} --help, without --config-name.", WIDTH)),
             _literal(f"Usage: {prog} [--config-dir DIR --config-name NAME] [KEY=VALUE ...] [--cfg job] [--verbose]"),
             f"== The config {_literal(repr(config_name))}, as composed ==\n$CONFIG",
             _literal(f"{own.exit_codes if own else EXIT_CODES}\nDocs: {own.docs if own else 'docs/README.md'}")]
    return "\n\n".join(parts)


def _rows(rows: dict[str, str]) -> str:
    """``name value`` lines, the values aligned and wrapped at :data:`WIDTH` columns."""
    width = max(len(name) for name in rows)
    return "\n".join(textwrap.fill(value, WIDTH, initial_indent=f"  {name.ljust(width)}  ",
                                   subsequent_indent=" " * (width + 4), break_on_hyphens=False)
                     for name, value in rows.items())


def _indented(body: str) -> str:
    return "\n".join(f"  {line}" if line else line for line in body.splitlines())


def register_schemas(prog: str | None = None) -> None:
    """Store the schema of ``prog``'s config (None: every app's) in Hydra's ConfigStore, where its defaults list finds
    it."""
    for config_name, page in PAGES.items():
        if prog in (None, page.prog):
            register_schema(config_name, page.schema_class())


def register_help() -> None:
    """Register Hydra's help config ``hydra/help=terra`` and its resolver ``terra_help`` (idempotent)."""
    if not OmegaConf.has_resolver("terra_help"):
        OmegaConf.register_new_resolver("terra_help", page_template)
    ConfigStore.instance().store(group="hydra/help", name="terra", provider="terra", node={
        "app_name": "${hydra.job.name}", "header": "", "footer": "",
        "template": "${terra_help:${hydra.job.config_name},${hydra.help.app_name}}"})
