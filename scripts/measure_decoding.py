"""Forward passes per generated frame, sequential against speculative decoding, of a trained world model on held-out
clips of the synthetic world: the measure stage of scripts/train_terra_layout.sh, usable on any model + tokenizer.

    python scripts/measure_decoding.py --world-model RUN/world_model/model --tokenizer RUN/tokenizer/final \
        --out RUN/results/decoding.json [--rollouts 32 --context 3 --frames 10 --device cuda --dtype float32]

Every mode runs the same ``--rollouts`` rollouts on the Transformers backend, all submitted at once: ``--context``
ground-truth frames encoded, ``--frames`` frames generated under the clip's own actions. The modes: at every
temperature of ``--temperatures``, sequential decoding and each settings set of ``--speculative`` (``;``-separated
sets of comma-separated ``key=value``, added to ``sampling``). Clip ``i`` is
``terra.sim.random_drive(numpy.random.default_rng([clip_seed, i]))``, the training distribution; clips whose scene
is one of the training clips' (``--exclude-seed``, ``--exclude-clips``: the ``terra-make-dataset`` seed and
clip count of the training data) are skipped.

Passes are counted where every forward pass goes through: a pre-hook on the first decoder layer adds the rows of
each call, one row being one rollout's pass. Passes per frame = rows / frames generated; sequential decoding takes
exactly one per image token (576 at Terra's layout: a frame's first pass also carries the previous frame's action
slots). Where the pipeline's results carry the backend's own count (``decode_stats``), it is recorded beside.
Each mode also reports seconds per frame (the whole batch's wall time / frames) and the PSNR of its decoded frames
against the exact renders, as terra-evaluate computes it; the speculative codes are compared token by token
with the sequential ones at the same temperature (for the same seeds they must be equal, greedy or sampled).

Sequential modes set ``sampling.decoding=sequential`` where the sampling settings have ``decoding``. A settings
set that this checkout's sampling settings do not take is recorded as unavailable, with the reason, and the
measurement goes on.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from terra.config.sampling import SamplingConfig
from terra.core.atomic import write_text
from terra.core.errors import TerraInputError
from terra.generation.rollout import RolloutRequest
from terra.metrics import PSNR_CAP_DB, psnr
from terra.sim.clips import Clip, random_drive

SPECULATIVE_SETTINGS = "decoding=speculative"  # the speculative modes' sampling settings (``--speculative``)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world-model", required=True, help="world-model folder (config.json + safetensors)")
    parser.add_argument("--tokenizer", required=True, help="tokenizer folder the world model's data was encoded with")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--temperatures", default="0,0.9", help="comma-separated; 0 is greedy")
    parser.add_argument("--speculative", default=SPECULATIVE_SETTINGS,
                        help="sampling settings of the speculative modes: key=value,... sets separated by ';'")
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--context", type=int, default=3, help="ground-truth context frames per rollout")
    parser.add_argument("--frames", type=int, default=10, help="frames generated per rollout")
    parser.add_argument("--clip-seed", type=int, default=1, help="clip i: random_drive(default_rng([seed, i]))")
    parser.add_argument("--exclude-seed", type=int, default=0, help="terra-make-dataset seed of the training clips")
    parser.add_argument("--exclude-clips", type=int, default=0, help="number of training clips whose scenes to skip")
    parser.add_argument("--seed", type=int, default=0, help="rollout k samples with seed + k")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32", choices=("auto", "float32", "bfloat16"))
    args = parser.parse_args(argv)
    for name in ("rollouts", "context", "frames"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    return args


def parse_temperatures(text: str) -> list[float]:
    """``"0,0.9"`` → ``[0.0, 0.9]``."""
    try:
        return [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise TerraInputError(f"--temperatures must be comma-separated numbers (got {text!r}); e.g. 0,0.9") from None


def parse_settings(text: str) -> dict[str, Any]:
    """``"decoding=speculative,draft_tokens=16"`` → ``{"decoding": "speculative", "draft_tokens": 16}`` (YAML
    values)."""
    import yaml

    settings = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise TerraInputError(f"--speculative: {item!r} is not key=value; e.g. --speculative decoding=speculative")
        settings[key.strip()] = yaml.safe_load(value)
    return settings


def held_out_clips(count: int, frames: int, image_size: tuple[int, int], clip_seed: int, exclude_seed: int,
                   exclude_clips: int) -> list[Clip]:
    """``count`` clips of the training distribution whose scenes no training clip of ``terra-make-dataset`` used."""
    training = {int(np.random.default_rng([exclude_seed, i]).integers(2**31)) for i in range(exclude_clips)}
    clips, i = [], 0
    while len(clips) < count:
        scene = int(np.random.default_rng([clip_seed, i]).integers(2**31))  # random_drive's first draw
        if scene not in training:
            clips.append(random_drive(np.random.default_rng([clip_seed, i]), frames).render(frames, *image_size))
        i += 1
    return clips


class PassCounter:
    """Rows of every forward pass through ``layer`` (a decoder layer: every pass of the model goes through it)."""

    def __init__(self, layer: torch.nn.Module) -> None:
        self.rows = self.calls = 0
        self._handle = layer.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, _module, args, kwargs) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        self.rows += int(hidden.shape[0])
        self.calls += 1

    def reset(self) -> None:
        self.rows = self.calls = 0

    def close(self) -> None:
        self._handle.remove()


def run_mode(pipeline, clips: list[Clip], codes: np.ndarray, sampling: SamplingConfig, args: argparse.Namespace,
             counter: PassCounter) -> tuple[dict[str, Any], np.ndarray]:
    """One mode's rollouts: its record and the generated codes ``[rollouts, frames, h, w]``."""
    n_ctx = args.context
    requests = [RolloutRequest(codes[i, :n_ctx], clip.actions, args.frames, seed=args.seed + i)
                for i, clip in enumerate(clips)]
    counter.reset()
    start = time.perf_counter()
    results = pipeline.generate(requests, sampling, progress=False, decode=False)
    generate_s = time.perf_counter() - start
    frames = len(clips) * args.frames
    scores = np.array([[min(v, PSNR_CAP_DB) for v in psnr(pipeline.decode(r.codes[n_ctx:]), clip.frames[n_ctx:])]
                       for r, clip in zip(results, clips)])
    passes = counter.rows / frames
    record = {"rollouts": len(clips), "frames": frames, "forward_passes": counter.rows, "batched_calls": counter.calls,
              **backend_reported(results),
              "passes_per_frame": round(passes, 3),
              "image_tokens_per_pass": round(pipeline.backend.layout.image_tokens / passes, 3),
              "generate_s": round(generate_s, 3), "s_per_frame": round(generate_s / frames, 4),
              "psnr": {"mean": round(float(scores.mean()), 3), "per_step": scores.mean(axis=0).round(3).tolist()}}
    return record, np.stack([r.codes[n_ctx:] for r in results])


