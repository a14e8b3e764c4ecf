"""vLLM Model Runner V2's steps for one request, replayed on the CPU with a Transformers model: what
:class:`terra.vllm.jacobi_state.JacobiSampler` is handed and what it does (tests/generation/test_vllm_jacobi.py).

A frame is one request, as terra/generation/vllm_backend.py sends it: the window's prompt, seeded with
``request_seed``, ``max_tokens = P``. Its first step computes the prompt and draws one token from the last row;
every later step feeds ``[last token, the request's row of req_states.draft_tokens]`` (fewer guesses near the
window's end: vLLM's scheduler caps a request's slots at ``max_model_len``) and hands the rows to the sampler;
the request keeps ``num_sampled`` tokens (the KV of rejected slots dropped) until it has ``P``. vLLM's own
sampler is stood in for by terra's, keyed as vLLM keys its noise (the request's seed and the row's position), and
vLLM's Triton kernel of the counts by that kernel's definition in torch. Block 0 is sequential decoding: vLLM's
sampler alone, one token a step. With ``passes_per_step`` m > 1, a decode step runs as terra/vllm/jacobi_runner.py
runs it: m - 1 times the sampler's ``iterate_block`` on the pass's logits and the pass again over the same
positions (their KV rewritten), then the sampler on the last pass.
"""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import numpy as np
import torch
from transformers import DynamicCache

from terra.config.sampling import SamplingConfig
from terra.contract.layout import TokenLayout
from terra.generation.rollout import RolloutRequest, RolloutState
from terra.generation.sampling import gumbel_noise, sample_image_tokens
from terra.generation.vllm_backend import request_seed

SLOT, SLOTS = 2, 4  # the request's row in V2's per-request tables, and their rows


def counts(num_sampled, seq_lens, cu_num_logits, idx_mapping, prefill_len):
    """vLLM's ``get_num_sampled_and_rejected`` (a Triton kernel) in torch."""
    chunked = seq_lens < prefill_len[idx_mapping.long()]
    num_sampled = torch.where(chunked, 0, num_sampled)
    rows = (cu_num_logits[1:] - cu_num_logits[:-1]).to(num_sampled.dtype)
    return num_sampled, torch.where(chunked, 0, rows - num_sampled)


class VLLMSampler:
    """vLLM's sampler as the route sees it: a token per logits row, drawn with noise keyed by the request's seed and
    the row's position; the per-request tables of ``req_states``."""

    def __init__(self, sampling: SamplingConfig, layout: TokenLayout, draft_tokens: int) -> None:
        self.sampling, self.codebook = sampling, layout.codebook_size
        self.seed = 0
        self.req_states = SimpleNamespace(
            prefill_len=SimpleNamespace(gpu=torch.zeros(SLOTS, dtype=torch.int32)),
            all_token_ids=SimpleNamespace(gpu=torch.zeros(SLOTS, layout.window_positions, dtype=torch.int32)),
            draft_tokens=torch.zeros(SLOTS, max(draft_tokens, 1), dtype=torch.int32))

    def __call__(self, logits: torch.Tensor, input_batch):
        positions = input_batch.positions[input_batch.logits_indices].tolist()
        noise = None if self.sampling.greedy else torch.cat(
            [gumbel_noise(self.seed, 0, [p], self.codebook) for p in positions])
        tokens = sample_image_tokens(logits, self.codebook, self.sampling, noise)
        from vllm.v1.worker.gpu.sample.output import SamplerOutput

        rows = torch.ones(input_batch.num_reqs, dtype=torch.int32)
        return SamplerOutput(sampled_token_ids=tokens[:, None], logprobs_tensors=None, num_nans=None,
                             num_sampled=rows, num_rejected=rows - 1)


def batch(ids: torch.Tensor, first: int, rows: int, prompt: int) -> SimpleNamespace:
    """V2's input batch of one request in slot :data:`SLOT`: ``ids`` at positions ``first ..``, its last ``rows``
    with logits; ``prompt`` is the request's prefill length."""
    total = len(ids)
    return SimpleNamespace(
        num_reqs=1, cu_num_logits=torch.tensor([0, rows], dtype=torch.int32),
        expanded_local_pos=torch.arange(rows, dtype=torch.int32), logits_indices=torch.arange(total - rows, total),
        input_ids=ids.to(torch.int32), positions=torch.arange(first, first + total),
        seq_lens=torch.tensor([first + total], dtype=torch.int32), idx_mapping=torch.tensor([SLOT], dtype=torch.int32),
        prefill=prompt)


