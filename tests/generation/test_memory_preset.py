"""The ``memory`` preset (terra/config/memory.py): a model's bytes from its config, the settings picked for fake
cards of 6 to 80 GiB at Terra's shape and the demo model's, one line naming the preset to use when nothing fits, and
the run's options set from the card (terra/generation/resolve.py, ``resolve_backend_run``). CPU only: the card is a
number."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig

from terra.config.backend import check_backend
from terra.config.memory import (BF16_LAYERS, CANDIDATES, ENGINE_OVERHEAD, FP8_WEIGHTS, GIB, MAIN_PROCESS, REFINER_PEAK,
                                 SHARE_STEP, ModelShape, check_memory, engine_share, fp8_weights_config, plan_memory,
                                 smallest_card, tokenizer_pixels)
from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec
from terra.core.errors import TerraInputError
from terra.generation.resolve import resolve_backend_run
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.models.presets import TERRA

DEMO = AutoConfig.from_pretrained("terra/assets/demo/world_model")
CONFIGS = {"terra": LlamaActionConfig(**TERRA), "terra_v2": LlamaActionConfig(**TERRA, action_projection_type="mlp"),
           "demo": DEMO}
CARDS_GIB = (6, 8, 12, 15.6, 16, 20, 23.6, 24, 40, 80)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_shape_counts_the_models_parameters_exactly(name):
    """Weights from the config alone equal the built model's (on the meta device: no memory), and the linear
    layers vLLM quantizes are the decoder layers' ``nn.Linear``s."""
    config = CONFIGS[name]
    with torch.device("meta"):
        model = LlamaActionForCausalLM(config)
    linear = sum(m.weight.numel() for n, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) and ".layers." in n)
    shape = ModelShape.from_config(config)
    assert shape.linear_params + shape.other_params == sum(p.numel() for p in model.parameters())
    assert shape.linear_params == linear


def test_terra_shape_bytes():
    """Terra's 2.04 B parameters: 3.81 GiB in bf16, 2.90 GiB with FP8 linear layers (embedding and head, 1.08 B,
    stay bf16), 2.99 GiB with the first 2 of 22 layers kept bf16; KV 2 x 22 layers x 4 heads x 64 = 22528 bytes per
    token in bf16, half in FP8, twice in float32 (a CPU run's: scripts/bench/lib/measure.py)."""
    shape = ModelShape.from_config(CONFIGS["terra"])
    assert shape.weight_bytes(None) / GIB == pytest.approx(3.807, abs=1e-3)
    assert shape.weight_bytes("fp8") / GIB == pytest.approx(2.905, abs=1e-3)
    assert shape.weight_bytes(FP8_WEIGHTS, 2) / GIB == pytest.approx(2.905 + 2 / 22 * (3.807 - 2.905), abs=1e-3)
    assert shape.weight_bytes(FP8_WEIGHTS, 22) == shape.weight_bytes(FP8_WEIGHTS, 30) == shape.weight_bytes(None)
    assert shape.kv_bytes_per_token("auto") == 22528 and shape.kv_bytes_per_token("fp8") == 11264
    assert shape.kv_bytes_per_token("auto", "float32") == 45056 and shape.kv_bytes_per_token("fp8", "float32") == 11264
    assert shape.window_tokens == 25 * 582 - 6


def weights(shape: ModelShape, quantization) -> int:
    """The weights' bytes under the preset's own candidates: FP8 weights keep the first BF16_LAYERS in bf16."""
    return shape.weight_bytes(quantization, BF16_LAYERS)


def engine_bytes(shape: ModelShape, plan) -> int:
    return ENGINE_OVERHEAD + weights(shape, plan.quantization) + plan.max_num_seqs * shape.stream_bytes(
        plan.kv_cache_dtype)


