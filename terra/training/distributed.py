"""One process or many: the same training command under ``torchrun --nproc_per_node=N``."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from terra.core.device import resolve_device
from terra.core.errors import TerraInputError


@dataclass(frozen=True)
class Processes:
    rank: int
    world_size: int
    device: torch.device

    @property
    def main(self) -> bool:
        """Whether this process writes the run's files (logs, checkpoint state, export)."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def start_processes(device: str) -> Processes:
    """Join the process group torchrun set up (``WORLD_SIZE`` > 1), or run alone on ``device``."""
    resolved = torch.device(resolve_device(device))
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return Processes(0, 1, resolved)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if resolved.type == "cuda":
        if local >= torch.cuda.device_count():
            raise TerraInputError(f"torchrun started more processes on this node than it has GPUs "
                                  f"({torch.cuda.device_count()}); lower --nproc_per_node")
        resolved = torch.device("cuda", local)
        torch.cuda.set_device(resolved)
    dist.init_process_group("nccl" if resolved.type == "cuda" else "gloo")
    return Processes(dist.get_rank(), dist.get_world_size(), resolved)


def stop_processes(processes: Processes) -> None:
    if processes.distributed and dist.is_initialized():
        dist.destroy_process_group()


def parallelize(module: nn.Module, layers: nn.ModuleList, processes: Processes, sharded: bool,
                compute_dtype: torch.dtype | None) -> nn.Module:
    """``module`` ready for data-parallel training: FSDP2 when ``sharded`` (``layers`` their own units), else DDP."""
    if not processes.distributed:
        return module
    if not sharded:
        ids = [processes.device.index] if processes.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=ids)
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(module, mp_policy=policy)
    return module


def gradient_sync(module: nn.Module, enabled: bool) -> AbstractContextManager:
    """A context in which backward passes accumulate without averaging across processes unless ``enabled``."""
    if isinstance(module, nn.parallel.DistributedDataParallel):
        return nullcontext() if enabled else module.no_sync()
    if hasattr(module, "set_requires_gradient_sync"):  # FSDP2
        module.set_requires_gradient_sync(enabled)
    return nullcontext()


def all_sum(values: torch.Tensor, processes: Processes) -> torch.Tensor:
    if processes.distributed:
        values = values.clone()
        dist.all_reduce(values)
    return values


def barrier(processes: Processes) -> None:
    if processes.distributed:
        dist.barrier()
