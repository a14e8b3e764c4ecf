"""``terra-drive``: driving policies in the loop with the world model (Hydra app, ``conf/drive.yaml``).

(1) the settings, checked once before torch loads (policies named, scenarios' source, ranges); (2) the world
model (``world=model|both``) and the scenarios; (3) the drives, recorded under ``output_dir`` (terra/closedloop/
record.py: a video and JSON per drive, a manifest, resumable, the folder locked); with ``world=both`` also in the
synthetic world and the fidelity report (terra/closedloop/fidelity.py). Exit codes as conf/drive.yaml says; a user
mistake is one line (terra/apps/runner.py).
"""

from __future__ import annotations

import importlib
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from terra.apps.runner import CONFIG_PATH, check_added_settings, run_app, task
from terra.config.checks import MAX_FRAMES, Range, check_choice, check_flag, check_settings, required_path, select
from terra.config.spec import RunSpec, run_spec
from terra.core.errors import TerraInputError

SETTINGS = {
    "num_scenarios": Range(1, 100_000, 4, whole=True),
    "scenario_seed": Range(0, 2**62 - 1, 0, whole=True),
    "num_steps": Range(1, MAX_FRAMES, 20, whole=True),
    "seed": Range(0, 2**62 - 1, 0, whole=True),
    "policy_timeout_s": Range(0.001, 3600, 30),
    "max_concurrent": Range(1, 4096, 64, whole=True),
}
WORLDS = ("model", "truth", "both")
ALL_REFERENCE = "all_reference"


@dataclass(frozen=True)
class DriveAppSpec:
    """A ``terra-drive`` run, checked."""

    run: RunSpec
    policies: tuple[str, ...]
    scenarios: str
    num_scenarios: int
    scenario_seed: int
    image_root: str | None
    world: str
    num_steps: int
    seed: int
    policy_timeout_s: float
    max_concurrent: int
    resume: bool
    num_threads: int | None
    progress: bool
    estimator: Path | None  # an ACT-Estimator folder: plan following


def policy_factory(entry: str) -> Callable[[], object]:
    """A policy factory from a ``policies`` entry (conf/drive.yaml), checked now (a NAVSIM class is imported)."""
    from terra.closedloop.policies import REFERENCE_POLICIES, reference_policy

    if entry.startswith("grpc:") or entry.startswith("unix:"):
        target = entry[len("grpc:"):] if entry.startswith("grpc:") else entry

        def remote():
            from terra.closedloop.egodriver import EgodriverPolicy

            return EgodriverPolicy(target, entry)

        return remote
    if entry.startswith("navsim:"):
        module, _, name = entry[len("navsim:"):].rpartition(":")
        try:
            agent_class = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError, ValueError) as err:
            raise TerraInputError(f"policies: cannot load the NAVSIM agent {entry!r} ({type(err).__name__}: {err}); "
                                  "give navsim:package.module:Class, importable here") from None

        def agent():
            from terra.closedloop.navsim import NavsimPolicy

            return NavsimPolicy(agent_class(), name)

        return agent
    if entry not in REFERENCE_POLICIES:
        raise TerraInputError(f"policies: unknown policy {entry!r}; use one of {', '.join(REFERENCE_POLICIES)}, "
                              f"{ALL_REFERENCE}, grpc:HOST:PORT, unix:///PATH or navsim:MODULE:CLASS")
    return reference_policy(entry)


def drive_spec(cfg: DictConfig) -> DriveAppSpec:
    """Every setting of conf/drive.yaml checked once, without importing torch."""
    from terra.closedloop.policies import REFERENCE_POLICIES

    values = check_settings(cfg, SETTINGS)
    entries = select(cfg, "policies")
    entries = [entries] if isinstance(entries, str) else list(entries or [])
    if not entries or not all(isinstance(e, str) and e for e in entries):
        raise TerraInputError("policies must be a list of policy names, e.g. policies=[lane_follower,route_follower]")
    expanded = [name for e in entries for name in (REFERENCE_POLICIES if e == ALL_REFERENCE else [e])]
    if len(set(expanded)) != len(expanded):
        raise TerraInputError(f"policies names one twice ({expanded}); list each once")
    world = check_choice(select(cfg, "world"), "world", WORLDS)
    scenarios = str(select(cfg, "scenarios"))
    if scenarios != "synthetic" and not Path(scenarios).expanduser().exists():
        raise TerraInputError(f"scenarios={scenarios} does not exist; give synthetic, a folder of driving-log clips "
                              "or a JSONL of samples")
    if world != "model" and scenarios != "synthetic":
        raise TerraInputError(f"world={world} needs synthetic scenarios (the true world is the synthetic world)")
    threads = select(cfg, "num_threads")
    image_root = select(cfg, "image_root")
    estimator = None if select(cfg, "estimator") is None else required_path(cfg, "estimator", "ACT-Estimator")
    if estimator is not None and not (estimator / "config.json").is_file():
        raise TerraInputError(f"estimator={estimator} holds no config.json; give the ACT-Estimator's folder")
    return DriveAppSpec(
        run_spec(cfg), tuple(expanded), scenarios, values["num_scenarios"], values["scenario_seed"],
        None if image_root is None else str(image_root), world, values["num_steps"], values["seed"],
        float(values["policy_timeout_s"]), values["max_concurrent"], check_flag(select(cfg, "resume"), "resume"),
        None if threads is None else Range(1, 1024, 1, whole=True).check(threads, "num_threads"),
        check_flag(select(cfg, "progress"), "progress"), estimator)


