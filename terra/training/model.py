"""The model a run trains: a new one of ``net.*``'s shape or a checkpoint, fully trainable or with LoRA adapters."""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from terra.contract.actions import NUM_ACTION_TOKENS
from terra.core.errors import TerraInputError
from terra.models import LlamaActionConfig, LlamaActionForCausalLM
from terra.models.checkpoint import read_world_model_config
from terra.training.data import TrainingData
from terra.training.distributed import Processes, parallelize
from terra.training.objective import WindowLoss
from terra.training.settings import LoraBlock, NetBlock, TrainSpec


LORA_EXTRA_MODULES = {"train_action_projection": "action_projection",
                      "train_position_embeddings": "pos_embedding_spatio_temporal"}


def new_config(net: NetBlock, data: TrainingData) -> LlamaActionConfig:
    """A world-model config: the shape from ``net``, the token layout from the data."""
    routes = net.num_route_tokens or 0
    span = data.patches + NUM_ACTION_TOKENS + routes
    mlp = net.action_projection_type == "mlp"
    try:
        config = LlamaActionConfig(
            **{**asdict(net), "num_route_tokens": routes}, vocab_size=data.codebook_size + 1,
            codebook_size=data.codebook_size, action_token_id=data.codebook_size, num_image_patches=data.patches,
            num_action_tokens=NUM_ACTION_TOKENS, num_spatio_embeddings=span,
            max_position_embeddings=net.num_temporal_embeddings * span, tie_word_embeddings=False,
            architectures=["LlamaActionV2ForCausalLM" if mlp else "LlamaActionForCausalLM"],
        )
        config.validate_architecture()
    except Exception as err:  # Transformers' strict dataclasses raise their own error types
        cause = err.__cause__ or err  # the strict-dataclass wrapper keeps the readable message as its cause
        raise TerraInputError(f"net: invalid world-model shape ({cause}); fix the net.* settings") from None
    return config


def build_model(spec: TrainSpec, data: TrainingData) -> LlamaActionForCausalLM:
    """The model to train, float32 on the CPU: ``init``'s (route slots grown if asked), or a new one of ``net``."""
    if spec.init is None:
        config = new_config(spec.net, data)
        return AutoModelForCausalLM.from_config(config, attn_implementation=spec.attn_implementation)
    config = read_world_model_config(spec.init)
    if config.num_image_patches != data.patches or config.codebook_size != data.codebook_size:
        raise TerraInputError(
            f"data.tokens were made by another tokenizer ({data.patches} codes per frame from a codebook of "
            f"{data.codebook_size}) than the model in {spec.init} takes ({config.num_image_patches} from "
            f"{config.codebook_size}); prepare the data with that model's tokenizer"
        )
    routes = spec.net.num_route_tokens
    if routes is not None and routes != config.num_route_tokens and config.num_route_tokens:
        raise TerraInputError(f"net.num_route_tokens={routes}, but the model in {spec.init} has "
                              f"{config.num_route_tokens} route slots, which training does not change; leave "
                              "net.num_route_tokens unset to keep them")
    model = AutoModelForCausalLM.from_pretrained(spec.init, config=config, dtype=torch.float32,
                                                 attn_implementation=spec.attn_implementation)
    if routes and not config.num_route_tokens:
        return with_route_slots(model, routes, spec.attn_implementation)
    return model


def with_route_slots(model: LlamaActionForCausalLM, num_route_tokens: int,
                     attn_implementation: str = "sdpa") -> LlamaActionForCausalLM:
    """A model without route slots grown ``num_route_tokens`` (K) of them after each frame's action slots."""
    config = copy.deepcopy(model.config)
    span = config.num_spatio_embeddings + num_route_tokens
    config.num_route_tokens, config.num_spatio_embeddings = num_route_tokens, span
    config.max_position_embeddings = max(config.max_position_embeddings, span * config.num_temporal_embeddings)
    config.validate_architecture()
    grown = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation,
                                             dtype=model.dtype)
    state = model.state_dict()
    table = "pos_embedding_spatio_temporal.spatio_embeddings.weight"
    rows = grown.state_dict()[table].clone()
    rows[:len(state[table])] = state[table]
    state[table] = rows
    missing, unexpected = grown.load_state_dict(state, strict=False)
    new = {"route_projection.weight", "route_projection.bias", "no_route_embedding"}
    if set(missing) != new or unexpected:  # a model class with weights this function does not know
        raise RuntimeError(f"growing route slots left {missing} drawn and {unexpected} unused")
    return grown