@pytest.mark.parametrize("name", ["terra", "demo"])
@pytest.mark.parametrize("refiner", ["off", "after", "shared"])
@pytest.mark.parametrize("streams", [1, 64])
def test_every_plan_fits_its_cap_and_is_the_least_lossy_that_does(name, refiner, streams):
    """On every fake card and preset that plans: the engine's weights, overhead and KV of its rollouts fit its share
    of the card, the share plus the app's process (and the refiner beside it) fit the cap; no less lossy candidate
    holds as many rollouts; a plan holding fewer rollouts than asked holds the most any candidate does."""
    shape = ModelShape.from_config(CONFIGS[name])
    planned = 0
    for card_gib in CARDS_GIB:
        card = int(card_gib * GIB)
        for preset in ("auto", "16GiB", "24GiB"):
            try:
                plan = plan_memory(preset, card, shape, refiner, streams)
            except TerraInputError:
                continue
            planned += 1
            share = plan.gpu_memory_utilization * card
            assert engine_bytes(shape, plan) <= share
            assert share + MAIN_PROCESS + (REFINER_PEAK if refiner == "shared" else 0) <= plan.cap_bytes <= card
            chosen = CANDIDATES.index((plan.quantization, plan.kv_cache_dtype))
            for q, kv in CANDIDATES[:chosen]:  # every less lossy setting holds fewer rollouts
                assert share - ENGINE_OVERHEAD - weights(shape, q) < plan.max_num_seqs * shape.stream_bytes(kv)
            if plan.max_num_seqs < streams:
                for q, kv in CANDIDATES:
                    held = (share - ENGINE_OVERHEAD - weights(shape, q)) // shape.stream_bytes(kv)
                    assert held <= plan.max_num_seqs
    assert planned >= 5


def test_terra_on_16_and_24_gib_cards():
    """Terra at 16 GiB (15.2 GiB as such a card reports it): bf16 for one rollout; with FP8 KV and FP8 weights 53
    rollouts at once, the most there (64 asked); the refiner beside the
    engine does not fit (the line says memory=24GiB on a 24 GiB card, that this card cannot on a 16 GiB one); after
    the engine it does. At 24 GiB: 64 rollouts on bf16 weights with FP8 KV; the refiner beside it fits on FP8."""
    shape = ModelShape.from_config(CONFIGS["terra"])
    one = plan_memory("16GiB", 16 * GIB, shape, "off", 1)
    assert (one.quantization, one.kv_cache_dtype, one.max_num_seqs) == (None, "auto", 1)
    many = plan_memory("16GiB", 16 * GIB, shape, "after", 64)
    assert (many.quantization, many.kv_cache_dtype, many.max_num_seqs) == (FP8_WEIGHTS, "fp8", 53)
    assert many.engine_options()["quantization_config"] == fp8_weights_config(22)
    assert many.gpu_memory_utilization == pytest.approx((0.95 * 16 - MAIN_PROCESS / GIB) / 16, abs=1e-3)
    with pytest.raises(TerraInputError, match=r"does not fit memory=16GiB; use memory=24GiB; or decoder=tokenizer"):
        plan_memory("16GiB", 80 * GIB, shape, "shared", 1)
    with pytest.raises(TerraInputError, match=r"this card \(16.0 GiB\) cannot run it: it needs about 18.\d GiB"):
        plan_memory("16GiB", 16 * GIB, shape, "shared", 1)
    wide = plan_memory("24GiB", 24 * GIB, shape, "off", 64)
    assert (wide.quantization, wide.kv_cache_dtype, wide.max_num_seqs) == (None, "fp8", 64)
    beside = plan_memory("24GiB", 80 * GIB, shape, "shared", 64)
    assert (beside.quantization, beside.kv_cache_dtype) == (FP8_WEIGHTS, "fp8") and 25 <= beside.max_num_seqs < 64
    assert beside.gpu_memory_utilization * 80 == pytest.approx(0.95 * 24 - MAIN_PROCESS / GIB - 11.5, abs=0.1)


