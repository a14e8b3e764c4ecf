"""Engine steps per frame of speculative Jacobi decoding on vLLM, reproduced on the CPU with the Transformers model.

vLLM's Model Runner V2 (the route of terra/vllm/jacobi_state.py) needs a GPU, so this script replays what one of
its engine steps does for one request, with the same block rule (terra/vllm/jacobi_block.py): feed
``[last token, K guesses]``, draw a token from every logits row with Gumbel noise keyed by ``(seed, position)``
(vLLM's sampler keys its noise the same way; here a ``torch.Generator`` per position), keep the guesses that equal
the draws, refill from the draws and the previous frame. ``--blocks 0`` is sequential decoding with the same
noise, so every block size must give its codes exactly (greedy and sampled); the script checks that and reports the
steps per frame. Temperature only (no top-k / top-p here).

    python scripts/measure_jacobi_blocks.py --rollouts 8 --frames 3 --blocks 4,8,16 --temperatures 0,0.9
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, DynamicCache

import terra.models  # noqa: F401  (registers llama_action with the Auto classes)
from terra.generation.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, RolloutState
from terra.vllm.jacobi_block import accepted_guesses, next_guesses, previous_frame_codes

DEMO = Path(__file__).resolve().parents[1] / "terra" / "assets" / "demo" / "world_model"


def draw(logits: torch.Tensor, positions: list[int], temperature: float, seed: int, codebook: int) -> torch.Tensor:
    """One image code per row: argmax, or Gumbel-max with noise keyed by ``(seed, position)`` of the row."""
    logits = logits[:, :codebook].float()
    if temperature == 0:
        return logits.argmax(dim=-1)
    noise = []
    for position in positions:
        generator = torch.Generator().manual_seed(seed * 1_000_003 + position)
        uniform = torch.rand(codebook, generator=generator).clamp(min=1e-20)
        noise.append(-torch.log(-torch.log1p(-uniform)))
    return (logits / temperature + torch.stack(noise)).argmax(dim=-1)


@torch.no_grad()
def decode_frame(model, state: RolloutState, block: int, temperature: float, seed: int) -> tuple[np.ndarray, int]:
    """The next frame's ``P`` codes by blocks of ``block`` guesses (0: one token a step), and the engine steps taken."""
    layout = state.layout
    ids, actions, _ = state.prompt()
    history = torch.zeros(1, layout.window_positions, dtype=torch.int64)
    history[0, : len(ids)] = torch.tensor(ids)
    cache = DynamicCache()
    out = model(input_ids=torch.tensor([ids]), actions=torch.from_numpy(actions).flatten(0, 1)[None],
                position_ids=torch.arange(len(ids))[None], past_key_values=cache, use_cache=True, logits_to_keep=1)
    first = len(ids) - 1  # position of the row that predicted the next token
    last = draw(out.logits[:, -1], [first], temperature, seed, layout.codebook_size)
    codes, steps, slot = [int(last)], 1, torch.zeros(1, dtype=torch.int64)
    position = len(ids)  # of ``last``
    history[0, position] = last
    guesses = previous_frame_codes(history, slot, position + 1 + torch.arange(block)[None], layout.frame_span,
                                   torch.tensor([position]))
    while len(codes) < layout.image_tokens:
        # Guesses past the frame's last code would only decide tokens the engine discards (max_tokens).
        width = min(block, layout.image_tokens - len(codes) - 1)
        fed = torch.cat([torch.tensor([[codes[-1]]]), guesses[:, :width]], dim=1)
        rows = list(range(position, position + width + 1))
        logits = model(input_ids=fed, position_ids=torch.tensor([rows]), past_key_values=cache, use_cache=True).logits
        samples = torch.zeros(1, block + 1, dtype=torch.int64)
        samples[0, : width + 1] = draw(logits[0], rows, temperature, seed, layout.codebook_size)
        padded = torch.zeros(1, block, dtype=torch.int64)
        padded[:, :width] = guesses[:, :width]
        accepted = accepted_guesses(samples, padded, torch.tensor([width]))
        emitted = samples[0, : int(accepted) + 1].tolist()
        history[0, position + 1 : position + 1 + len(emitted)] = torch.tensor(emitted)
        guesses = next_guesses(samples, accepted, torch.tensor([width]), torch.tensor([position]), history, slot,
                               layout.frame_span)
        if width > int(accepted):  # drop the KV of the rejected guesses
            cache.crop(int(accepted) - width)
        codes += emitted
        position += len(emitted)
        steps += 1
    return np.asarray(codes[: layout.image_tokens], dtype=np.int64), steps


def rollout(model, request: RolloutRequest, block: int, temperature: float) -> tuple[np.ndarray, list[int]]:
    """All frames of one rollout (window rollovers included) and the steps each took."""
    state = RolloutState(request, TokenLayout.from_config(model.config))
    frames, steps = [], []
    while not state.finished:
        seed = request.seed * 1000 + len(frames)
        codes, taken = decode_frame(model, state, block, temperature, seed)
        state.add_frame(codes)
        frames.append(codes)
        steps.append(taken)
    return np.stack(frames), steps


def demo_requests(layout: TokenLayout, count: int, frames: int, seed: int = 0) -> list[RolloutRequest]:
    """Rollouts of drives in the synthetic world: two context frames rendered and encoded by the demo tokenizer,
    the drives' own actions (what the demo model was trained on)."""
    from terra.sim.clips import random_clip
    from tokenizer import load_tokenizer

    tokenizer = load_tokenizer(DEMO.parent / "tokenizer")
    height, width = tokenizer.image_size
    rng = np.random.default_rng(seed)
    requests = []
    for index in range(count):
        clip = random_clip(rng, 2 + frames, height, width)
        images = torch.from_numpy(clip.frames[:2]).permute(0, 3, 1, 2).float() / 127.5 - 1.0
        context = tokenizer.encode(images).reshape(2, -1).cpu().numpy()
        requests.append(RolloutRequest(context, clip.actions[: 1 + frames], frames, seed=index))
    return requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(DEMO))
    parser.add_argument("--rollouts", type=int, default=4)
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--blocks", default="4,8,16", help="guesses per step (comma separated)")
    parser.add_argument("--temperatures", default="0,0.9")
    parser.add_argument("--out", default=None, help="JSON file for the table")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    layout = TokenLayout.from_config(model.config)
    requests = demo_requests(layout, args.rollouts, args.frames)
    rows = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        reference = [rollout(model, r, 0, temperature)[0] for r in requests]
        for block in [int(b) for b in args.blocks.split(",")]:
            start = time.perf_counter()
            results = [rollout(model, r, block, temperature) for r in requests]
            identical = all(np.array_equal(codes, ref) for (codes, _), ref in zip(results, reference))
            steps = [s for _, taken in results for s in taken]
            row = {"temperature": temperature, "block": block, "frames": len(steps), "identical_codes": identical,
                   "steps_per_frame": float(np.mean(steps)), "tokens_per_step": layout.image_tokens / np.mean(steps),
                   "first_frame_steps": float(np.mean([t[0] for _, t in results])),
                   "later_frame_steps": float(np.mean([s for _, t in results for s in t[1:]] or [np.nan])),
                   "seconds": round(time.perf_counter() - start, 1)}
            rows.append(row)
            print(json.dumps(row))
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
