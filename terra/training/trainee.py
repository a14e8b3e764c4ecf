"""What a training run trains (:class:`Trainee`) and the trained weights read back as a plain model."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from terra.core.errors import TerraInputError
from terra.training.data import TrainingData
from terra.training.distributed import Processes, parallelize
from terra.training.model import add_lora, build_model, checkpoint_layers, standalone_model, store_weights
from terra.training.objective import WindowLoss
from terra.training.settings import TrainSpec


@dataclass
class Trainee:
    """The loss module (maybe wrapped for several processes), the PEFT model with ``finetune=lora``, window and micro-
    batching."""

    module: torch.nn.Module
    loss: WindowLoss
    peft: torch.nn.Module | None
    frames: int
    micro_batch: int
    accumulation: int


def autocast_dtype(spec: TrainSpec, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA with ``precision=auto``, or when asked; float32 otherwise."""
    return torch.bfloat16 if spec.precision == "bf16" or (spec.precision == "auto" and device.type == "cuda") else None


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
    compute = autocast_dtype(spec, processes.device)
    peft = None
    if spec.lora is not None:
        peft = add_lora(model, spec.lora)
        model = peft.get_base_model()
    trained = getattr(torch, spec.weights_dtype)
    store_weights(model, trained, compute or trained)  # frozen weights need no more precision than the compute
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
    """The trained model as a plain :class:`LlamaActionForCausalLM` in ``dtype`` on the main process (None on the
    others)."""
    sharded = processes.distributed and trainee.peft is None
    full_state = None
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        gathered = get_model_state_dict(trainee.module, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
        full_state = {k.removeprefix("lm."): v for k, v in gathered.items()}
    if not processes.main:
        return None
    source = trainee.peft if trainee.peft is not None else trainee.loss.lm
    return standalone_model(source, full_state, trainee.loss.lm.config, dtype)