def modes(args: argparse.Namespace) -> list[tuple[str, float, dict[str, Any]]]:
    """``(name, temperature, sampling settings)`` of every mode: per temperature, sequential and each speculative
    set (named by its settings)."""
    sets = [text.strip() for text in args.speculative.split(";") if text.strip()]
    sequential = {"decoding": "sequential"} if "decoding" in {f.name for f in fields(SamplingConfig)} else {}
    return [(name, temperature, {"temperature": temperature, **settings})
            for temperature in parse_temperatures(args.temperatures)
            for name, settings in [("sequential", sequential), *((text, parse_settings(text)) for text in sets)]]


def backend_reported(results: list) -> dict[str, Any]:
    """The backend's own count of the passes, where the pipeline's results carry one (``decode_stats``)."""
    stats = [r.decode_stats for r in results if getattr(r, "decode_stats", None) is not None]
    if not stats:
        return {}
    return {"backend_reported": sum(stats[1:], stats[0]).as_dict(results[0].sampling)}


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Load the pair once, run every mode on the same rollouts, return the report (also written to ``--out``)."""
    from terra.pipeline import WorldModelPipeline

    todo = modes(args)
    pipeline = WorldModelPipeline.from_pretrained(args.world_model, args.tokenizer, backend="hf", device=args.device,
                                                  dtype=args.dtype, max_batch_size=args.rollouts)
    counter = PassCounter(pipeline.backend.model.model.layers[0])
    clips = held_out_clips(args.rollouts, args.context + args.frames, tuple(pipeline.image_size), args.clip_seed,
                           args.exclude_seed, args.exclude_clips)
    images = torch.from_numpy(np.concatenate([c.frames for c in clips])).permute(0, 3, 1, 2).float() / 127.5 - 1.0
    codes = pipeline.encode(images).reshape(len(clips), args.context + args.frames, *pipeline.tokenizer.grid_shape)
    config = pipeline.backend.model.config
    report: dict[str, Any] = {
        "world_model": str(args.world_model), "tokenizer": str(args.tokenizer), "backend": "transformers",
        "device": str(pipeline.device), "dtype": args.dtype,
        "parameters": sum(p.numel() for p in pipeline.backend.model.parameters()),
        "layout": {"image_tokens": config.num_image_patches, "codebook_size": config.codebook_size,
                   "frames_per_window": config.num_temporal_embeddings},
        "clips": {"count": len(clips), "context": args.context, "generated": args.frames, "clip_seed": args.clip_seed,
                  "excluded_training_clips": args.exclude_clips, "manoeuvres": sorted({c.manoeuvre for c in clips})},
        "modes": [],
    }
    generated: dict[tuple[str, float], np.ndarray] = {}
    try:
        for name, temperature, settings in todo:
            entry: dict[str, Any] = {"mode": name, "temperature": temperature, "sampling": settings}
            report["modes"].append(entry)
            try:
                sampling = SamplingConfig.from_mapping(settings)
            except TerraInputError as err:  # this checkout's sampling settings lack the decoder's
                entry.update(available=False, reason=str(err))
                print(f"{name} at temperature {temperature:g}: unavailable ({err})", flush=True)
                continue
            record, generated[(name, temperature)] = run_mode(pipeline, clips, codes, sampling, args, counter)
            entry.update(available=True, sampling=asdict(sampling), **record)
            print(f"{name} at temperature {temperature:g}: {record['passes_per_frame']} passes per frame, "
                  f"{record['s_per_frame']} s per frame, PSNR {record['psnr']['mean']} dB", flush=True)
    finally:
        counter.close()
        pipeline.close()
    report["comparison"] = compare(report["modes"], generated)
    write_text(args.out, json.dumps(report, indent=1) + "\n")
    return report


def compare(modes: list[dict[str, Any]], generated: dict[tuple[str, float], np.ndarray]) -> list[dict[str, Any]]:
    """Each speculative mode against sequential decoding at its temperature: how many times fewer passes, and whether
    its codes equal the sequential ones (they must, greedy or sampled, up to floating-point near-ties)."""
    passes = {(m["mode"], m["temperature"]): m["passes_per_frame"] for m in modes if m.get("available")}
    rows = []
    for (name, temperature), spec_passes in passes.items():
        if name == "sequential" or ("sequential", temperature) not in passes:
            continue
        row: dict[str, Any] = {"mode": name, "temperature": temperature,
                               "fewer_passes": round(passes[("sequential", temperature)] / spec_passes, 3)}
        same = generated[(name, temperature)] == generated[("sequential", temperature)]
        row.update(codes_equal=bool(same.all()), tokens_equal_fraction=round(float(same.mean()), 6))
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        measure(args)
    except TerraInputError as err:
        raise SystemExit(f"measure_decoding: error: {err}") from None
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
