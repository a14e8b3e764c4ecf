"""The settings of a fidelity study, checked once before any model loads: the run's own wrapped."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict

from terra.closedloop.loop import drive_id
from terra.closedloop.recording.settings import DriveSettings, checked_run, checked_shard, drive_settings, run_inputs
from terra.closedloop.study.config import DriveConfig
from terra.closedloop.study.control_worlds import CONTROL_WORLDS, MODEL_WORLDS, ROUTE_CONTROLS, control_world
from terra.closedloop.study.processes import ShardProcesses, setting
from terra.closedloop.study.report import StudyFolders, claim_study_folders, study_drives
from terra.closedloop.study.rounds import Until
from terra.closedloop.user_world import is_world_target, world_class, world_name
from terra.closedloop.worlds import TRUTH
from terra.config.checks import check_choice, select
from terra.config.files import declared_route_tokens
from terra.config.manifest import manifest_name
from terra.config.schema import schema_settings
from terra.core.device import usable_cores
from terra.core.errors import TerraInputError

ROUND_SETTINGS = ("num_scenarios", "exploitability", "until", "until_minutes", "until_scenarios")  # a round's own
FIELDS = schema_settings(DriveConfig)  # terra-drive's settings by key
FIDELITY_STEPS = 200  # num_steps=null: 20 s drives (AlpaSim's ``duration_frac_20s``)


@dataclass(frozen=True)
class StudySettings:
    """A fidelity study, checked: the drive run it is made of and the study's own settings."""

    drive: DriveSettings  # the run: every world of this process's shard (drive.worlds), its drives of any of them
    controls: tuple[str, ...]  # the worlds judged beside the model
    num_control_scenarios: int | None  # the controls drive the first this many scenarios (None: all)
    num_control_seeds: int | None  # ... and of each scenario x policy the first this many replicas (None: all)
    shard_worlds: str  # all | engine (the worlds the world model's engine draws) | scene (the others)
    folders: StudyFolders  # the study's folders, claimed
    exploitability: bool  # the exploitability study too
    within_horizon: bool = False  # each world judged within its fidelity horizon too
    shard_processes: ShardProcesses = ShardProcesses()  # shards on this machine, or per GPU with Ray
    overrides: tuple[str, ...] = ()  # the command's settings, as the shard processes are given them
    until: Until | None = None  # until=decided: rounds of more scenarios


def _checked(cfg: DictConfig, key: str) -> Any:
    return FIELDS[key].check(select(cfg, key))


def terra_drive_settings(cfg: DictConfig, output_dir: str | Path, overrides: Sequence[str] = (),
                         preset: str | None = None) -> DriveSettings | StudySettings:
    """``terra-drive``'s settings: a study's with ``world=both``, else a run's."""
    world = select(cfg, "world")
    if world == "both":
        return checked_study(cfg, output_dir, overrides, preset)
    for name, most in (("num_control_scenarios", "num_scenarios"), ("num_control_seeds", "num_seeds")):
        if (value := _checked(cfg, name)) is not None:
            raise TerraInputError(f"{name}={value} is how many of the study's {most}={select(cfg, most)} the controls "
                                  f"drive: it needs world=both and at most {most} (null: all)")
    if (shard_worlds := _checked(cfg, "shard_worlds")) != "all":
        raise TerraInputError(f"shard_worlds={shard_worlds} picks some of a fidelity study's worlds: it needs "
                              "world=both (or shard_worlds=all)")
    for key, refused, what in (
            ("exploitability", True, "exploitability=true is part of the fidelity study"),
            ("until", "decided", "until=decided adds scenarios to a fidelity study until its verdict is decided"),
            ("within_horizon", True, "within_horizon=true judges a fidelity study's worlds within their horizons")):
        if _checked(cfg, key) == refused:
            raise TerraInputError(f"{what}: it needs world=both (got world={world})")
    if _shard_processes(cfg).groups:
        raise TerraInputError(f"shard_processes runs a fidelity study as shards of this machine: it needs world=both "
                              f"(got world={world}; python -m terra.closedloop.study.processes shards any run)")
    return drive_settings(cfg, output_dir)


