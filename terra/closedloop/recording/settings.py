"""The settings of a ``terra-drive`` run, checked once, before any model loads."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from omegaconf import DictConfig

from terra.closedloop.loop import drive_id
from terra.closedloop.plans import Policy
from terra.closedloop.policies.builtin import ALL_PIXEL, ALL_REFERENCE, policy_args, policy_factories, policy_names
from terra.closedloop.recording.config import DriveRunConfig
from terra.closedloop.recording.files import claim_drive_folder
from terra.closedloop.recording.run import RunSettings
from terra.closedloop.scenario_maps import SCENE_ROAD, with_maps
from terra.closedloop.scenarios import SYNTHETIC, ScenarioSource, scenario_source
from terra.closedloop.user_world import is_world_target, world_class, world_name
from terra.closedloop.worlds import World
from terra.config.checks import did_you_mean, required_path, select, shown
from terra.config.files import checkpoint_digest
from terra.config.manifest import manifest_name
from terra.config.output_dir import OutputDir
from terra.config.ray_settings import RaySettings, check_executor
from terra.config.schema import check_schema
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError

WORLDS = ("model", "truth", "both")  # or a world of the user's, module:Class; both: the fidelity study
DEMO_STEPS = 20  # num_steps=null: 2 s drives (the study's own default: settings)
OtherWorld = Callable[[str, tuple[int, int], Any], World]  # (name, frame size, the model world or None) -> a world


@dataclass(frozen=True)
class DriveSettings:
    """A ``terra-drive`` run, checked."""

    run: RunSpec
    policies: dict[str, Callable[[], Policy]]  # name -> a factory of the policy (one instance per drive)
    policy_args: dict[str, dict]  # name -> the keyword arguments the policy is built with (NAVSIM agents' navsim_args)
    scenarios: ScenarioSource
    drives: tuple[tuple[int, str, int], ...]  # this shard's (scenario index, policy name, replica), by scenario
    num_seeds: int  # drives of each scenario x policy, each with a seed of its own
    world: str  # model | truth | both | a user world's name (module.Class)
    worlds: tuple[str, ...]  # the worlds this run drives in, in order (a study's: the model, the truth, the controls)
    user_worlds: dict[str, tuple[str, type]]  # a user world's name -> (its module:Class entry, the class)
    vehicle: str  # bicycle | exact: how plans move the cars, in every world alike
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
    executor: str  # local | ray
    ray: RaySettings  # executor=ray's settings
    videos: bool  # a video per drive beside its JSON
    output: OutputDir | None  # the run folder, claimed (None: a study's run, whose folders the study claims)
    model_worlds: tuple[str, ...] = ("model",)  # the worlds whose frames the world model's engine draws
    measure: bool = False  # every drive measured against the truth (a study's): the model world keeps references
    other_world: OtherWorld | None = None  # builds a world none of the above is (a study's controls), on open
    road: str = SCENE_ROAD  # where the model world's routes come from: the scenes, or a folder of maps

    @property
    def drive_ids(self) -> list[str]:
        return [drive_id(self.scenarios.ids[i], name, k) for i, name, k in self.drives]

    @property
    def scenario_indices(self) -> list[int]:
        """The scenarios the drives start from, in index order."""
        return sorted({i for i, _, _ in self.drives})

    @property
    def model_settings(self) -> dict[str, Any]:
        """What shapes the world model's drives (part of each one's fingerprint: files)."""
        run = self.run
        told = {} if self.road == SCENE_ROAD else {"road": self.road}  # the routes' source, where not the scenes
        return {**run.output_settings(), "world_model": checkpoint_digest(run.world_model),
                "tokenizer": checkpoint_digest(run.tokenizer), "backend": run.backend, "dtype": run.dtype, **told}

    def run_settings(self, progress: bool, folder: Path | None = None) -> RunSettings:
        return RunSettings(self.output.path if folder is None else folder, self.num_steps, self.policy_timeout_s,
                           max_concurrent=self.max_concurrent, resume=self.resume, progress=progress,
                           manifest=manifest_name(shard_index=self.shard_index, num_shards=self.num_shards),
                           vehicle=self.vehicle, videos=self.videos, writer_processes=self.writer_processes,
                           model_worlds=self.model_worlds, measure_on=self.run.device)


def checked_run(cfg: DictConfig) -> DriveSettings:
    """Every setting of the run itself checked once (drive less the study's), one line for a bad one."""
    values = check_schema(cfg, DriveRunConfig)
    shard, shards = values["shard_index"], values["num_shards"]
    if shard >= shards:
        raise TerraInputError(f"shard_index={shard} must be below num_shards={shards} (shards are numbered "
                              f"0..{shards - 1})")
    entries = values["policies"]
    entries = [entries] if isinstance(entries, str) else list(entries or [])
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise TerraInputError(f"policies must be a list of policy names, e.g. policies=[lane_follower,route_follower] "
                              f"(or {ALL_REFERENCE}, {ALL_PIXEL})")
    names = policy_names(entries)
    args = policy_args(names, values["navsim_args"])
    timeout_s = float(values["policy_timeout_s"])
    policies = policy_factories(names, timeout_s, values["seed"], args)
    world, user_worlds = values["world"], {}
    if isinstance(world, str) and is_world_target(world):
        user_worlds[world_name(world)] = (world, world_class(world, "world", timeout_s))
        world = world_name(world)
    elif world not in WORLDS:
        raise TerraInputError(f"unknown world {shown(world)}{did_you_mean(world, WORLDS)}; choose one of: "
                              f"{', '.join(WORLDS)}, or package.module:Class (a world of your own: docs/drive.md)")
    executor = check_executor(values["executor"])
    ray = RaySettings.parse(select(cfg, "ray"))
    image_root = values["image_root"]
    if image_root is not None and not Path(str(image_root)).expanduser().is_dir():
        raise TerraInputError(f"image_root={image_root} is not a folder; point it at the context frames' root")
    scenarios = scenario_source(str(values["scenarios"]), values["num_scenarios"], values["scenario_seed"],
                                None if image_root is None else str(image_root))
    road = values["road"]
    run = run_spec(cfg)
    scenarios = with_maps(scenarios, road, run.num_context)
    if world in ("truth", "both") and scenarios.kind != SYNTHETIC:
        raise TerraInputError(f"world={world} needs synthetic scenarios (the true world renders their scenes)")
    every = [(i, name, k) for i in range(len(scenarios.ids)) for name in policies for k in range(values["num_seeds"])]
    estimator = None if values["estimator"] is None else required_path(cfg, "estimator", "ACT-Estimator")
    if estimator is not None and not (estimator / "config.json").is_file():
        raise TerraInputError(f"estimator={estimator} holds no config.json; give the ACT-Estimator's folder")
    num_steps = DEMO_STEPS if values["num_steps"] is None else values["num_steps"]
    return DriveSettings(
        run, policies, args, scenarios, tuple(every), values["num_seeds"], world, (world,), user_worlds,
        values["vehicle"], num_steps, values["seed"], timeout_s, values["max_concurrent"], values["writer_processes"],
        values["resume"], values["progress"], estimator, shard, shards, executor, ray, values["videos"], None,
        road=road if road == SCENE_ROAD else str(Path(road).expanduser()))


def checked_shard(settings: DriveSettings, mine: Sequence[tuple[int, str, int]], total: int
                  ) -> tuple[tuple[int, str, int], ...]:
    """``mine``, this shard's drives of the run's ``total``; one line when it has none."""
    if not mine:
        raise TerraInputError(f"shard_index={settings.shard_index} of num_shards={settings.num_shards} has no drives "
                              f"(the run has {total}); use at most {total} shards")
    return tuple(mine)


def run_inputs(settings: DriveSettings) -> list[tuple[str, Any]]:
    """What the run reads, which its folder must not hold."""
    inputs = [*settings.scenarios.inputs, ("tokenizer", settings.run.tokenizer),
              ("estimator folder", settings.estimator)]
    if settings.world in ("model", "both"):
        inputs.append(("world model", settings.run.world_model))
    return inputs


def drive_settings(cfg: DictConfig, output_dir: str | Path) -> DriveSettings:
    """Every setting of a run in one world checked, this shard's drives taken and ``output_dir`` claimed."""
    settings = checked_run(cfg)
    if settings.world == "both":
        raise ValueError("world=both is the fidelity study: terra_drive_settings checks its settings")
    mine = settings.drives[settings.shard_index::settings.num_shards]  # drive k to shard k % num_shards
    settings = replace(settings, drives=checked_shard(settings, mine, len(settings.drives)))
    manifest = manifest_name(shard_index=settings.shard_index, num_shards=settings.num_shards)
    output = claim_drive_folder(output_dir, settings.drive_ids, settings.videos, manifest=manifest,
                                inputs=run_inputs(settings))
    return replace(settings, output=output)
