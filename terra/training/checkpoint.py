"""Resumable checkpoints of a training run, sharded by ``torch.distributed.checkpoint`` (DCP)."""

from __future__ import annotations

import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from terra.core.atomic import atomic_path, mark
from terra.core.errors import TerraInputError, error_reason
from terra.training.distributed import Processes, barrier

STATE_FILE = "trainer_state.pt"  # written last, atomically: a folder holding it is a complete checkpoint
OPTIONS = StateDictOptions(ignore_frozen_params=True)
LOAD_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)  # the frozen weights are not in the file


def _aside(folder: Path) -> tuple[Path, Path]:
    """The folders a save writes first (``.checkpoint.tmp``) and parks the previous one in (``.checkpoint.old``)."""
    return folder.with_name(f".{folder.name}.tmp"), folder.with_name(f".{folder.name}.old")


def discard(folder: Path, state_file: str = STATE_FILE) -> None:
    """Delete a checkpoint folder, its state file first, so that a kill half-way leaves no complete-looking one."""
    (folder / state_file).unlink(missing_ok=True)
    shutil.rmtree(folder, ignore_errors=True)


def swap_in(tmp: Path, folder: Path, old: Path, state: dict[str, Any], state_file: str = STATE_FILE) -> None:
    """Make ``tmp`` the checkpoint in ``folder`` so a complete one always exists: ``state`` last, then two renames."""
    mark(tmp, [entry.name for entry in os.scandir(tmp)] + [state_file])
    with atomic_path(tmp / state_file) as part:
        torch.save(state, part)
    if folder.exists():
        discard(old, state_file)
        os.replace(folder, old)
    os.replace(tmp, folder)
    discard(old, state_file)


def checkpoint_step(folder: Path, state_file: str = STATE_FILE,
                    fix: str = "restore it, or set resume=false to start afresh") -> int | None:
    """The step of a complete checkpoint folder; None when it has no state file (never written whole)."""
    if not (folder / state_file).is_file():
        return None
    try:
        return int(torch.load(folder / state_file, map_location="cpu", weights_only=True)["step"])
    except Exception as err:  # noqa: BLE001  (a damaged file: each reader raises its own types)
        raise TerraInputError(f"the checkpoint in {folder} is damaged ({state_file}: {error_reason(err)}); "
                              f"{fix}") from None


def newest_checkpoint(folders: Iterable[Path], state_file: str = STATE_FILE,
                      fix: str = "restore it, or set resume=false to start afresh") -> Path | None:
    """The complete checkpoint of ``folders`` at the latest step (on a tie, the first listed); None: none."""
    found = [(step, path) for path in folders if (step := checkpoint_step(path, state_file, fix)) is not None]
    return max(found, key=lambda pair: pair[0])[1] if found else None


def find_checkpoint(folder: Path, processes: Processes) -> bool:
    """Whether ``folder`` holds a checkpoint to resume from (the main process made it the newest complete one)."""
    if processes.main:
        newest = newest_checkpoint((folder, *_aside(folder)))
        if newest not in (None, folder):
            discard(folder)
            os.replace(newest, folder)
        for path in _aside(folder):
            discard(path)
    barrier(processes)
    return (folder / STATE_FILE).is_file()


def save_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                    processes: Processes) -> None:
    """Write weights, optimizer state and ``state`` to ``folder`` so that a complete checkpoint always exists."""
    tmp, old = _aside(folder)
    if processes.main:
        discard(tmp)  # left by a run killed while saving
        tmp.mkdir(parents=True)
    barrier(processes)
    model_state, optim_state = get_state_dict(module, optimizer, options=OPTIONS)
    with _quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp),
                 no_dist=not processes.distributed)
    if processes.main:
        swap_in(tmp, folder, old, state)
    barrier(processes)


def load_checkpoint(folder: Path, module: nn.Module, optimizer: torch.optim.Optimizer, processes: Processes,
                    settings: dict[str, str]) -> dict[str, Any]:
    """Load what :func:`save_checkpoint` wrote into ``module`` and ``optimizer``; return the trainer state."""
    state = torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)
    for name, value in settings.items():
        was = state.get("settings", {}).get(name, value)
        if was != value:
            raise TerraInputError(f"the checkpoint in {folder} was written with {name}={was} and this run has "
                                  f"{name}={value}; set {name}={was} to resume it, or pick a new output_dir")
    model_state, optim_state = get_state_dict(module, optimizer, options=OPTIONS)
    try:
        with _quiet():
            dcp.load({"model": model_state, "optim": optim_state}, checkpoint_id=str(folder),
                     no_dist=not processes.distributed)
    except (CheckpointException, ValueError, RuntimeError) as err:
        cause = _cause(err)
        if isinstance(cause, ValueError) or "key" in str(cause).lower():  # a size mismatch, a missing key
            raise TerraInputError(
                f"the checkpoint in {folder} does not fit this run's model ({error_reason(cause)}): it has another "
                "network shape, init or finetune mode; pick a new output_dir or set resume=false") from None
        raise TerraInputError(f"the checkpoint in {folder} cannot be read ({error_reason(cause)}); the file is "
                              "damaged: restore it, or set resume=false to start afresh") from None
    set_state_dict(module, optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=LOAD_OPTIONS)
    return state


def _cause(err: BaseException) -> BaseException:
    """The exception itself, or the first rank's, unwrapped from DCP's per-rank exception."""
    if isinstance(err, CheckpointException) and err.failures:
        failure = next(iter(err.failures.values()))
        return failure[0] if isinstance(failure, tuple) else getattr(failure, "exc", failure)
    return err


@contextmanager
def _quiet() -> Iterator[None]:
    """Without DCP's warning that a run of one process saves or loads as one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield
