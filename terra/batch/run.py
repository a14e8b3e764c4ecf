"""A whole batch run: plan, check, then run the pending samples here (``executor=local``) or on Ray."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from terra.batch.concurrency import planned_rollouts
from terra.batch.config import BatchConfig, BatchSpec, check_config, claim_output
from terra.batch.plan import BatchPlan, plan_batch, remove_stale_temporaries, top_names
from terra.batch.progress import BatchProgress
from terra.batch.stream import run_items
from terra.config.checks import shown
from terra.config.manifest import Manifest, count_statuses
from terra.config.spec import redone_line
from terra.contract.routes import route_summary
from terra.core.atomic import json_text, mark, write_text
from terra.core.device import set_threads
from terra.generation.resolve import check_model
from terra.generation.pass_stats import PassStats
from terra.inputs.requests import UNUSED_ROUTES
from terra.inputs.samples import Sample
from terra.pipeline import WorldModelPipeline, check_compatible
from terra.refiner import RefinerSettings, check_decoder
from terra.run import resolve_run
from terra.tokenizer import load_tokenizer


@dataclass
class BatchResult:

    records: list[dict]
    manifest: Path
    summary: Path
    seconds: float
    interrupted_by: int | None = None  # the signal that stopped the run (Ctrl-C: SIGINT), if one did

    @property
    def counts(self) -> dict[str, int]:
        """``{"ok": ..., "failed": ..., "skipped": ...}``."""
        return count_statuses(self.records)

    @property
    def exit_code(self) -> int:
        """0 when no sample failed, 1 when some did, 128 + the signal's number when a signal stopped the run."""
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        return 1 if self.counts["failed"] else 0

    @property
    def per_actor(self) -> dict[str, dict]:
        """``executor=ray``: each actor's node, GPUs and sample counts."""
        actors: dict[str, dict] = {}
        for record in self.records:
            if record.get("actor") is not None:
                entry = actors.setdefault(str(record["actor"]), {"node": record["node"], "gpus": record["gpus"],
                                                                 "ok": 0, "failed": 0, "retried": 0})
                entry["ok" if record["status"] == "ok" else "failed"] += 1
                entry["retried"] += "attempts" in record
        return dict(sorted(actors.items(), key=lambda kv: int(kv[0])))

    @property
    def decoding(self) -> tuple[str, PassStats] | None:
        """``(decodings that ran, summed passes)`` of the samples this run generated; None when none."""
        blocks = [r["decoding"] for r in self.records if r.get("decoding")]
        if not blocks:
            return None
        return ("+".join(sorted({b["decoding"] for b in blocks})),
                sum((PassStats.from_dict(b) for b in blocks), PassStats()))

    def route_line(self) -> str | None:
        """How many frames of the samples run now that gave routes were told one, and why the others not; None: all
        were, or no sample gave routes."""
        verdicts = [v for record in self.records for v in record.get("route_told") or ()]
        return route_summary(verdicts) if verdicts else None

    def summary_line(self) -> str:
        c = self.counts
        return (f"{c['ok']} succeeded, {c['failed']} failed, {c['skipped']} skipped (already complete) "
                f"of {len(self.records)} samples in {self.seconds:.1f} s; manifest: {self.manifest}")


def run_batch(config: BatchConfig | BatchSpec, pipeline: WorldModelPipeline | None = None,
              samples: list[Sample] | None = None) -> BatchResult:
    """Plan and run a batch; return its records. ``pipeline`` reuses a loaded pipeline of the same world model.

    Raises :class:`TerraInputError` before any work; per-sample failures are recorded.
    """
    spec, output = (check_config(config) if isinstance(config, BatchConfig)  # before the folder and its lock
                    else (config, claim_output(config)))
    with output.hold(spec.manifest_path.name):
        return run_locked(spec, pipeline, samples)


def run_locked(config: BatchSpec, pipeline: WorldModelPipeline | None = None,
               samples: list[Sample] | None = None) -> BatchResult:
    """:func:`run_batch` for checked settings while the caller holds the output folder's lock."""
    started = time.perf_counter()
    # the model's config read once, before the plan: routes are checked against its route slots
    model_config = check_model(config.run) if config.executor == "ray" or pipeline is None else None
    route_tokens = pipeline.backend.layout.route_tokens if model_config is None else model_config.num_route_tokens
    the_plan = plan_batch(config, samples, route_tokens)
    executor = run = None
    own = False  # whether this run built the pipeline (and closes it)
    if config.executor == "ray":  # the actors resolve their runs on their devices, with the config read here
        refiner = check_decoder(config.run)
    elif pipeline is None:  # the settings fit the model even when no sample is left to run
        streams, most = planned_rollouts(config, len(the_plan.to_run))
        run = resolve_run(config.run, streams, model=model_config, max_rollouts=most)
        refiner = run.refiner
    else:  # a loaded pipeline: its device
        set_threads(config.run.num_threads)
        refiner = check_decoder(config.run.replace(device=pipeline.device))
    if the_plan.to_run:
        if config.executor == "ray":
            set_threads(config.run.num_threads)  # the tokenizer's load here
            check_compatible(model_config, load_tokenizer(config.run.tokenizer))  # the actors load their own
            executor = _ray_executor(config)
        elif pipeline is None:  # the pair is checked before any output is written
            pipeline = WorldModelPipeline.from_run(run)
            own = True
    try:
        return _run_planned(config, the_plan, started, pipeline, executor, refiner, model_config)
    finally:
        if own:
            pipeline.close()