def test_fp8_weights_come_before_fp8_kv():
    """The order measured on the demo model (FP8 weights 0.006 nats of next-token KL, FP8 KV 0.017): at 16 GiB, one
    rollout more than bf16 holds takes FP8 weights with bf16 KV while they hold it, FP8 KV only past that."""
    shape = ModelShape.from_config(CONFIGS["terra"])
    engine = int(plan_memory("16GiB", 16 * GIB, shape, "off", 1).gpu_memory_utilization * 16 * GIB)

    def held(quantization, kv):
        return (engine - ENGINE_OVERHEAD - weights(shape, quantization)) // shape.stream_bytes(kv)

    assert held(None, "auto") + 1 < held(FP8_WEIGHTS, "auto") < held(None, "fp8")
    for streams, chosen in ((held(None, "auto"), (None, "auto")), (held(None, "auto") + 1, (FP8_WEIGHTS, "auto")),
                            (held(FP8_WEIGHTS, "auto"), (FP8_WEIGHTS, "auto")),
                            (held(FP8_WEIGHTS, "auto") + 1, (None, "fp8"))):
        plan = plan_memory("16GiB", 16 * GIB, shape, "off", streams)
        assert (plan.quantization, plan.kv_cache_dtype, plan.max_num_seqs) == (*chosen, streams)


def test_error_lines_name_the_preset_or_say_the_card_is_too_small():
    shape = ModelShape.from_config(CONFIGS["terra"])
    with pytest.raises(TerraInputError, match=r"^memory=24GiB needs a card of 24 GiB; this one has 15.6 GiB: "
                                              r"use memory=16GiB or memory=auto$"):
        plan_memory("24GiB", int(15.6 * GIB), shape)
    with pytest.raises(TerraInputError, match=r"this card \(6.0 GiB\) cannot run it: it needs about 7.\d GiB$"):
        plan_memory("auto", 6 * GIB, shape)
    demo = plan_memory("auto", 6 * GIB, ModelShape.from_config(DEMO))  # the demo model fits any card
    assert (demo.quantization, demo.kv_cache_dtype, demo.max_num_seqs) == (None, "auto", 64)
    with pytest.raises(TerraInputError, match=r"backend.options.quantization=None does not fit memory=16GiB; "
                                              r"use memory=24GiB; or leave those options"):
        plan_memory("16GiB", 24 * GIB, shape, "shared", 1, {"quantization": None})
    with pytest.raises(TerraInputError, match=r"gpu_memory_utilization=0.9 takes 21.6 GiB, more than memory=16GiB"):
        plan_memory("16GiB", 24 * GIB, shape, "off", 1, {"gpu_memory_utilization": 0.9})
    with pytest.raises(TerraInputError, match=r"only 3.0 GiB of the card are free"):
        plan_memory("16GiB", 16 * GIB, shape, free_bytes=3 * GIB)


@pytest.mark.parametrize("refiner", ["off", "shared"])
def test_the_smallest_card_named_in_the_line_is_the_smallest_that_plans(refiner):
    """The card size the error line gives is tight: 16 MiB more plans one rollout, 64 MiB less does not."""
    shape = ModelShape.from_config(CONFIGS["terra"])
    need = smallest_card(shape, refiner, {})
    assert plan_memory("auto", need + (16 << 20), shape, refiner, 1).max_num_seqs == 1
    with pytest.raises(TerraInputError, match="cannot run it"):
        plan_memory("auto", need - (64 << 20), shape, refiner, 1)


