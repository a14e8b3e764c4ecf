"""Batch rollouts: a JSONL of samples -> one video and JSON sidecar per sample; resumable, sharded, on Ray.

The Python API behind ``terra-rollout``::

    from terra.batch import BatchConfig, run_batch
    result = run_batch(BatchConfig(samples="samples.jsonl", output_dir="out", backend="hf", num_frames=16))
    result.counts        # {"ok": 3, "failed": 0, "skipped": 0}
"""

from __future__ import annotations

from terra.core.lazy import lazy_face

# The names load on first use, so ``terra.batch.config`` imports no torch.
_HOMES = {
    "BatchConfig": "terra.batch.config", "BatchSpec": "terra.batch.config", "NAMING": "terra.batch.config",
    "batch_spec": "terra.batch.config", "check_config": "terra.batch.config", "claim_output": "terra.batch.config",
    "Manifest": "terra.config.manifest", "STATUSES": "terra.config.manifest",
    "count_statuses": "terra.config.manifest", "read_manifest": "terra.config.manifest",
    "BatchPlan": "terra.batch.plan", "Item": "terra.batch.plan", "made_from": "terra.batch.plan",
    "is_complete": "terra.batch.plan", "plan_batch": "terra.batch.plan", "remove_stale_temporaries": "terra.batch.plan",
    "BatchResult": "terra.batch.run", "run_batch": "terra.batch.run",
    "in_shard": "terra.batch.samples", "shard_indices": "terra.batch.samples",
    "StreamingEngine": "terra.batch.stream", "run_items": "terra.batch.stream",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)
