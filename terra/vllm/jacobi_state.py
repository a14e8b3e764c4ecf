"""Terra's model state and sampler in vLLM's Model Runner V2, through hooks the model owns (no fork of vLLM)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
from vllm.v1.worker.gpu.model_states.default import DefaultModelState
from vllm.v1.worker.gpu.sample.output import SamplerOutput

from terra.contract.layout import TokenLayout
from terra.generation.speculative import accepted_guesses, next_guesses
from terra.models.modeling_llama_action import embed_slots
from terra.vllm import FUTURE_SLOTS
from terra.vllm.compat import engine_draft_tokens


def previous_frame_codes(
    history: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, frame_span: int, known: torch.Tensor
) -> torch.Tensor:
    """The token one frame before each of ``positions [R, K]`` in ``history [slots, L]``, or the last known one."""
    earlier = positions - frame_span
    usable = (earlier >= 0) & (earlier < known[:, None])
    last = (known - 1).clamp(min=0)[:, None].expand_as(earlier)
    column = torch.where(usable, earlier, last).to(torch.int64)
    return history[slots[:, None].to(torch.int64), column].to(torch.int64)


class JacobiSampler:
    """vLLM's sampler over every row of a block, plus acceptance and the next block's drafts."""

    def __init__(self, sampler: Any, layout: TokenLayout, draft_tokens: int) -> None:
        self.base = sampler
        self.layout = layout
        self.draft_tokens = draft_tokens

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def draw(self, logits: torch.Tensor, input_batch: Any) -> tuple[Any, torch.Tensor]:
        """vLLM's draws, one a logits row, with the placeholder at every row that draws a slot position."""
        drawn = self.base(logits, input_batch)
        at = input_batch.positions[input_batch.logits_indices].to(torch.int64) + 1
        flat = drawn.sampled_token_ids.reshape(-1)
        slot = at % self.layout.frame_span >= self.layout.image_tokens
        return drawn, torch.where(slot, torch.full_like(flat, self.layout.slot_token_id), flat)

    def iterate_block(self, logits: torch.Tensor, input_batch: Any) -> None:
        """Rewrite the step's fed guesses in place (``input_batch.input_ids``) as the block's next Jacobi iterate."""
        drawn = self.draw(logits, input_batch)[1]
        rows = input_batch.logits_indices
        ids = input_batch.input_ids
        first = input_batch.expanded_local_pos == 0  # row 0 of its request: fed the last committed token
        ids[rows] = torch.where(first, ids[rows], drawn.roll(1).to(ids.dtype))

    def __call__(self, logits: torch.Tensor, input_batch: Any) -> SamplerOutput:
        drawn, flat = self.draw(logits, input_batch)  # a token per logits row, as sequential decoding draws it
        if not self.draft_tokens:
            return dataclasses.replace(drawn, sampled_token_ids=flat.view(-1, 1))
        num_reqs = input_batch.num_reqs
        cu = input_batch.cu_num_logits[: num_reqs + 1].to(torch.int64)
        rows = torch.arange(flat.shape[0], device=flat.device)
        request = torch.searchsorted(cu[1:], rows, right=True)  # the batch row each logits row belongs to
        local = input_batch.expanded_local_pos.to(torch.int64)
        logit_rows = input_batch.logits_indices

        samples = flat.new_zeros(num_reqs, self.draft_tokens + 1)
        samples[request, local] = flat
        fed = flat.new_zeros(num_reqs, self.draft_tokens + 1)
        fed[request, local] = input_batch.input_ids[logit_rows].to(flat.dtype)
        num_guesses = (cu[1:] - cu[:-1] - 1).to(torch.int32)
        accepted = accepted_guesses(samples, fed[:, 1:], num_guesses)

        req_states = self.base.req_states
        num_sampled, num_rejected = get_num_sampled_and_rejected(
            (accepted + 1).to(torch.int32),
            input_batch.seq_lens,
            input_batch.cu_num_logits,
            input_batch.idx_mapping,
            req_states.prefill_len.gpu,
        )
        first_position = input_batch.positions[logit_rows][cu[:-1]].to(torch.int64)  # of row 0's input token
        slots = input_batch.idx_mapping.to(torch.int64)
        # Next step's guesses are for the positions after the last emitted token (first_position + accepted + 1).
        step = torch.arange(1, self.draft_tokens + 1, device=flat.device)[None, :]
        positions = (first_position + accepted.to(torch.int64) + 1)[:, None] + step
        later = previous_frame_codes(req_states.all_token_ids.gpu, slots, positions, self.layout.frame_span,
                                     first_position + 1)
        req_states.draft_tokens[slots] = next_guesses(samples, accepted, num_guesses, later).to(
            req_states.draft_tokens.dtype)
        return SamplerOutput(
            sampled_token_ids=samples,
            logprobs_tensors=None,
            num_nans=drawn.num_nans,
            num_sampled=num_sampled,
            num_rejected=num_rejected,
        )


