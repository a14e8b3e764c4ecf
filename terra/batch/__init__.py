"""Batch rollouts: a JSONL of samples → one video (+ JSON sidecar) per sample, resumable, sharded, on Ray.

The Python API behind ``terra-rollout``; notebooks call it directly::

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
  sample's seed does not depend on sharding or batching), ``num_frames`` and ``label``, and, for a model with
  route slots, ``routes`` (one route per frame from the trajectory's frame 0, ``[T, K, 2|3]``; ACT-Bench's rows of
  unused context frames dropped as their ``instruction_trajs`` are; or in a JSON ``trajectory`` file, not both:
  :mod:`terra.inputs.requests`). Each sidecar's ``route``, ``route_source`` and ``ego_routes`` say whether routes
  conditioned its rollout, where they came from and each frame's (:func:`terra.outputs.route_record`).

``sample_id`` is an integer or a string without path separators; it must be unique.

Lines are strict JSON (no NaN, ``1e400``, 400-digit integers or nesting past the parser). Context paths must lie
inside ``image_root`` (absolute and ``../`` paths that leave it are refused unless
``allow_paths_outside_image_root``). Every sample still to run has its inputs checked before the model loads
(terra/batch/samples.py: files regular, image headers within the pixel limit, the trajectory built;
terra/batch/plan.py: output names that fit the file system): a bad sample is recorded as failed, the others run.

Outputs (under ``output_dir``)
------------------------------
* Videos: ``video_pattern`` per format (fields ``sample_id``, ``ext``, ``line``, ``label``), every frame of the
  rollout (context frames first). ``naming="default"``: ``{sample_id}.{ext}``. ``naming="actbench"``:
  ``NUSCENES_ACTION_{sample_id:06d}.{ext}`` — the name Terra's ACT-Bench generation script writes; ACT-Bench's
  scorer globs ``*.mp4`` in one folder and parses the sample id from the ``_<digits>`` suffix of each file name,
  so integer sample ids are needed and ``num_frames`` must leave at least 44 frames (it scores the last 44:
  ``num_frames=44`` with 3 context frames); overlays stay off for scoring. ``png`` writes a folder
  ``<stem>_frames/``.
* Sidecar: ``sidecar_pattern`` (default ``{sample_id}.json``), :func:`terra.decoder.write_sidecar` plus a ``batch``
  block (what shaped the sample, by part: the world model's and tokenizer's config and weights, the content of the
  files it reads, its line and the generation settings, and their fingerprint: terra/batch/plan.py; each file's size
  and hash). It is written last: a sample is complete when its sidecar exists, carries the same fingerprint and
  every file it lists is as written. All writes are atomic
  (temporary file + rename); temporary files left by a killed run are removed when the sample is planned again.
* Manifest: ``manifest.jsonl`` (``manifest.shard-<i>-of-<n>.jsonl`` when sharded), rewritten by every run, one
  record per sample as it finishes: ``sample_id``, ``line``, ``file``, ``status`` (``ok`` | ``failed`` |
  ``skipped`` = already complete), ``stage`` of a failure (``parse`` | ``input`` | ``generate`` | ``write``),
  ``error`` (one line), ``seconds``, ``seed``, ``files``, ``finished_at`` (Unix time); an ``ok`` record also has
  ``generate_s``, ``generated_at`` (Unix time its rollout left the engine, before decoding and writing) and
  ``decoding`` (``sampling.decoding`` as it ran, its ``draft_tokens``, forward passes, passes per frame and tokens per
  pass; the sidecar has the same block). ``<manifest stem>.summary.json`` holds the counts and the run's
  ``decoding`` figures summed over its samples. Malformed lines are recorded as failed with stage ``parse``
  (``sample_id`` null, ``line`` set). Each record is one atomic append (:class:`~terra.config.manifest.Manifest`).
* While a run goes, ``.<manifest stem>.lock`` holds the folder (:mod:`~terra.core.lock`): a second run of the
  same shard into it fails at once, naming the first. An interrupted run (Ctrl-C, SIGTERM) keeps the samples
  finished so far with their records and leaves no partial file; rerunning finishes it.

Concurrency and scale-out
-------------------------
Each engine keeps ``max_concurrent`` rollouts in flight (``auto``: what vLLM's KV cache holds for the run's
window; one on the Transformers backend where it decodes speculatively, as on a CPU: :mod:`~terra.batch.concurrency`):
samples are read and encoded on a helper thread ahead of the engine, a finished rollout's slot goes to the next
sample at once (no barrier between samples), and a sample's video is decoded and written by one of
``writer_threads`` threads as soon as its last frame is generated.
``executor=local`` runs one engine in this process. ``executor=ray`` runs one engine per GPU (or per group of
``tensor_parallel_size`` GPUs; on a cluster without GPUs, ``ray.num_actors`` CPU engines) as Ray actors on the
cluster at ``ray.address`` (a local one for the run when unset); samples stream to the actors, Ray restarts an
actor that dies and its unfinished samples are retried (``ray.max_retries``, then failed with the error).
Records go back to the driver, which alone writes the manifest (with ``actor``, ``node`` and ``gpus`` fields;
the summary counts per actor). Outputs go to ``output_dir`` from every node, so on several machines it must be
a shared folder, as must the images. ``shard_index``/``num_shards`` split the input by line index modulo
``num_shards`` (every line in exactly one shard, malformed ones included) for runs split by hand.

A rerun redoes a finished sample whose inputs changed: its line, a context image or video, its trajectory file
(routes included), the world model or the tokenizer (other config or weights, in whatever folder; digested once
per run, about a second a gigabyte). A kept sample's files are checked against the sizes and hashes its sidecar
recorded when they were written: one cut short or swapped is made again. The model's ``zero_embed_code_0`` and
the tokenizer's ``resize`` (``conf/model``, ``conf/tokenizer``) are part of the fingerprint: changing them
regenerates finished samples.

Modules: :mod:`~terra.batch.config` (settings and their checks), :mod:`~terra.batch.samples` (a sample's inputs
checked, shards; its JSONL line is read by :mod:`terra.inputs.samples`), :mod:`~terra.batch.plan` (output files,
fingerprints, resume), :mod:`~terra.batch.manifest`, :mod:`~terra.batch.prepared_sample` (a sample ready for the
engine), :mod:`~terra.batch.writer` (decode and write), :mod:`~terra.batch.stream` (the loop that keeps one engine
full), :mod:`~terra.batch.concurrency` (``max_concurrent=auto``), :mod:`~terra.batch.ray_executor` and
:mod:`~terra.batch.ray_actor` (``executor=ray``; its ``ray`` block: :mod:`terra.config.ray_settings`, its cluster:
:mod:`terra.core.ray_cluster`), :mod:`~terra.batch.run` (:func:`run_batch`).
"""

