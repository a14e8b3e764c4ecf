"""A fidelity study on a Ray cluster (``terra-drive world=both executor=ray``, the study presets too): its shards as
Ray tasks placed by what they need, beside them its exploitability study, then its report on a worker: the report one
machine writes.

The study is split as its shard processes split it (terra/closedloop/study/processes.py), the counts per GPU (group)
of the cluster, or per CPU actor on a cluster without GPUs or with ``device=cpu`` (``ray.num_actors`` of either at
most: terra/core/ray_cluster.py): ``shard_processes.engine`` shards (at least one) of the worlds the world model draws,
each an engine on its share of a GPU (``1 / engine`` of the card, and ``kv_cache_gib`` of KV cache), and
``shard_processes.scene`` shards of the other worlds on the CPU (none: the engine's shards drive every world). A shard
is what ``terra-drive ... shard_index=i num_shards=K shard_worlds=<group>`` would check (terra/closedloop/study/
settings.py, ``study_shard``), run in a task: it writes its drives into the run folder as a shard process does (on
several nodes a shared file system, at the same path on each). Each task reserves ``ray.cpus_per_actor`` cores and
runs torch on as many threads. With ``exploitability=true`` the exploitability study runs beside the shards in a task
on an engine's share. Once every shard has ended, the report step (the whole study, its drives all recorded: it drives
none again, as after shard processes, and reports the exploitability study made beside them) runs in a task on an
engine's share, so that a drive that failed in a shard is made again there, where the engine runs.

A worker that dies (a process killed, a node lost) has its task run again (``ray.max_retries`` times), which keeps the
drives its shard had finished: each drive's files are complete with their fingerprint (terra/closedloop/recording/
files.py). A shard still lost stops the run before the report in one line; the same command again resumes, every
finished drive kept. Ray is imported only here.
"""

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
    """The study's shards on a cluster of ``slots`` GPUs (groups) or CPU actors: ``shard_worlds`` -> how many (at most
    ``drives``, the study's drives in the model world, so that none is empty), and the engines a GPU (group) holds."""
    per_gpu = max(1, processes.engine)
    groups = {"engine": slots * per_gpu, "scene": slots * processes.scene} if processes.scene else \
        {"all": slots * per_gpu}
    return {worlds: min(count, drives) for worlds, count in groups.items()}, per_gpu


def task_options(cluster: RayCluster, per_gpu: int) -> dict[str, dict[str, Any]]:
    """The ``ray.remote`` arguments of a task with an engine (``1 / per_gpu`` of a GPU group, or a CPU actor's cores;
    a process of its own, whose engine ends with it) and of a task on the CPU alone; either runs again on another
    worker when its own dies (``ray.max_retries``)."""
    actor = cluster.options
    base = {"num_cpus": actor["num_cpus"], "max_retries": cluster.settings.max_retries,
            **({"runtime_env": actor["runtime_env"]} if "runtime_env" in actor else {})}
    return {"engine": {**base, "num_gpus": actor["num_gpus"] / per_gpu, "max_calls": 1},
            "scene": {**base, "num_gpus": 0}}


def on_worker(settings: StudySettings, spec: RunSpec) -> StudySettings:
    """``settings`` driven in a Ray task on ``spec`` (each task's own: its engine's share, or the CPU's), in the
    task's process, without a bar and without shard processes."""
    return replace(settings, drive=replace(settings.drive, run=spec, executor="local", progress=False),
                   shard_processes=ShardProcesses())


def on_gpus(settings: StudySettings) -> StudySettings:
    """``settings`` on the GPUs Ray gave this task (none on the CPU: terra/pipeline.py, ``actor_spec``)."""
    from terra.pipeline import actor_spec  # torch: in the worker

    run = settings.drive
    return replace(settings, drive=replace(run, run=actor_spec(run.run, [str(g) for g in ray.get_gpu_ids()])))


def drive_shard(settings: StudySettings, drive: StudyDrive) -> DriveOutcome:
    """A shard of the study (``study_shard``'s), driven in this Ray task by ``drive``."""
    return drive(on_gpus(settings), progress=False)


def exploitability(settings: StudySettings) -> ExploitStudy:
    """The study's exploitability study in this Ray task, in worlds of its own on its GPUs (terra/closedloop/study/
    exploit.py, ``exploit_beside``)."""
    return exploit_beside(on_gpus(settings).drive, settings.folders.top.path)


def report(settings: StudySettings, exploit: ExploitStudy | None, drive: StudyDrive) -> DriveOutcome:
    """The study's report step in this Ray task: the whole study over its shards' drives, with ``exploit``, by
    ``drive``."""
    return drive(on_gpus(settings), progress=False, exploit=exploit)


def study_on_ray(settings: StudySettings, drive: StudyDrive) -> DriveOutcome:
    """The whole study ``settings`` on the cluster of its ``ray`` settings: the shards and the exploitability study,
    then the report; the lines to print (the shards' line, then the report step's) and the worst exit code. A shard
    lost with its worker beyond ``ray.max_retries`` or refused, or a report step that fails, is one line. ``drive``
    drives a study on this machine (terra/closedloop/study/drives.py, ``drive_study``): each shard's, then the
    report step's."""
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
    shards = {ray.remote(**options[kind[worlds]])(drive_shard).remote(
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
        outcome = _ended(ray.remote(**options["engine"])(report).remote(whole, exploit, drive), "the report step")
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