def add_lora(model: LlamaActionForCausalLM, lora: LoraBlock) -> nn.Module:
    """Wrap ``model`` in PEFT LoRA adapters (only those, and the extra modules asked for, stay trainable)."""
    from peft import LoraConfig, get_peft_model

    linear = sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                     if isinstance(module, nn.Linear) and module is not model.lm_head})  # the loss reads its weight
    unknown = [t for t in lora.target_modules if t not in linear]
    if unknown:
        raise TerraInputError(f"lora.target_modules: {', '.join(unknown)} is not a linear layer of the world model; "
                              f"choose from {', '.join(linear)}")
    extra = [module for flag, module in LORA_EXTRA_MODULES.items() if getattr(lora, flag)]
    if model.route_projection is not None:  # a route model's route slots always train: they may be newly grown
        extra.append("route_projection")
    config = LoraConfig(r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
                        target_modules=list(lora.target_modules), modules_to_save=extra or None)
    peft = get_peft_model(model, config)
    if model.no_route_embedding is not None:  # a bare parameter, which PEFT neither wraps nor saves in adapter/
        model.no_route_embedding.requires_grad_(True)
    return peft


def checkpoint_layers(model: LlamaActionForCausalLM, layers: bool | int) -> None:
    """Recompute decoder layers in the backward pass: all (True), none (False) or the first ``layers``."""
    total = len(model.model.layers)
    if layers is False:
        return
    if layers is not True and layers > total:
        raise TerraInputError(f"train.activation_checkpointing={layers} is more than the model's {total} decoder "
                              f"layers; use true (every layer) or a number up to {total}")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    for layer in model.model.layers[total if layers is True else layers:]:
        layer.gradient_checkpointing = False


@dataclass
class Trainee:
    """The loss module (maybe wrapped for several processes), the PEFT model with LoRA, window and micro-batching."""

    module: torch.nn.Module
    loss: WindowLoss
    peft: torch.nn.Module | None
    frames: int
    micro_batch: int
    accumulation: int


def build_trainee(spec: TrainSpec, data: TrainingData, processes: Processes) -> Trainee:
    per_process, rest = divmod(spec.batch_size, processes.world_size)
    micro = spec.micro_batch_size or per_process
    if rest or per_process % micro:
        raise TerraInputError(f"train.batch_size={spec.batch_size} must split evenly into {processes.world_size} "
                              f"process(es) x micro-batches of {micro}; change train.batch_size or "
                              "train.micro_batch_size")
    model = build_model(spec, data)
    config = model.config
    longest = int(data.train.lengths.max())
    frames = spec.window or min(config.num_temporal_embeddings, longest)
    if not 2 <= frames <= config.num_temporal_embeddings:
        raise TerraInputError(f"train.window {frames} must be in [2, {config.num_temporal_embeddings}] (the model's "
                              f"window) and clips have up to {longest} frames; use clips of at least 2 frames")
    bf16 = spec.precision == "bf16" or (spec.precision == "auto" and processes.device.type == "cuda")
    compute = torch.bfloat16 if bf16 else None  # the autocast dtype; None: float32
    peft = None
    if spec.lora is not None:
        peft = add_lora(model, spec.lora)
        model = peft.get_base_model()
    trained = getattr(torch, spec.weights_dtype)
    for param in model.parameters():  # frozen weights (LoRA's base) need no more precision than the compute
        param.data = param.data.to(trained if param.requires_grad else compute or trained)
    checkpoint_layers(model, spec.activation_checkpointing)
    model.config.use_cache = False
    loss = WindowLoss(model, frames, spec.loss_on_first_frame, spec.loss_chunk, compute,
                      compile_softmax=spec.compile, input_noise=spec.input_noise).to(processes.device)
    if spec.compile:
        for layer in model.model.layers:
            layer.compile()
    module = parallelize(loss, model.model.layers, processes, sharded=spec.lora is None, compute_dtype=compute)
    return Trainee(module, loss, peft, frames, micro, per_process // micro)


def trained_model(trainee: Trainee, processes: Processes, dtype: torch.dtype):
    """The trained model as a plain :class:`LlamaActionForCausalLM` in ``dtype`` on the main process, else None."""
    if processes.distributed and trainee.peft is None:  # sharded: gathered into one state on the main process
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        gathered = get_model_state_dict(trainee.module, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
        if not processes.main:
            return None
        model = AutoModelForCausalLM.from_config(trainee.loss.lm.config, dtype=dtype)
        model.load_state_dict({k.removeprefix("lm."): v for k, v in gathered.items()})
        return model
    if not processes.main:
        return None
    source = copy.deepcopy(trainee.peft if trainee.peft is not None else trainee.loss.lm).to("cpu")
    return (source.merge_and_unload() if hasattr(source, "merge_and_unload") else source).to(dtype)