def test_explicit_options_are_kept():
    """What backend.options set stays: an explicit bf16 KV at 16 GiB holds fewer rollouts instead of switching."""
    shape = ModelShape.from_config(CONFIGS["terra"])
    plan = plan_memory("16GiB", 16 * GIB, shape, "off", 64, {"kv_cache_dtype": "auto", "max_num_seqs": 48})
    assert plan.kv_cache_dtype == "auto" and plan.quantization == FP8_WEIGHTS and 20 <= plan.max_num_seqs < 48
    e5m2 = plan_memory("16GiB", 16 * GIB, shape, "off", 8, {"kv_cache_dtype": "fp8_e5m2"})
    assert (e5m2.quantization, e5m2.kv_cache_dtype, e5m2.max_num_seqs) == (None, "fp8_e5m2", 8)
    # a quantization the run names is kept, with every layer FP8 (no quantization_config of the plan's)
    tensor = plan_memory("16GiB", 16 * GIB, shape, "off", 64, {"quantization": "fp8"})
    assert (tensor.quantization, tensor.kv_cache_dtype, tensor.quantization_config) == ("fp8", "fp8", None)
    assert "quantization_config" not in tensor.engine_options()
    # the run's own quantization_config may keep any layers bf16: its weights are counted at bf16's size
    own = plan_memory("16GiB", 16 * GIB, shape, "off", 64,
                      {"quantization": FP8_WEIGHTS, "quantization_config": {"ignore": []}})
    assert own.quantization_config is None and own.max_num_seqs < tensor.max_num_seqs


def test_settings_are_checked_at_the_edge():
    assert check_memory("16GiB") == "16GiB"
    with pytest.raises(TerraInputError, match=r"unknown memory '32GiB'; choose one of: full, auto, 16GiB, 24GiB"):
        check_memory("32GiB")
    assert check_backend("vllm", {"quantization": "fp8"})[1] == {"quantization": "fp8"}
    assert check_backend("vllm", {"quantization": None})[1] == {"quantization": None}
    with pytest.raises(TerraInputError, match=r"backend.options.quantization 'int4'; choose one of: null, fp8, "
                                              r"fp8_per_channel$"):
        check_backend("auto", {"quantization": "int4"})
    config = {"quantization": FP8_WEIGHTS, "quantization_config": {"ignore": ["lm_head"]}}
    assert check_backend("vllm", config)[1] == config
    with pytest.raises(TerraInputError, match=r"^backend.options.quantization_config must be a mapping \(got "):
        check_backend("vllm", {"quantization": FP8_WEIGHTS, "quantization_config": "ignore"})
    with pytest.raises(TerraInputError, match=r"quantization_config applies to vLLM's online quantizations only; set "
                                              r"backend.options.quantization=fp8_per_channel with it"):
        check_backend("vllm", {"quantization": "fp8", "quantization_config": {"ignore": []}})


def test_fp8_weights_keep_the_first_layers_in_bf16_by_vllms_own_rule():
    """vLLM's matcher of ``ignore`` (the one its online quantization calls, with Llama's fused projections) keeps
    every projection of layers 0 and 1 unquantized and quantizes the rest, layers 10-19 included."""
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer

    ignore = fp8_weights_config(22)["ignore"]
    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    for layer in range(22):
        for projection in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj"):
            name = f"model.layers.{layer}.{projection}"
            assert should_ignore_layer(name, ignore, fused) == (layer < BF16_LAYERS), name


def test_a_run_reads_the_card_once_and_sets_the_engine_options(monkeypatch):
    """A vLLM run on a (fake) 16 GiB card gets the plan's options (terra/generation/resolve.py,
    ``resolve_backend_run``); memory=full, a CPU run and the Transformers backend are left alone and never read the
    card."""
    reads = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: reads.append(device) or (15 * GIB, 16 * GIB))
    monkeypatch.setattr("terra.generation.resolve.resolve_device", lambda device: device)  # as on a GPU
    monkeypatch.setattr("terra.config.backend.vllm_available", lambda: True)
    spec = RunSpec("wm", "tok", backend="vllm", device="cuda:0", memory="16GiB",
                   sampling=SamplingConfig(decoding="sequential"), backend_options={"requests": "per_frame"})

    def options(spec: RunSpec, streams: int = 64, refiner: str = "off") -> dict:
        return resolve_backend_run(spec, streams, CONFIGS["terra"], refiner).spec.backend_options

    assert options(spec, refiner="after") == {"requests": "per_frame", "quantization": FP8_WEIGHTS,
                                               "kv_cache_dtype": "fp8", "gpu_memory_utilization": 0.793,
                                               "max_num_seqs": 53, "quantization_config": fp8_weights_config(22)}
    assert len(reads) == 1
    for unchanged in (spec.replace(memory="full"), spec.replace(device="cpu"), spec.replace(backend="hf")):
        assert options(unchanged) == {"requests": "per_frame"}
    assert len(reads) == 1
    with pytest.raises(TerraInputError, match="does not fit memory=16GiB"):
        options(spec, streams=1, refiner="shared")