def _shard_processes(cfg: DictConfig) -> ShardProcesses:
    engine, scene, kv_cache_gib, every = (_checked(cfg, f"shard_processes.{name}")
                                          for name in ("engine", "scene", "kv_cache_gib", "all"))
    every = usable_cores() if every == "cores" else every
    if every and (engine or scene):
        raise TerraInputError("shard_processes.all shards every world alike: give it without shard_processes.engine "
                              "and shard_processes.scene (or set shard_processes.all=0)")
    return ShardProcesses(engine, scene, kv_cache_gib, every)


def needs_gpu(preset: str | None, device: str, processes: ShardProcesses, executor: str = "local") -> None:
    """Refuse in one line a GPU study whose device resolves to the CPU."""
    engines = f"shard_processes.engine={processes.engine}" if processes.engine and executor == "local" else None
    what = "study=gpu" if preset == "gpu" else engines or (f"device={device}" if device.startswith("cuda") else None)
    if what is None:
        return
    if device == "cpu":
        why = "device=cpu was asked for"
    elif executor == "ray":
        return
    else:
        import torch

        if torch.cuda.is_available():
            return
        why = "no CUDA GPU is visible here"
    raise TerraInputError(f"{what} runs the study's world model on a CUDA GPU, but {why}; on a CPU run terra-drive "
                          "study=cpu (docs/fidelity.md)")


def checked_study(cfg: DictConfig, output_dir: str | Path, overrides: Sequence[str] = (),
                  preset: str | None = None) -> StudySettings:
    """Every setting of a study checked, this shard's drives taken and the study's folders claimed."""
    run = checked_run(cfg)
    processes = _shard_processes(cfg)
    needs_gpu(preset, run.run.device, processes, run.executor)
    user_worlds = dict(run.user_worlds)
    controls = _controls(select(cfg, "controls"), user_worlds, run.policy_timeout_s,
                         declared_route_tokens(run.run.world_model))
    control_scenarios, control_seeds = _checked(cfg, "num_control_scenarios"), _checked(cfg, "num_control_seeds")
    for name, value, most, of in (("num_control_scenarios", control_scenarios, "num_scenarios", len(run.scenarios.ids)),
                                  ("num_control_seeds", control_seeds, "num_seeds", run.num_seeds)):
        if value is not None and value > of:
            raise TerraInputError(f"{name}={value} is how many of the study's {most}={of} the controls drive: it "
                                  f"needs world=both and at most {most} (null: all)")
    shard_worlds, exploit = _checked(cfg, "shard_worlds"), _checked(cfg, "exploitability")
    if exploit and len(run.scenarios.ids) < 2:
        raise TerraInputError("exploitability=true tunes on half the scenarios and tests on the other half: it needs "
                              "num_scenarios >= 2")
    if (processes.groups or run.executor == "ray") and (run.num_shards > 1 or shard_worlds != "all"):
        raise TerraInputError("shard_processes and executor=ray make the study's shards themselves: give them "
                              "without num_shards, shard_index or shard_worlds")
    ids, every = run.scenarios.ids, run.drives
    worlds = study_drives([(ids[d[0]], d[2], drive_id(ids[d[0]], d[1], d[2])) for d in every], ids,
                          ("model", TRUTH, *controls), control_scenarios, control_seeds)
    num_steps = FIDELITY_STEPS if select(cfg, "num_steps") is None else run.num_steps
    whole = replace(run, user_worlds=user_worlds, num_steps=num_steps, model_worlds=MODEL_WORLDS,
                    other_world=control_world, measure=True)
    drive, folders = _shard(whole, worlds, shard_worlds, output_dir)
    within_horizon = _checked(cfg, "within_horizon")
    return StudySettings(drive, controls, control_scenarios, control_seeds, shard_worlds, folders, exploit,
                         within_horizon, processes, tuple(overrides), _until(cfg, output_dir, overrides, preset))