def _run_planned(config: BatchSpec, the_plan: BatchPlan, started: float, pipeline: WorldModelPipeline | None,
                 executor, refiner: RefinerSettings | None, model_config) -> BatchResult:
    """Write the plan's records, run its samples (here or on Ray's actors), write the summary."""
    out = Path(config.output_dir)
    mark(out, {name for item in the_plan.to_run for name in top_names(item, out)})
    remove_stale_temporaries(the_plan.items)
    manifest = Manifest(config.manifest_path)
    for record in the_plan.failed + the_plan.skipped:
        manifest.add(record)
        if record["stage"] == "parse":  # the error starts with "line N:"
            tqdm.write(f"terra-rollout: {Path(record['file']).name}: {record['error']}; skipping the line",
                       file=sys.stderr)
        elif record["status"] == "failed":
            tqdm.write(f"terra-rollout: {_describe(record)} failed: {record['error']}", file=sys.stderr)
    if the_plan.unused_routes:
        tqdm.write(f"terra-rollout: {the_plan.unused_routes} sample(s) carry routes; {UNUSED_ROUTES}", file=sys.stderr)
    if the_plan.redone:
        tqdm.write(f"terra-rollout: {redone_line(the_plan.redone, 'sample')}", file=sys.stderr)
    progress = BatchProgress(the_plan.to_run, config.progress)

    def on_record(record: dict) -> None:
        if record["status"] == "failed":
            tqdm.write(f"terra-rollout: {_describe(record)} failed ({record['stage']}): {record['error']}",
                       file=sys.stderr)
        progress.recorded(record, manifest.records)

    manifest.on_record = on_record
    interrupted_by = None
    try:
        if executor is not None:
            executor.run(the_plan.to_run, model_config, manifest.add, progress.generated)
        elif the_plan.to_run:
            run_items(the_plan.to_run, config, pipeline, manifest.add, None if refiner is None else refiner.load(),
                      on_frame=progress.generated)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM as Interrupted
        interrupted_by = int(getattr(err, "signum", signal.SIGINT))
        raise
    finally:
        if executor is not None:
            executor.close()
        progress.close()
        manifest.close()
        remove_stale_temporaries(the_plan.items)  # of writes cut short (an interrupt, a killed worker)
        seconds = time.perf_counter() - started
        result = BatchResult(manifest.records, config.manifest_path, config.summary_path, seconds, interrupted_by)
        _write_summary(config, result, the_plan)
    return result


def _ray_executor(config: BatchSpec):
    from terra.batch.ray_executor import RayExecutor

    executor = RayExecutor(config)
    executor.connect()
    return executor


def _describe(record: dict) -> str:
    """``sample 'x' (samples.jsonl line 3)``, or the line alone for a record without a sample id."""
    where = f"{Path(record['file']).name} line {record['line']}"
    return where if record["sample_id"] is None else f"sample {shown(record['sample_id'])} ({where})"


def _write_summary(config: BatchSpec, result: BatchResult, the_plan: BatchPlan) -> None:
    """Write ``<manifest stem>.summary.json``: counts, timing, shard, exit code."""
    ran = [r for r in result.records if r["status"] == "ok" and r.get("seconds") is not None]
    summary = {
        "counts": result.counts, "samples": len(result.records), "seconds": round(result.seconds, 3),
        "mean_seconds_per_ok_sample": round(sum(r["seconds"] for r in ran) / len(ran), 3) if ran else None,
        "shard_index": config.shard_index, "num_shards": config.num_shards, "replaced_stale": len(the_plan.redone),
        "manifest": result.manifest.name, "exit_code": result.exit_code, "executor": config.executor,
        **({"interrupted_by": signal.Signals(result.interrupted_by).name} if result.interrupted_by else {}),
        **({"actors": result.per_actor} if config.executor == "ray" else {}),
        "decoding": None if result.decoding is None else {"decoding": result.decoding[0],
                                                           **result.decoding[1].as_dict()},
    }
    write_text(result.summary, json_text(summary, indent=2) + "\n")
