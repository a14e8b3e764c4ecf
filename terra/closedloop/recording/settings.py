"""The settings of a ``terra-drive`` run (conf/drive.yaml), checked once, before any model loads.

:func:`drive_settings` turns the Hydra config into a frozen :class:`DriveSettings`: the model and engine settings as
a :class:`~terra.config.spec.RunSpec` (``num_threads=auto`` as in every app), each policy built into its factory
once (a NAVSIM agent's class imported, and one agent built with its ``navsim_args`` and checked here, each within
``policy_timeout_s``), a world of the user's imported and its constructor read (terra/closedloop/user_world.py),
the scenarios as a :class:`~terra.closedloop.scenarios.ScenarioSource` (their ids and every file they read; nothing
decoded), this shard's drives (drive ``k``, scenario by scenario, of each world's list to shard ``k % num_shards``),
and the output folder claimed (terra/config/output_dir.py): apart from the scenarios' files, the checkpoints and the
estimator, and writing over nothing the toolkit did not write there. Everything after it takes the values as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from omegaconf import DictConfig

from terra.closedloop.study.control_worlds import CONTROL_WORLDS
from terra.closedloop.study.report import SHARD_WORLDS, FidelityFolders, claim_fidelity_folders, study_drives
from terra.closedloop.loop import drive_id
from terra.closedloop.car.motion import VEHICLES
from terra.closedloop.plans import Policy
from terra.closedloop.drivers.builtin import ALL_PIXEL, ALL_REFERENCE, policy_args, policy_factories, policy_names
from terra.closedloop.recording.files import claim_drive_folder
from terra.closedloop.recording.run import RunSettings
from terra.closedloop.scenarios import SYNTHETIC, ScenarioSource, scenario_source
from terra.closedloop.user_world import is_world_target, world_class, world_name
from terra.closedloop.worlds import TRUTH
from terra.config.checks import (
    MAX_FRAMES,
    SEED,
    Range,
    check_choice,
    check_flag,
    check_settings,
    required_path,
    select,
)
from terra.config.manifest import manifest_name
from terra.config.output_dir import OutputDir
from terra.config.ray_settings import RaySettings, check_executor
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError

SETTINGS = {
    "num_scenarios": Range(1, 100_000, 4, whole=True),
    "num_control_scenarios": Range(1, 100_000, 8, whole=True, nullable=True),
    "num_control_seeds": Range(1, 1000, 1, whole=True, nullable=True),
    "scenario_seed": SEED,
    "num_steps": Range(1, MAX_FRAMES, 20, whole=True, nullable=True),
    "num_seeds": Range(1, 1000, 1, whole=True),
    "seed": SEED,
    "policy_timeout_s": Range(0.001, 3600, 30),
    "max_concurrent": Range(1, 4096, 64, whole=True),
    "writer_processes": Range(0, 256, 1, whole=True),
    "num_shards": Range(1, 1 << 20, 4, whole=True),
    "shard_index": Range(0, (1 << 20) - 1, 0, whole=True),
}
WORLDS = ("model", "truth", "both")  # or a world of the user's, module:Class (terra/closedloop/user_world.py)
DEMO_STEPS, FIDELITY_STEPS = 20, 200  # num_steps=null: 2 s drives, or 20 s ones with world=both (drive_steps)


@dataclass(frozen=True)
class DriveSettings:
    """A ``terra-drive`` run, checked."""

    run: RunSpec
    policies: dict[str, Callable[[], Policy]]  # name -> a factory of the policy (one instance per drive)
    policy_args: dict[str, dict]  # name -> the keyword arguments the policy is built with (NAVSIM agents' navsim_args)
    scenarios: ScenarioSource
    drives: tuple[tuple[int, str, int], ...]  # this shard's drives (world=both: of any of its worlds): (scenario index,
    # policy name, replica), scenario by scenario
    num_seeds: int  # drives of each scenario x policy, each with a seed of its own
    world: str  # model | truth | both | a user world's name (module.Class)
    controls: tuple[str, ...]  # world=both: the worlds judged beside the model (terra/closedloop/study/control_worlds.py)
    num_control_scenarios: int | None  # world=both: the controls drive the first this many scenarios (None: all)
    num_control_seeds: int | None  # ... and of each scenario x policy the first this many replicas (None: all)
    shard_worlds: str  # world=both: all | engine (the worlds the world model's engine draws) | scene (the others)
    user_worlds: dict[str, tuple[str, type]]  # a user world's name -> (its module:Class entry, the class)
    vehicle: str  # bicycle | exact: how plans move the cars (terra/closedloop/car/motion.py), in every world alike
    num_steps: int  # frames each drive generates (drive_steps)
    seed: int  # the drives of scenario i sample the world model with seed + i
    policy_timeout_s: float
    max_concurrent: int
    writer_processes: int  # processes measuring and writing finished drives beside the loop (0: the loop's own)
    resume: bool
    progress: bool
    estimator: Path | None  # an ACT-Estimator folder: plan following
    shard_index: int
    num_shards: int
    executor: str  # local | ray (terra/closedloop/recording/ray_executor.py)
    ray: RaySettings  # executor=ray's settings (terra/config/ray_settings.py)
    videos: bool  # a video per drive beside its JSON
    output: OutputDir | None  # world=model | truth | a user world: the run folder, claimed
    fidelity: FidelityFolders | None  # world=both: the study's folders, claimed
    exploitability: bool  # world=both: the exploitability study too (terra/closedloop/study/exploit.py)

    @property
    def drive_ids(self) -> list[str]:
        return [drive_id(self.scenarios.ids[i], name, k) for i, name, k in self.drives]

    @property
    def scenario_indices(self) -> list[int]:
        """The scenarios the drives start from, in index order."""
        return sorted({i for i, _, _ in self.drives})

    @property
    def model_settings(self) -> dict[str, Any]:
        """What shapes the world model's drives (part of each one's fingerprint: terra/closedloop/recording/files.py): the
        run's part of every fingerprint (terra/config/spec.py, ``RunSpec.output_settings``) and the checkpoints and
        engine that make them (a drive folder holds one model's drives)."""
        run = self.run
        return {**run.output_settings(), "world_model": run.world_model, "tokenizer": run.tokenizer,
                "backend": run.backend, "dtype": run.dtype}

    def run_settings(self, progress: bool) -> RunSettings:
        """How the drives run and where they go (world=both: the study's folder; each world's sub-folder is set by
        terra/closedloop/study/report.py)."""
        folder = self.output.path if self.output is not None else self.fidelity.top.path
        return RunSettings(folder, self.num_steps, self.policy_timeout_s, max_concurrent=self.max_concurrent,
                           resume=self.resume, progress=progress,
                           manifest=manifest_name(shard_index=self.shard_index, num_shards=self.num_shards),
                           vehicle=self.vehicle, videos=self.videos, writer_processes=self.writer_processes)

    @property
    def worlds(self) -> tuple[str, ...]:
        """The worlds the run drives in, in order: with world=both the model, the truth and the controls (those of
        ``shard_worlds``)."""
        return tuple(self.fidelity.worlds) if self.world == "both" else (self.world,)


def drive_steps(num_steps: int | None, world: str) -> int:
    """The frames each drive generates: ``num_steps`` as set, or by default :data:`DEMO_STEPS` (2 s, the demo) and
    with ``world=both`` :data:`FIDELITY_STEPS` (20 s, AlpaSim's ``duration_frac_20s``: long enough for a car that
    reads nothing from a broken world's frames to leave its lane, so the verdict can see it)."""
    if num_steps is not None:
        return num_steps
    return FIDELITY_STEPS if world == "both" else DEMO_STEPS


def drive_settings(cfg: DictConfig, output_dir: str | Path) -> DriveSettings:
    """Every setting of conf/drive.yaml checked once, the scenarios listed and ``output_dir`` claimed; one line for a
    bad one."""
    values = check_settings(cfg, SETTINGS)
    shard, shards = values["shard_index"], values["num_shards"]
    if shard >= shards:
        raise TerraInputError(f"shard_index={shard} must be below num_shards={shards} (shards are numbered "
                              f"0..{shards - 1})")
    entries = select(cfg, "policies")
    entries = [entries] if isinstance(entries, str) else list(entries or [])
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise TerraInputError(f"policies must be a list of policy names, e.g. policies=[lane_follower,route_follower] "
                              f"(or {ALL_REFERENCE}, {ALL_PIXEL})")
    names = policy_names(entries)
    args = policy_args(names, select(cfg, "navsim_args"))
    timeout_s = float(values["policy_timeout_s"])
    policies = policy_factories(names, timeout_s, values["seed"], args)
    world, user_worlds = select(cfg, "world"), {}
    if isinstance(world, str) and is_world_target(world):
        user_worlds[world_name(world)] = (world, world_class(world, "world", timeout_s))
        world = world_name(world)
    else:
        world = check_choice(world, "world", WORLDS)
    controls = _controls(select(cfg, "controls"), user_worlds, timeout_s) if world == "both" else ()
    control_scenarios, control_seeds = values["num_control_scenarios"], values["num_control_seeds"]
    for name, value, most in (("num_control_scenarios", control_scenarios, "num_scenarios"),
                              ("num_control_seeds", control_seeds, "num_seeds")):
        if value is not None and (world != "both" or value > values[most]):
            raise TerraInputError(f"{name}={value} is how many of the study's {most}={values[most]} the controls "
                                  f"drive: it needs world=both and at most {most} (null: all)")
    shard_worlds = check_choice(select(cfg, "shard_worlds"), "shard_worlds", SHARD_WORLDS)
    if shard_worlds != "all" and world != "both":
        raise TerraInputError(f"shard_worlds={shard_worlds} picks some of a fidelity study's worlds: it needs "
                              "world=both (or shard_worlds=all)")
    exploit = check_flag(select(cfg, "exploitability"), "exploitability")
    vehicle = check_choice(select(cfg, "vehicle"), "vehicle", VEHICLES)
    setting = str(select(cfg, "scenarios"))
    executor = check_executor(select(cfg, "executor"))
    if exploit and (world != "both" or executor != "local"):
        raise TerraInputError(f"exploitability=true is part of the fidelity study in this process: it needs world=both "
                              f"and executor=local (got world={world}, executor={executor})")
    ray = RaySettings.parse(select(cfg, "ray"))
    image_root = select(cfg, "image_root")
    if image_root is not None and not Path(str(image_root)).expanduser().is_dir():
        raise TerraInputError(f"image_root={image_root} is not a folder; point it at the context frames' root")
    scenarios = scenario_source(setting, values["num_scenarios"], values["scenario_seed"],
                                None if image_root is None else str(image_root))
    if world in ("truth", "both") and scenarios.kind != SYNTHETIC:
        raise TerraInputError(f"world={world} needs synthetic scenarios (the true world is the synthetic world)")
    every = [(i, name, k) for i in range(len(scenarios.ids)) for name in policies for k in range(values["num_seeds"])]
    study = None
    if world == "both":  # drive k of each world's list goes to shard k % num_shards: the controls' fewer drives too
        every_id = {d: drive_id(scenarios.ids[d[0]], d[1], d[2]) for d in every}
        study = study_drives([(scenarios.ids[d[0]], d[2], every_id[d]) for d in every], scenarios.ids,
                             ("model", TRUTH, *controls), control_scenarios, control_seeds)
        study = {w: ids[shard::shards] for w, ids in study.items()}
        mine = {d for ids in study.values() for d in ids}
        drives = tuple(d for d in every if every_id[d] in mine)
    else:
        drives = tuple(every[shard::shards])  # drive k goes to shard k % num_shards
    if not drives:
        raise TerraInputError(f"shard_index={shard} of num_shards={shards} has no drives (the run has "
                              f"{len(every)}); use at most {len(every)} shards")
    if exploit and len(scenarios.ids) < 2:
        raise TerraInputError("exploitability=true tunes on half the scenarios and tests on the other half: it needs "
                              "num_scenarios >= 2")
    videos = check_flag(select(cfg, "videos"), "videos")
    estimator = None if select(cfg, "estimator") is None else required_path(cfg, "estimator", "ACT-Estimator")
    if estimator is not None and not (estimator / "config.json").is_file():
        raise TerraInputError(f"estimator={estimator} holds no config.json; give the ACT-Estimator's folder")
    spec = run_spec(cfg)
    inputs = [*scenarios.inputs, ("tokenizer", spec.tokenizer), ("estimator folder", estimator)]
    if world in ("model", "both"):
        inputs.append(("world model", spec.world_model))
    manifest = manifest_name(shard_index=shard, num_shards=shards)
    output = fidelity = None
    if study is not None:
        fidelity = claim_fidelity_folders(output_dir, study, videos, manifest, inputs, shard_worlds=shard_worlds)
    else:
        ids = [drive_id(scenarios.ids[i], name, k) for i, name, k in drives]
        output = claim_drive_folder(output_dir, ids, videos, manifest=manifest, inputs=inputs)
    return DriveSettings(
        spec, policies, args, scenarios, drives, values["num_seeds"], world, controls, control_scenarios,
        control_seeds, shard_worlds, user_worlds, vehicle, drive_steps(values["num_steps"], world), values["seed"],
        timeout_s, values["max_concurrent"], values["writer_processes"], check_flag(select(cfg, "resume"), "resume"),
        check_flag(select(cfg, "progress"), "progress"), estimator, shard, shards, executor,
        ray, videos, output, fidelity, exploit)


def _controls(value, user_worlds: dict[str, tuple[str, type]], timeout_s: float) -> tuple[str, ...]:
    """The ``controls`` setting: built-in control worlds (or ``all``) and worlds of the user's (``module:Class``,
    imported now into ``user_worlds``, each within ``timeout_s``), as world names."""
    entries = [value] if isinstance(value, str) else list(value or [])
    if not all(isinstance(e, str) and e for e in entries):
        raise TerraInputError(f"controls must be a list of world names, e.g. controls=[frozen,gray] (built in: "
                              f"{', '.join(CONTROL_WORLDS)}, or all; or package.module:Class)")
    names: list[str] = []
    for entry in entries:
        if entry == "all":
            names += CONTROL_WORLDS
        elif is_world_target(entry):
            user_worlds[world_name(entry)] = (entry, world_class(entry, "controls", timeout_s))
            names.append(world_name(entry))
        else:
            names.append(check_choice(entry, "controls", (*CONTROL_WORLDS, "all")))
    if len(set(names)) != len(names) or set(names) & {"model", TRUTH}:
        raise TerraInputError(f"controls names a world twice ({', '.join(names)}); list each once")
    return tuple(names)
