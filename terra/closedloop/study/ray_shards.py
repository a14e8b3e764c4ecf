"""A fidelity study on a Ray cluster: its shards as Ray tasks, its exploitability study, then its report."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable

import ray

from terra.closedloop.recording.drives import DriveOutcome
from terra.closedloop.study.exploit import ExploitStudy, exploit_beside
from terra.closedloop.study.processes import ShardProcesses, engine_share, follow
from terra.closedloop.study.settings import StudySettings, study_shard
from terra.config.spec import RunSpec
from terra.core.errors import TerraInputError
from terra.core.ray_cluster import RayCluster, cause

StudyDrive = Callable[..., DriveOutcome]  # a study driven on this machine: (settings, progress, exploit=)


def ray_groups(processes: ShardProcesses, slots: int, drives: int) -> tuple[dict[str, int], int]:
    """The study's shards on a cluster of ``slots`` GPUs (groups) or CPU actors."""
    per_gpu = max(1, processes.engine)
    groups = {"engine": slots * per_gpu, "scene": slots * processes.scene} if processes.scene else \
        {"all": slots * per_gpu}
    return {worlds: min(count, drives) for worlds, count in groups.items()}, per_gpu


def task_options(cluster: RayCluster, per_gpu: int) -> dict[str, dict[str, Any]]:
    """The ``ray.remote`` arguments of a task with an engine and of a CPU-only task."""
    actor = cluster.options
    base = {"num_cpus": actor["num_cpus"], "max_retries": cluster.settings.max_retries,
            **({"runtime_env": actor["runtime_env"]} if "runtime_env" in actor else {})}
    return {"engine": {**base, "num_gpus": actor["num_gpus"] / per_gpu, "max_calls": 1},
            "scene": {**base, "num_gpus": 0}}


def on_worker(settings: StudySettings, spec: RunSpec) -> StudySettings:
    """``settings`` driven in a Ray task on ``spec``, without a bar or shard processes."""
    return replace(settings, drive=replace(settings.drive, run=spec, executor="local", progress=False),
                   shard_processes=ShardProcesses())


def on_gpus(settings: StudySettings) -> StudySettings:
    """``settings`` on the GPUs Ray gave this task (none on the CPU: pipeline, ``actor_spec``)."""
    from terra.pipeline import actor_spec  # torch: in the worker

    run = settings.drive
    return replace(settings, drive=replace(run, run=actor_spec(run.run, [str(g) for g in ray.get_gpu_ids()])))


def drive_task(settings: StudySettings, drive: StudyDrive, exploit: ExploitStudy | None = None) -> DriveOutcome:
    """A shard of the study (``study_shard``'s), or its report step with ``exploit``, driven in this Ray task."""
    return drive(on_gpus(settings), progress=False, exploit=exploit)


def exploitability(settings: StudySettings) -> ExploitStudy:
    """The study's exploitability study in this Ray task, in worlds of its own on its GPUs."""
    return exploit_beside(on_gpus(settings).drive, settings.folders.top.path)


def study_on_ray(settings: StudySettings, drive: StudyDrive) -> DriveOutcome:
    """The whole study ``settings`` on the cluster of its ``ray`` settings."""
    spec = settings.drive.run
    cluster = RayCluster(settings.drive.ray, spec.device, int(spec.backend_options.get("tensor_parallel_size", 1) or 1))
    cluster.connect()
    try:
        return _on_cluster(settings, cluster, drive)
    finally:
        cluster.close()


def _on_cluster(settings: StudySettings, cluster: RayCluster, drive: StudyDrive) -> DriveOutcome:
    folders, spec = settings.folders, settings.drive.run
    groups, per_gpu = ray_groups(settings.shard_processes, cluster.count, len(folders.drive_ids["model"]))
    options = task_options(cluster, per_gpu)
    threads = max(1, int(cluster.settings.cpus_per_actor))
    specs = {"engine": spec.replace(num_threads=threads, backend_options={
                 **spec.backend_options, **engine_share(settings.shard_processes.kv_cache_gib, per_gpu)}),
             "scene": spec.replace(num_threads=threads, device="cpu", backend="hf")}  # no engine: the CPU's
    kind = {"engine": "engine", "all": "engine", "scene": "scene"}
    whole = on_worker(settings, specs["engine"])
    started = time.perf_counter()
    shards = {ray.remote(**options[kind[worlds]])(drive_task).remote(
        on_worker(study_shard(settings, worlds, i, count), specs[kind[worlds]]), drive): (worlds, i, count)
        for worlds, count in groups.items() for i in range(count)}
    exploit = ray.remote(**options["engine"])(exploitability).remote(whole) if settings.exploitability \
        else None
    refs = list(shards)
    total = sum(len(ids) for ids in folders.drive_ids.values())
    follow(folders.top.path, total, len(refs), lambda: bool(ray.wait(refs, num_returns=len(refs), timeout=0)[1]))
    codes = []
    try:
        for ref, (worlds, i, count) in shards.items():
            codes.append(_ended(ref, f"shard {i} of {count} ({worlds} worlds)").exit_code)
        line = (f"terra-drive: {len(refs)} Ray shards ({', '.join(f'{n} {w}' for w, n in groups.items())}) ended in "
                f"{time.perf_counter() - started:.1f} s (exit codes {codes})")
        outcome = _ended(ray.remote(**options["engine"])(drive_task).remote(whole, drive, exploit), "the report step")
    except BaseException:
        if exploit is not None:
            ray.cancel(exploit, force=True)
        raise
    return DriveOutcome([line, *outcome.lines], max([outcome.exit_code, *codes]))


def _ended(ref: Any, what: str) -> Any:
    """What the task ``ref`` (``what``, for the line) returned; one line when it failed or lost its worker for good."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as err:  # the task's own error
        raise TerraInputError(f"{what} failed on Ray: {cause(err)}") from None
    except ray.exceptions.RayError as err:  # its worker died more than ray.max_retries times
        raise TerraInputError(f"{what} lost its Ray worker ({cause(err)}); the same command again resumes the study, "
                              "every finished drive kept") from None