@torch.no_grad()
def replay_frame(model, state: RolloutState, draft_tokens: int, sampling: SamplingConfig,
                 passes_per_step: int = 1) -> tuple[np.ndarray, int]:
    """The next frame's codes as V2 with ``draft_tokens`` draft slots decodes it, and the engine steps it took."""
    from terra.vllm.jacobi_state import JacobiSampler

    layout = state.layout
    base = VLLMSampler(sampling, layout, draft_tokens)
    base.seed = request_seed(state, position_keyed=True)
    sample = JacobiSampler(base, layout, draft_tokens) if draft_tokens else None
    tables = base.req_states
    ids, actions, _ = state.prompt()
    prompt = torch.tensor(ids)
    tables.prefill_len.gpu[SLOT] = len(ids)
    tables.all_token_ids.gpu[SLOT, : len(ids)] = prompt.to(torch.int32)
    cache = DynamicCache()
    fed, first, codes, steps = prompt, 0, [], 0
    step_actions = torch.from_numpy(actions).flatten(0, 1)[None]
    while len(codes) < layout.image_tokens:
        rows = 1 if first == 0 else len(fed)
        positions = torch.arange(first, first + len(fed))[None]
        # Guesses past the frame's last code copy the previous frame's action slots (placeholder ids), which vLLM
        # embeds as plain tokens and the Transformers model refuses without their actions; their rows are
        # discarded either way (max_tokens), so any code stands in for them here.
        inputs_ids = fed if step_actions is not None else fed.masked_fill(fed >= layout.codebook_size, 0)
        logits = model(input_ids=inputs_ids[None], conditions=step_actions, position_ids=positions,
                       cache=cache, use_cache=True, logits_to_keep=rows).logits[0]
        inputs = batch(fed, first, rows, len(ids))
        for _ in range(passes_per_step - 1 if sample is not None and first else 0):  # a full-graph decode step
            sample.iterate_block(logits, inputs)
            fed = inputs.input_ids.to(torch.int64)
            cache.crop(first)  # the pass rewrites the KV of the block's positions
            logits = model(input_ids=fed.masked_fill(fed >= layout.codebook_size, 0)[None], position_ids=positions,
                           cache=cache, use_cache=True, logits_to_keep=rows).logits[0]
        if sample is None:
            emitted = base(logits, inputs).sampled_token_ids[:, 0].tolist()
        else:
            out = sample(logits, inputs)
            emitted = out.sampled_token_ids[0, : int(out.num_sampled[0])].tolist()
        start = first + len(fed) - rows + 1  # position of the first emitted token (after logits row 0's input)
        position = start + len(emitted) - 1  # of the last emitted token: the next step's first input
        cache.crop(position)  # the KV of the accepted guesses kept, of the rejected ones dropped
        emitted = emitted[: layout.image_tokens - len(codes)]  # max_tokens
        tables.all_token_ids.gpu[SLOT, start : start + len(emitted)] = torch.tensor(emitted, dtype=torch.int32)
        codes += emitted
        steps += 1
        room = min(draft_tokens, layout.window_positions - 1 - position)  # the scheduler caps slots at max_model_len
        fed = torch.cat([torch.tensor([codes[-1]]), tables.draft_tokens[SLOT, :room].to(torch.int64)])
        first, step_actions = position, None
    return np.asarray(codes, dtype=np.int64), steps


def replay_rollout(model, request: RolloutRequest, draft_tokens: int, sampling: SamplingConfig,
                   passes_per_step: int = 1) -> tuple[np.ndarray, list[int]]:
    """All generated frames of ``request`` (window rollovers included) and the engine steps of each."""
    from terra.vllm import jacobi_state

    state = RolloutState(request, TokenLayout.from_config(model.config))
    steps = []
    with mock.patch.object(jacobi_state, "get_num_sampled_and_rejected", counts):
        while not state.finished:
            codes, taken = replay_frame(model, state, draft_tokens, sampling, passes_per_step)
            state.add_frame(codes)
            steps.append(taken)
    return state.generated(), steps


def embed_decode_step(model, fed: torch.Tensor, positions: torch.Tensor, prompt_len: torch.Tensor,
                      future: torch.Tensor, known_slots: bool) -> torch.Tensor:
    """A decode step's input embeddings as V2 builds them: token rows (placeholders too), the slots a request drew
    past its prompt from its known frames (:func:`~terra.vllm.jacobi_state.embed_known_slots`; ``known_slots=False``
    leaves the placeholder rows, the wrong rule), then the position table."""
    from terra.vllm.jacobi_state import embed_known_slots

    layout = TokenLayout.from_config(model.config)
    embeds = model.model.embed_tokens(fed)
    if model.config.zero_embed_code_0:
        embeds = embeds.masked_fill((fed == 0).unsqueeze(-1), 0.0)
    if known_slots:
        embed_known_slots(embeds, positions, torch.full_like(positions, SLOT), prompt_len, future, layout)
    return (embeds + model.pos_embedding_spatio_temporal(positions[None]).to(embeds.dtype)[0])[None]


