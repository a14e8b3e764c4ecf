"""Resumable checkpoints of a training run, sharded by ``torch.distributed.checkpoint`` (DCP).

``output_dir/checkpoint/`` holds the trained weights and the optimizer state as DCP writes them (one file per
process, loadable by any number of processes) and ``trainer_state.pt``: step, learning-rate schedule and the
window sampler's generator. LoRA runs save only what they train (the base weights come
from ``init`` again). Every process writes into ``.checkpoint.tmp/``, then the main process swaps it in, so a
run killed while saving keeps its previous checkpoint whole.
"""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from terra.config.checks import TerraInputError
from terra.training.distributed import Processes, barrier

STATE_FILE = "trainer_state.pt"
OPTIONS = StateDictOptions(ignore_frozen_params=True)
LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)  # the frozen weights are not in the file


def has_checkpoint(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file()


def save_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                    processes: Processes) -> None:
    """Write weights, optimizer state and ``state`` (the main process's) to ``folder``, atomically."""
    tmp = folder.with_name(f".{folder.name}.tmp")
    if processes.main:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed while saving
        tmp.mkdir(parents=True)
    barrier(processes)
    model_state, optim_state = get_state_dict(module, optimizer, options=OPTIONS)
    with _quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp), no_dist=not processes.distributed)
    if processes.main:
        torch.save(state, tmp / STATE_FILE)
        old = folder.with_name(f".{folder.name}.old")
        if folder.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(folder, old)
        os.replace(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    barrier(processes)


def load_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer,
                    processes: Processes) -> dict[str, Any]:
    """Load what :func:`save_checkpoint` wrote into ``module`` and ``optimizer``; return the trainer state."""
    model_state, optim_state = get_state_dict(module, optimizer, options=OPTIONS)
    try:
        with _quiet():
            dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder),
                     no_dist=not processes.distributed)
    except (CheckpointException, ValueError, RuntimeError) as err:  # a missing key, a size mismatch
        raise TerraInputError(
            f"the checkpoint in {folder} does not fit this run's model ({_cause(err)[:160]}): it has another "
            "network shape, init or finetune mode; pick a new output_dir or set resume=false"
        ) from None
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=LOAD_OPTIONS)
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)


def _cause(err: BaseException) -> str:
    """The first line of what went wrong, unwrapped from DCP's per-rank exception."""
    if isinstance(err, CheckpointException) and err.failures:
        err = getattr(next(iter(err.failures.values())), "exc", err)
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


@contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's warning that a run of one process saves or loads as one process (it is meant to)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield
