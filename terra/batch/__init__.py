"""Batch rollouts: a JSONL of samples → one video (+ JSON sidecar) per sample, resumable, sharded, multi-GPU.

The Python API behind ``scripts/rollout.py``; notebooks call it directly::

    from terra.batch import BatchConfig, run_batch
    result = run_batch(BatchConfig(samples="samples.jsonl", output_dir="out", backend="hf", num_frames=16))
    result.counts        # {"ok": 3, "failed": 0, "skipped": 0}
    result.records       # one manifest record per sample

Sample formats (one JSON object per line; blank lines are ignored)
---------------------------------------------------------------
* ACT-Bench: ``sample_id``, ``context_frames`` (image paths relative to ``image_root``), ``instruction_trajs``
  (``[T, 60, 3]`` future trajectories, one per frame, frame 0 = ``context_frames[0]``), optional ``label``.
* Terra's own: ``sample_id``, ``context`` (an image/video path, folder, glob, or a list of them; relative paths
  are resolved against ``image_root``) and at most one trajectory form (``terra.inputs.TRAJECTORY_KEYS``):
  ``trajectory`` (a file path, resolved against the JSONL's folder, or an inline world-frame ego trajectory
  ``{"x": [...], "y": [...]}``), ``actions`` (``[T, 6, 3]``), ``instruction_trajs`` or ``manoeuvre`` (a name or
  ``{"name": ..., "speed_kmh": ...}``). Without any, ``default_manoeuvre`` is used. Frame 0 of the trajectory is
  the first context frame used (the last ``num_context`` frames of ``context``), as in ``terra-generate``; both
  formats become requests through :mod:`terra.inputs`, as there.
* Both may set ``seed`` (default: ``seed + index``, index = 0-based line number over all input lines, so a
  sample's seed does not depend on sharding or batching), ``num_frames`` and ``label``.

``sample_id`` is an integer or a string without path separators; it must be unique.

Outputs (under ``output_dir``)
------------------------------
* Videos: ``video_pattern`` per format (fields ``sample_id``, ``ext``, ``line``, ``label``), every frame of the
  rollout (context frames first). ``naming="default"``: ``{sample_id}.{ext}``. ``naming="actbench"``:
  ``NUSCENES_ACTION_{sample_id:06d}.{ext}`` — the name Terra's ACT-Bench generation script writes; ACT-Bench's
  scorer globs ``*.mp4`` in one folder and parses the sample id from the ``_<digits>`` suffix of each file name,
  so integer sample ids are needed and ``num_frames`` must leave at least 44 frames (it scores the last 44:
  ``num_frames=44`` with 3 context frames); overlays stay off for scoring. ``png`` writes a folder
  ``<stem>_frames/``.
* Sidecar: ``sidecar_pattern`` (default ``{sample_id}.json``), :func:`decoder.write_sidecar` plus a ``batch``
  block (fingerprint of the sample and the generation settings). It is written last: a sample is complete when
  its sidecar exists, carries the same fingerprint and every file it lists exists. All writes are atomic
  (temporary file + rename); temporary files left by a killed run are removed when the sample is planned again.
* Manifest: ``manifest.jsonl`` (``manifest.shard-<i>-of-<n>.jsonl`` when sharded), rewritten by every run, one
  record per sample as it finishes: ``sample_id``, ``line``, ``file``, ``status`` (``ok`` | ``failed`` |
  ``skipped`` = already complete), ``stage`` of a failure (``parse`` | ``input`` | ``generate`` | ``write``),
  ``error`` (one line), ``seconds``, ``seed``, ``files``, ``finished_at`` (Unix time).
  ``<manifest stem>.summary.json`` holds the counts. Malformed lines are recorded as failed with stage ``parse``
  (``sample_id`` null, ``line`` set).

Concurrency and scale-out
-------------------------
Samples go to the backend in chunks of ``max_concurrent`` rollouts per ``generate`` call; the next chunk is read
and encoded on a helper thread while the current one generates. A sample's video is decoded and written by one
of ``writer_threads`` threads as soon as its last frame is generated, while the others keep going.
``shard_index``/``num_shards`` split the input by line index modulo ``num_shards`` (every line in exactly one
shard, malformed ones included). ``num_gpus``/``gpus`` start one engine per GPU (or per group of
``tensor_parallel_size`` GPUs) in spawned worker processes with ``CUDA_VISIBLE_DEVICES`` set; worker ``w`` of
``n`` takes every n-th pending sample. Only the parent writes the manifest.

Changing the model or tokenizer folder does not invalidate finished samples: use a new ``output_dir`` (or
``resume=False``) for another checkpoint. The model's ``zero_embed_code_0`` and the tokenizer's ``resize``
(``conf/model``, ``conf/tokenizer``) are part of the fingerprint: changing them regenerates finished samples.

Modules: :mod:`~terra.batch.config` (settings and their checks), :mod:`~terra.batch.samples` (JSONL lines,
shards), :mod:`~terra.batch.plan` (output files, fingerprints, resume), :mod:`~terra.batch.manifest`,
:mod:`~terra.batch.engine` (prepare → generate → write on one engine), :mod:`~terra.batch.workers` (one process
per GPU), :mod:`~terra.batch.run` (:func:`run_batch`).
"""

from terra.batch.config import DEMO, NAMING, BatchConfig, check_config, config_from_omegaconf
from terra.batch.engine import build_pipeline, run_items
from terra.batch.manifest import STATUSES, Manifest, count_statuses, read_manifest
from terra.batch.plan import BatchPlan, Item, fingerprint, is_complete, plan, remove_stale_temporaries
from terra.batch.run import BatchResult, run_batch
from terra.batch.samples import Sample, in_shard, read_samples, shard_indices
from terra.batch.workers import gpu_groups

__all__ = [
    "DEMO", "NAMING", "STATUSES", "BatchConfig", "BatchPlan", "BatchResult", "Item", "Manifest", "Sample",
    "build_pipeline", "check_config", "config_from_omegaconf", "count_statuses", "fingerprint", "gpu_groups",
    "in_shard", "is_complete", "plan", "read_manifest", "read_samples", "remove_stale_temporaries", "run_batch",
    "run_items", "shard_indices",
]
