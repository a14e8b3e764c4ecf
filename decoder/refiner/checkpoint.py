"""Reading ``refiner_model.pt`` and checking it against the refiner's tensors, with one-line errors."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Mapping

import torch

from terra.core.errors import TerraInputError, error_reason
from terra.decoder.refiner.keys import CHECKED_PREFIXES, strip_wrapper

DOWNLOAD_HINT = ("video_refiner/refiner_model.pt of the Hugging Face repo turing-motors/Terra "
                 "(`hf download turing-motors/Terra video_refiner/refiner_model.pt --local-dir Terra`)")


def check_file(path: str | os.PathLike) -> Path:
    """``path`` when it is a non-empty whole zip archive as ``torch.save`` writes (nothing loaded); else one line."""
    file = Path(path).expanduser()
    if file.is_dir():
        candidate = file / "refiner_model.pt"
        if not candidate.is_file():
            raise TerraInputError(f"refiner folder {file} has no refiner_model.pt; pass the file, {DOWNLOAD_HINT}")
        file = candidate
    if not file.is_file():
        raise TerraInputError(f"refiner weights {file} not found; download {DOWNLOAD_HINT}, or point refiner.path "
                              "at it")
    if file.stat().st_size == 0:
        raise TerraInputError(f"refiner weights {file} are empty; download {DOWNLOAD_HINT} again")
    if not zipfile.is_zipfile(file):
        raise TerraInputError(f"refiner weights {file} are not a whole PyTorch checkpoint (no zip archive: truncated, "
                              f"or another kind of file); download {DOWNLOAD_HINT} again")
    return file


def read_state_dict(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The tensors of a published refiner file, ``_forward_module.`` stripped (mmap'd, on the CPU)."""
    file = check_file(path)
    try:
        data = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as err:  # truncated zip, foreign pickle, ... : torch raises many types
        raise TerraInputError(f"refiner weights {file} cannot be read ({error_reason(err)}); the file is truncated, "
                              f"corrupt or not a PyTorch checkpoint: download {DOWNLOAD_HINT} again") from None
    if not isinstance(data, dict) or not isinstance(data.get("module"), dict):
        keys = sorted(data)[:5] if isinstance(data, dict) else type(data).__name__
        raise TerraInputError(f"{file} is not Terra's video refiner: it holds {keys}, not a {{'module': state_dict}} "
                              f"checkpoint; download {DOWNLOAD_HINT}")
    return strip_wrapper(data["module"])


def match_tensors(state_dict: Mapping[str, torch.Tensor], table: Mapping[str, tuple[str, tuple[int, ...]]],
                  source: str) -> dict[str, torch.Tensor]:
    """``state_dict``'s tensors under module names; missing, unknown or misshapen tensors raise one line."""
    ours = {k: v for k, v in state_dict.items() if k.startswith(CHECKED_PREFIXES)}
    missing = sorted(set(table) - set(ours))
    unexpected = sorted(set(ours) - set(table))
    if len(missing) == len(table):
        raise TerraInputError(f"{source} is not Terra's video refiner: none of its {len(state_dict)} tensors is one "
                              f"of the refiner's {len(table)} (e.g. it has {sorted(state_dict)[:2]}); download "
                              f"{DOWNLOAD_HINT}")
    if missing or unexpected:
        raise TerraInputError(f"{source} does not match the refiner's architecture: {len(missing)} tensors missing "
                              f"(e.g. {missing[:2]}), {len(unexpected)} unexpected (e.g. {unexpected[:2]}); it is "
                              "another model or the refiner preset is wrong (refiner.preset=terra for Terra's file)")
    bad = [k for k, (_, shape) in table.items() if tuple(ours[k].shape) != shape]
    if bad:
        k = bad[0]
        raise TerraInputError(f"{source}: {len(bad)} tensors have other shapes than the refiner's architecture (e.g. "
                              f"{k}: {list(ours[k].shape)}, expected {list(table[k][1])}); check refiner.preset")
    return {name: ours[published] for published, (name, _) in table.items()}