def _until(cfg: DictConfig, output_dir: str | Path, overrides: Sequence[str], preset: str | None) -> Until | None:
    """``until=decided``'s budget, or None (``until=once``); refused in a shard (the whole study makes its rounds)."""
    if _checked(cfg, "until") == "once":
        return None
    budget = {key: _checked(cfg, key) for key in ("until_minutes", "until_scenarios")}
    if select(cfg, "num_shards") != 1 or select(cfg, "shard_worlds") != "all":
        raise TerraInputError("until=decided makes the whole study's rounds: give it without num_shards, shard_index "
                              "or shard_worlds")
    if select(cfg, "scenarios") != "synthetic":
        raise TerraInputError("until=decided adds synthetic scenarios: it needs scenarios=synthetic")
    if budget["until_scenarios"] <= select(cfg, "num_scenarios"):
        raise TerraInputError(f"until_scenarios={budget['until_scenarios']} leaves no room for a round beyond "
                              f"num_scenarios={select(cfg, 'num_scenarios')}; give more, e.g. until_scenarios=128")
    return Until(budget["until_minutes"], budget["until_scenarios"],
                 partial(resized_study, OmegaConf.to_container(cfg), str(output_dir), tuple(overrides), preset))


def resized_study(values: dict, output_dir: str, overrides: Sequence[str], preset: str | None, scenarios: int,
                  exploitability: bool) -> StudySettings:
    """The command's study with ``scenarios`` scenarios and ``exploitability``, one round of ``until=decided``."""
    cfg = OmegaConf.create(values)
    with open_dict(cfg):
        cfg.num_scenarios, cfg.exploitability, cfg.until = scenarios, exploitability, "once"
    kept = [o for o in overrides if setting(o) not in ROUND_SETTINGS]
    return checked_study(cfg, output_dir, (*kept, f"num_scenarios={scenarios}",
                                           f"exploitability={str(exploitability).lower()}"), preset)


def _shard(run: DriveSettings, worlds: dict[str, list[str]], shard_worlds: str,
           output_dir: str | Path) -> tuple[DriveSettings, StudyFolders]:
    """The study's shard ``run.shard_index`` of ``run.num_shards``, its folders claimed."""
    ids, every = run.scenarios.ids, run.drives
    mine = {world: world_ids[run.shard_index::run.num_shards] for world, world_ids in worlds.items()}
    taken = {d for world_ids in mine.values() for d in world_ids}
    drives = checked_shard(run, [d for d in every if drive_id(ids[d[0]], d[1], d[2]) in taken], len(every))
    manifest = manifest_name(shard_index=run.shard_index, num_shards=run.num_shards)
    folders = claim_study_folders(output_dir, mine, run.videos, manifest, run_inputs(run), shard_worlds=shard_worlds)
    return replace(run, drives=drives, worlds=tuple(folders.worlds)), folders


def study_shard(settings: StudySettings, shard_worlds: str, shard_index: int, num_shards: int) -> StudySettings:
    """Shard ``shard_index`` of ``num_shards`` of the checked study, driven locally; its folders claimed."""
    whole = settings.folders.drive_ids  # every world's drives: the whole study's settings are one shard of one
    run = replace(settings.drive, shard_index=shard_index, num_shards=num_shards, executor="local", progress=False)
    drive, folders = _shard(run, whole, shard_worlds, settings.folders.top.path)
    return replace(settings, drive=drive, shard_worlds=shard_worlds, folders=folders, exploitability=False,
                   within_horizon=False, shard_processes=ShardProcesses(), overrides=())


def _controls(value, user_worlds: dict[str, tuple[str, type]], timeout_s: float, route_tokens: int
              ) -> tuple[str, ...]:
    entries = [value] if isinstance(value, str) else list(value or [])
    if not all(isinstance(e, str) and e for e in entries):
        raise TerraInputError(f"controls must be a list of world names, e.g. controls=[frozen,gray] (built in: "
                              f"{', '.join(CONTROL_WORLDS)}, or all; or package.module:Class)")
    names: list[str] = []
    for entry in entries:
        if entry == "all":
            names += [name for name in CONTROL_WORLDS if route_tokens or name not in ROUTE_CONTROLS]
        elif is_world_target(entry):
            user_worlds[world_name(entry)] = (entry, world_class(entry, "controls", timeout_s))
            names.append(world_name(entry))
        else:
            names.append(check_choice(entry, "controls", (*CONTROL_WORLDS, "all")))
            if entry in ROUTE_CONTROLS and not route_tokens:
                raise TerraInputError(f"controls=[{entry}] changes the route the world model is told, and this model "
                                      "has no route slots (num_route_tokens 0); leave it out")
    if len(set(names)) != len(names) or set(names) & {"model", TRUTH}:
        raise TerraInputError(f"controls names a world twice ({', '.join(names)}); list each once")
    return tuple(names)