@torch.no_grad()
def replay_request(model, state: RolloutState, frames: int, draft_tokens: int, sampling: SamplingConfig,
                   passes_per_step: int = 1, known_slots: bool = True) -> tuple[list[np.ndarray], int]:
    """The next ``frames`` frames of ``state`` (within its window) as V2 decodes them in one request: the slot values
    between them come with it (:class:`~terra.vllm.jacobi_state.JacobiModelState`), the sampler forces their
    placeholders; ``max_tokens = frames * S - slots``. Returns each frame's codes and the request's engine steps."""
    from terra.models.modeling_llama_action import embed_slots
    from terra.vllm.jacobi_state import JacobiSampler

    layout = state.layout
    base = VLLMSampler(sampling, layout, draft_tokens)
    base.seed = request_seed(state, position_keyed=True)
    sample = JacobiSampler(base, layout, draft_tokens)
    tables = base.req_states
    ids, conditions, _ = state.prompt()
    prompt = torch.tensor(ids)
    tables.prefill_len.gpu[SLOT] = len(ids)
    tables.all_token_ids.gpu[SLOT, : len(ids)] = prompt.to(torch.int32)
    future = torch.zeros(SLOTS, layout.max_frames, layout.slot_tokens, model.config.hidden_size)
    start, first_frame = state.next_frame, state.next_frame - state.window.start
    values = torch.from_numpy(state.conditions[start : start + frames - 1])
    future[SLOT, first_frame : first_frame + frames - 1] = embed_slots(model, values, torch.arange(layout.slot_tokens))
    prompt_len = torch.full((SLOTS,), 1 << 40)
    prompt_len[SLOT] = len(ids)
    wanted = frames * layout.frame_span - layout.slot_tokens
    cache = DynamicCache()
    fed, first, tokens, steps = prompt, 0, [], 0
    while len(tokens) < wanted:
        rows = 1 if first == 0 else len(fed)
        positions = torch.arange(first, first + len(fed))

        def forward(fed, first=first, positions=positions, rows=rows):
            if first == 0:
                return model(input_ids=fed[None], conditions=torch.from_numpy(conditions).flatten(0, 1)[None],
                             position_ids=positions[None], cache=cache, use_cache=True, logits_to_keep=rows).logits[0]
            embeds = embed_decode_step(model, fed, positions, prompt_len, future, known_slots)
            return model(inputs_embeds=embeds, position_ids=positions[None], cache=cache, use_cache=True,
                         logits_to_keep=rows).logits[0]

        logits = forward(fed)
        inputs = batch(fed, first, rows, len(ids))
        for _ in range(passes_per_step - 1 if draft_tokens and first else 0):  # a full-graph decode step
            sample.iterate_block(logits, inputs)
            fed = inputs.input_ids.to(torch.int64)
            cache.crop(first)
            logits = forward(fed)
        out = sample(logits, inputs)
        emitted = out.sampled_token_ids[0, : int(out.num_sampled[0])].tolist()
        begin = first + len(fed) - rows + 1
        position = begin + len(emitted) - 1
        cache.crop(position)
        emitted = emitted[: wanted - len(tokens)]
        tables.all_token_ids.gpu[SLOT, begin : begin + len(emitted)] = torch.tensor(emitted, dtype=torch.int32)
        tokens += emitted
        steps += 1
        room = min(draft_tokens, layout.window_positions - 1 - position)
        fed = torch.cat([torch.tensor([tokens[-1]]), tables.draft_tokens[SLOT, :room].to(torch.int64)])
        first = position
    span = layout.frame_span
    return [np.asarray(tokens[f * span : f * span + layout.image_tokens], dtype=np.int64) for f in range(frames)], steps


def replay_rollout_by_window(model, request: RolloutRequest, draft_tokens: int, sampling: SamplingConfig,
                             passes_per_step: int = 1, known_slots: bool = True) -> tuple[np.ndarray, list[int]]:
    """All generated frames of ``request``, one request a window (every frame of it after the context), and the
    engine steps of each request."""
    from terra.vllm import jacobi_state

    state = RolloutState(request, TokenLayout.from_config(model.config))
    steps = []
    with mock.patch.object(jacobi_state, "get_num_sampled_and_rejected", counts):
        while not state.finished:
            frames = min(state.window.end, state.num_context + request.num_frames) - state.next_frame
            codes, taken = replay_request(model, state, frames, draft_tokens, sampling, passes_per_step, known_slots)
            for frame in codes:
                state.add_frame(frame)
            steps.append(taken)
    return state.generated(), steps