from __future__ import annotations

from terra.core.lazy import lazy_face, moved_modules

# The names load on first use, so ``terra.batch.config`` (and terra-rollout's checks) import no torch.
_HOMES = {
    "BatchConfig": "terra.batch.config",
    "BatchSpec": "terra.batch.config",
    "NAMING": "terra.batch.config",
    "batch_spec": "terra.batch.config",
    "check_config": "terra.batch.config",
    "claim_output": "terra.batch.config",
    "Manifest": "terra.config.manifest",  # every recorded run's (drives' too)
    "STATUSES": "terra.config.manifest",
    "count_statuses": "terra.config.manifest",
    "read_manifest": "terra.config.manifest",
    "BatchPlan": "terra.batch.plan",
    "Item": "terra.batch.plan",
    "made_from": "terra.batch.plan",
    "is_complete": "terra.batch.plan",
    "plan_batch": "terra.batch.plan",
    "remove_stale_temporaries": "terra.batch.plan",
    "BatchResult": "terra.batch.run",
    "run_batch": "terra.batch.run",
    "in_shard": "terra.batch.samples",
    "shard_indices": "terra.batch.samples",
    "StreamingEngine": "terra.batch.stream",
    "run_items": "terra.batch.stream",
}

__all__, __getattr__ = lazy_face(__name__, _HOMES)
# terra/batch/prepare.py until this release (one name, one file: terra/training/prepare_logs.py is terra-prepare-logs)
MOVED_MODULES = moved_modules(__name__, {"prepare": "prepared_sample"})
