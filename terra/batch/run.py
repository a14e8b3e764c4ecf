"""A whole batch run: plan, check, then run the pending samples here (``executor=local``) or on Ray."""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from terra.batch.config import BatchConfig, BatchSpec, check_config, claim_output
from terra.batch.plan import BatchPlan, plan_batch, remove_stale_temporaries, top_names
from terra.batch.progress import BatchProgress
from terra.config.checks import shown
from terra.config.files import declared_route_tokens
from terra.config.manifest import Manifest, count_statuses
from terra.config.spec import redone_line
from terra.contract.routes import route_summary
from terra.core.atomic import json_text, mark, write_text
from terra.generation.pass_stats import PassStats
from terra.inputs.requests import UNUSED_ROUTES
from terra.inputs.samples import Sample

if TYPE_CHECKING:
    from terra.batch.execute import Execution
    from terra.pipeline import WorldModelPipeline

REFUSED = ("parse", "input")  # the stages of a sample refused before the model


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
        """0 when no sample failed, 2 when every sample was refused before the model (bad input), 1 when some
        failed otherwise, 128 + the signal's number when a signal stopped the run."""
        if self.interrupted_by is not None:
            return 128 + self.interrupted_by
        if self.records and all(r["status"] == "failed" and r["stage"] in REFUSED for r in self.records):
            return 2
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
    # routes are checked against the route slots config.json declares: the plan needs no torch
    route_tokens = (declared_route_tokens(config.run.world_model) if pipeline is None
                    else pipeline.backend.layout.route_tokens)
    the_plan = plan_batch(config, samples, route_tokens)
    _report(the_plan)  # each refused sample's line, before the model loads
    execution = None
    if the_plan.to_run or the_plan.skipped or not the_plan.failed:  # every sample refused: no model to check
        from terra.batch.execute import Execution  # torch and the models

        execution = Execution.start(config, len(the_plan.to_run), pipeline)
    try:
        return _run_planned(config, the_plan, started, execution)
    finally:
        if execution is not None:
            execution.close()


def _report(the_plan: BatchPlan) -> None:
    """One line on stderr per line refused or sample failed, and for samples carrying unused routes or redone."""
    for record in the_plan.failed:
        if record["stage"] == "parse":  # the error starts with "line N:"
            tqdm.write(f"terra-rollout: {Path(record['file']).name}: {record['error']}; skipping the line",
                       file=sys.stderr)
        else:
            tqdm.write(f"terra-rollout: {_describe(record)} failed: {record['error']}", file=sys.stderr)
    if the_plan.unused_routes:
        tqdm.write(f"terra-rollout: {the_plan.unused_routes} sample(s) carry routes; {UNUSED_ROUTES}", file=sys.stderr)
    if the_plan.redone:
        tqdm.write(f"terra-rollout: {redone_line(the_plan.redone, 'sample')}", file=sys.stderr)


def _run_planned(config: BatchSpec, the_plan: BatchPlan, started: float, execution: Execution | None) -> BatchResult:
    """Write the plan's records, run its samples (here or on Ray's actors), write the summary."""
    out = Path(config.output_dir)
    mark(out, {name for item in the_plan.to_run for name in top_names(item, out)})
    remove_stale_temporaries(the_plan.items)
    manifest = Manifest(config.manifest_path)
    for record in the_plan.failed + the_plan.skipped:
        manifest.add(record)
    progress = BatchProgress(the_plan.to_run, config.progress)

    def on_record(record: dict) -> None:
        if record["status"] == "failed":
            tqdm.write(f"terra-rollout: {_describe(record)} failed ({record['stage']}): {record['error']}",
                       file=sys.stderr)
        progress.recorded(record, manifest.records)

    manifest.on_record = on_record
    interrupted_by = None
    try:
        if execution is not None:
            execution.run(the_plan.to_run, manifest.add, progress.generated)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM as Interrupted
        interrupted_by = int(getattr(err, "signum", signal.SIGINT))
        raise
    finally:
        progress.close()
        manifest.close()
        remove_stale_temporaries(the_plan.items)  # of writes cut short (an interrupt, a killed worker)
        seconds = time.perf_counter() - started
        result = BatchResult(manifest.records, config.manifest_path, config.summary_path, seconds, interrupted_by)
        _write_summary(config, result, the_plan)
    return result


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