def embed_known_slots(embeds: torch.Tensor, positions: torch.Tensor, requests: torch.Tensor, prompt_len: torch.Tensor,
                      future_slots: torch.Tensor, layout: TokenLayout) -> None:
    """Write into ``embeds [n, hidden]`` the known-frame slot embeddings ``future_slots`` of drawn slots."""
    requests, positions = requests.to(torch.int64), positions.to(torch.int64)
    spatial = positions % layout.frame_span
    known = (positions >= prompt_len[requests]) & (spatial >= layout.image_tokens)
    frame = (positions // layout.frame_span).clamp(max=layout.max_frames - 1)
    values = future_slots[requests, frame, (spatial - layout.image_tokens).clamp(min=0)]
    embeds[:] = torch.where(known[:, None], values.to(embeds.dtype), embeds)


NO_PROMPT = 1 << 40  # a request's prompt length that no position reaches: nothing of it is a known frame's slot


class JacobiModelState(DefaultModelState):
    """vLLM's default model state, with :class:`JacobiSampler` and a request's known frames."""

    def __init__(self, vllm_config: Any, model: Any, encoder_cache: Any, device: torch.device) -> None:
        super().__init__(vllm_config, model, encoder_cache, device)
        self.layout = TokenLayout.from_config(self.model_config.hf_config)
        layout = self.layout
        self.future_slots = torch.zeros(self.max_num_reqs, layout.max_frames, layout.slot_tokens,
                                        self.inputs_embeds_size, dtype=self.dtype, device=device)
        self.prompt_len = torch.full((self.max_num_reqs,), NO_PROMPT, dtype=torch.int64, device=device)

    def add_request(self, req_index: int, new_req_data: Any) -> None:
        super().add_request(req_index, new_req_data)
        params = new_req_data.sampling_params
        future = (params.extra_args or {}).get(FUTURE_SLOTS) if params is not None else None
        if future is None:
            self.prompt_len[req_index] = NO_PROMPT
            return
        weight = next(self.model.action_projection.parameters())
        values = torch.tensor(future["values"], dtype=weight.dtype, device=weight.device)
        slots = torch.arange(values.shape[1], device=weight.device)
        first = int(future["first"])
        self.future_slots[req_index, first : first + len(values)] = embed_slots(self.model, values, slots).to(
            self.dtype)
        self.prompt_len[req_index] = len(new_req_data.prompt_token_ids)

    def get_mm_embeddings(self, scheduled_encoder_inputs: Any, input_batch: Any, req_states: Any) -> torch.Tensor:
        """The step's input embeddings, each slot a request drew past its prompt embedded from its known frames."""
        embeds = super().get_mm_embeddings(scheduled_encoder_inputs, input_batch, req_states)
        n = input_batch.num_tokens
        starts = input_batch.query_start_loc[1 : input_batch.num_reqs + 1]
        token = torch.arange(n, device=starts.device, dtype=starts.dtype)
        requests = input_batch.idx_mapping[torch.searchsorted(starts, token, right=True)]
        embed_known_slots(embeds[:n], input_batch.positions[:n], requests, self.prompt_len, self.future_slots,
                          self.layout)
        return embeds

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any] | None:
        if self.vllm_config.speculative_config is not None:
            return None  # vLLM's own speculators and rejection sampler
        return JacobiSampler(sampler, self.layout, engine_draft_tokens(self.vllm_config)), None
