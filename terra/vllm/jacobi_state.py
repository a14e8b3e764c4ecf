"""Speculative Jacobi decoding inside vLLM's Model Runner V2, through hooks the model owns (no fork of vLLM).

docs/decoding.md ("On vLLM") says why this route and what each vLLM release does with it.
In short, Model Runner V2 (``vllm/v1/worker/gpu/``, the default on a GPU for this model) asks the model for its
per-request state class (``get_model_state_cls()``) and that state for a sampler (``custom_sampler``), and
``draft_tokens`` given to the engine (terra/vllm/compat.py, ``jacobi_engine_kwargs``, puts them in vLLM's words)
make every decode step carry that many draft slots per request with no speculator: the runner feeds each request
``[last sampled token, guesses...]`` from its own GPU table ``req_states.draft_tokens`` and leaves filling that
table to the sampler. :class:`JacobiSampler` is that sampler, and runs the rule of terra/generation/speculative.py
(the one the Transformers backend runs too):

* vLLM's own sampler draws one token from every logits row (temperature, top-k, top-p and Gumbel noise keyed by
  the request's seed and the row's position: exactly the token sequential decoding draws at that position once
  its prefix is the row's);
* :func:`~terra.generation.speculative.accepted_guesses` keeps the leading guesses that equal those draws, so a
  request emits 1 .. K+1 tokens a step, each the token sequential decoding draws there: the same codes;
* :func:`~terra.generation.speculative.next_guesses` refills the table for the next step from the same draws
  and, past the pass, from the previous frame's codes (:func:`previous_frame_codes`).

Everything stays on the device and no host sync is added, so asynchronous scheduling and CUDA graphs (uniform
decode batches of ``K + 1`` tokens a request) keep working. The model's config must not carry vLLM's draft slots
(terra/vllm/compat.py): that would mark it a diffusion model, whose steps emit no bonus token.

Imported only by :meth:`terra.vllm.llama_action.TerraForCausalLM.get_model_state_cls`, i.e. by Model Runner V2.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
from vllm.v1.worker.gpu.model_states.default import DefaultModelState
from vllm.v1.worker.gpu.sample.output import SamplerOutput

from terra.generation.speculative import accepted_guesses, next_guesses
from terra.vllm.compat import engine_draft_tokens


def previous_frame_codes(
    history: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, frame_span: int, known: torch.Tensor
) -> torch.Tensor:
    """The token one frame earlier than each of ``positions [R, K]`` (``history [slots, L]`` holds each request's
    tokens from position 0: vLLM's ``all_token_ids``), or the request's last known token where that one is not
    known yet or lies before 0. ``known [R]`` is how many tokens of each request ``history`` holds."""
    earlier = positions - frame_span
    usable = (earlier >= 0) & (earlier < known[:, None])
    last = (known - 1).clamp(min=0)[:, None].expand_as(earlier)
    column = torch.where(usable, earlier, last).to(torch.int64)
    return history[slots[:, None].to(torch.int64), column].to(torch.int64)


class JacobiSampler:
    """vLLM's sampler over every row of a block, plus acceptance and the next block's drafts.

    Everything but :meth:`__call__` (``add_request``, ``apply_staged_writes``, ``sampling_states``,
    ``penalties_state``, ``req_states``, ...) is the wrapped sampler's, so the runner drives it as its own.
    Logprobs are not returned for speculative steps.
    """

    def __init__(self, sampler: Any, frame_span: int, draft_tokens: int) -> None:
        self.base = sampler
        self.frame_span = frame_span
        self.draft_tokens = draft_tokens

    def __getattr__(self, name: str) -> Any:
        return getattr(self.base, name)

    def iterate_block(self, logits: torch.Tensor, input_batch: Any) -> None:
        """Rewrite the step's fed guesses in place (``input_batch.input_ids``) as the block's next Jacobi iterate:
        each guess becomes the token drawn from the row before it, at the same positions (row 0's input, the last
        committed token, stays). The pass that follows over the same positions then holds at least one more of
        sequential decoding's tokens in each request's block; :meth:`__call__` on the step's last pass accepts and
        emits them (terra/vllm/jacobi_runner.py runs the passes). No host sync."""
        drawn = self.base(logits, input_batch).sampled_token_ids.reshape(-1)
        rows = input_batch.logits_indices
        ids = input_batch.input_ids
        first = input_batch.expanded_local_pos == 0  # row 0 of its request: fed the last committed token
        ids[rows] = torch.where(first, ids[rows], drawn.roll(1).to(ids.dtype))

    def __call__(self, logits: torch.Tensor, input_batch: Any) -> SamplerOutput:
        drawn = self.base(logits, input_batch)  # one token per logits row, as sequential decoding draws it
        flat = drawn.sampled_token_ids.reshape(-1)
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
        later = previous_frame_codes(req_states.all_token_ids.gpu, slots, positions, self.frame_span,
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


class JacobiModelState(DefaultModelState):
    """vLLM's default model state, with :class:`JacobiSampler` when the engine schedules draft slots."""

    def custom_sampler(self, sampler: Any) -> tuple[Any, Any] | None:
        draft_tokens = engine_draft_tokens(self.vllm_config)
        if not draft_tokens:
            return None  # sequential decoding, or vLLM's own speculators and rejection sampler
        frame_span = self.model_config.hf_config.num_spatio_embeddings
        return JacobiSampler(sampler, frame_span, draft_tokens), None


__all__ = ["JacobiModelState", "JacobiSampler", "previous_frame_codes"]