def test_the_engine_share_never_takes_more_than_its_room():
    """The share is rounded down to thousandths: never above the room, never a step below it. Rounding to six
    places first (the old rule) put 4 of these shares a few bytes over their room."""
    for card in (int(15.6 * GIB), 16 * GIB, int(23.6 * GIB), 80 * GIB, 141 * GIB):
        for room in range(card // 20, card, card // 997):
            share = engine_share(room, card)
            assert room - SHARE_STEP * card < share * card <= room


def test_the_tokenizer_batch_holds_one_terra_frame_of_pixels():
    """The frames a pipeline's tokenizer takes at once under a plan (what MAIN_PROCESS counts): one of Terra's
    288x512, four of the demo tokenizer's 144x256, one of anything larger; beside vLLM's own 90 % (memory=full) four
    times as many pixels; a pipeline built by itself takes memory=full's batch, one built for a run its memory's; on the
    CPU one frame a call."""
    from terra.generation.backends import model_backend
    from terra.pipeline import WorldModelPipeline
    from terra.run import resolve_run
    from terra.tokenizer import load_tokenizer

    class Frames:  # a tokenizer of frames of ``image_size``, all the pipeline asks of it here
        def __init__(self, image_size):
            self.image_size = image_size

        def to(self, device):
            return self

        def eval(self):
            return self

    def batch(size, memory):
        return WorldModelPipeline(Frames(size), None, "cuda", tokenizer_pixels=tokenizer_pixels(memory)
                                  ).tokenizer_batch_size

    sizes = ((288, 512), (144, 256), (576, 1024), (16, 16))
    assert [batch(size, "16GiB") for size in sizes] == [1, 4, 1, 576]
    assert [batch(size, "auto") for size in sizes] == [1, 4, 1, 576]
    assert [batch(size, "full") for size in sizes] == [4, 16, 1, 2304]
    tokenizer = load_tokenizer("terra/assets/demo/tokenizer")
    model = LlamaActionForCausalLM(LlamaActionConfig(**{**TERRA, "hidden_size": 64, "intermediate_size": 64,
                                                        "num_hidden_layers": 1, "num_attention_heads": 1,
                                                        "num_key_value_heads": 1}))
    pipeline = WorldModelPipeline(tokenizer, model_backend(model, "cpu"))
    assert tokenizer.image_size == (144, 256) and pipeline.tokenizer_batch_size == 1  # on the CPU a frame a call
    spec = RunSpec("terra/assets/demo/world_model", "terra/assets/demo/tokenizer", backend="hf", device="cpu",
                   memory="16GiB")
    built = WorldModelPipeline.from_run(resolve_run(spec), tokenizer)
    assert built.tokenizer_batch_size == 1


@pytest.mark.parametrize("card", [0, -1, 0.5, float("nan"), True, "80GiB", 10**40])
def test_an_impossible_card_is_one_line_not_a_division_by_zero(card):
    from terra.config.memory import preset_cap

    shape = ModelShape.from_config(CONFIGS["terra"])
    for call in (lambda: plan_memory("auto", card, shape), lambda: plan_memory("16GiB", card, shape),
                 lambda: preset_cap("auto", card)):
        with pytest.raises(TerraInputError, match="card_bytes \\(the card's memory in bytes\\) must be a whole number"):
            call()
    assert plan_memory("auto", 80 * GIB, shape).card_bytes == 80 * GIB  # control: a real card plans
    with pytest.raises(TerraInputError, match="this card \\(0.0 GiB\\) cannot run it"):
        plan_memory("auto", 1, shape)  # the smallest card there is: too small, said so