def run(spec: DriveAppSpec, out_dir: Path) -> int:
    """Drive and record; the exit code (0 all drives ok, 1 some failed)."""
    from terra.closedloop import scenarios as scenario_sources
    from terra.closedloop.fidelity import run_fidelity
    from terra.closedloop.loop import DriveSpec
    from terra.closedloop.run import RunSettings, drive_and_record
    from terra.closedloop.worlds import ModelWorld, TrueWorld
    from terra.config.spec import check_window
    from terra.core.device import set_threads
    from terra.generation.backends import resolve_spec
    from terra.models.checkpoint import read_world_model_config
    from terra.pipeline import WorldModelPipeline
    from terra.session import SessionHost
    from terra.tokenizer import load_tokenizer

    set_threads(spec.num_threads)
    factories = {entry: policy_factory(entry) for entry in spec.policies}
    run_settings = resolve_spec(spec.run, spec.max_concurrent)  # a vLLM engine's decoding: for the drives at once
    tokenizer = load_tokenizer(run_settings.tokenizer)
    size = tuple(tokenizer.image_size)
    if spec.scenarios == "synthetic":
        scenarios = scenario_sources.synthetic_scenarios(spec.num_scenarios, spec.scenario_seed, size,
                                                         run_settings.num_context)
    elif Path(spec.scenarios).expanduser().is_dir():
        scenarios = scenario_sources.log_scenarios(spec.scenarios, size, run_settings.num_context, run_settings.resize)
    else:
        scenarios = scenario_sources.sample_scenarios(spec.scenarios, size, run_settings.num_context, spec.image_root,
                                                      run_settings.resize)
    settings = RunSettings(out_dir, spec.num_steps, spec.policy_timeout_s, max_concurrent=spec.max_concurrent,
                           resume=spec.resume, progress=spec.progress and sys.stderr.isatty())
    model = {"world_model": run_settings.world_model, "tokenizer": run_settings.tokenizer,
             "sampling": run_settings.sampling.__dict__, "backend": run_settings.backend}
    following = None
    if spec.estimator is not None:
        from terra.closedloop.plan_following import PlanFollowing

        following = PlanFollowing(spec.estimator, str(run_settings.device) if spec.world != "truth" else "cpu")
    host = None
    if spec.world != "truth":
        config = read_world_model_config(run_settings.world_model)
        check_window(config.num_temporal_embeddings, run_settings.num_context, run_settings.overlap)
        pipeline = WorldModelPipeline.from_spec(run_settings, tokenizer, config)
        host = SessionHost(pipeline, run_settings.sampling, max_frames=spec.num_steps, overlap=run_settings.overlap,
                           num_context=run_settings.num_context, resize=run_settings.resize)
    try:
        if spec.world == "both":
            report = run_fidelity(ModelWorld(host), TrueWorld(size), scenarios, factories, settings, spec.seed, model,
                                  following)
            print(report.table())
            print(f"terra-drive: wrote {out_dir}/fidelity.md, fidelity.json, model/ and truth/")
            failed = sum(row["failed"] for row in report.policies.values())
        else:
            world = ModelWorld(host) if host is not None else TrueWorld(size)
            specs = [DriveSpec(s, name, factory, seed=spec.seed + i) for i, s in enumerate(scenarios)
                     for name, factory in factories.items()]
            result = drive_and_record(world, specs, settings, model if host is not None else {}, following)
            c = result.counts
            print(f"terra-drive: {c['ok']} drives ok, {c['failed']} failed, {c['skipped']} already complete in "
                  f"{result.seconds:.1f} s (world {result.generate_s:.1f} s, policies {result.policy_s:.1f} s); "
                  f"{out_dir}/manifest.jsonl")
            failed = c["failed"]
    finally:
        if host is not None:
            host.close()
            host.pipeline.close()
    return 1 if failed else 0


@hydra.main(config_path=CONFIG_PATH, config_name="drive", version_base=None)
@task
def _main(cfg: DictConfig) -> None:
    check_added_settings("terra-drive", allowed=("backend.options.",))
    logging.getLogger("carla_driver_interface").setLevel(logging.WARNING)  # one line per gRPC session otherwise
    spec = drive_spec(cfg)
    out_dir = Path(str(cfg.output_dir)).expanduser() if cfg.output_dir else Path(HydraConfig.get().runtime.output_dir)
    sys.exit(run(spec, out_dir))


def main() -> None:
    """Console-script entry point; how it ends is terra/apps/runner.py's run_app."""
    run_app(_main, "terra-drive")


if __name__ == "__main__":
    main()
