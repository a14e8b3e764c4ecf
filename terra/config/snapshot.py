"""A downloaded Terra snapshot (the Hugging Face repo ``turing-motors/Terra``) and its checked checkpoint folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from terra.core.errors import TerraInputError

DOWNLOAD_HINT = ("a download of huggingface.co/turing-motors/Terra, e.g. "
                 "`hf download turing-motors/Terra --local-dir Terra`")


def snapshot_folder(folder: str, *, _root_: DictConfig) -> str | None:
    """``${terra_snapshot:FOLDER}``: ``<terra_root>/FOLDER``, or None while ``terra_root`` is unset."""
    root = _root_.get("terra_root")
    return None if root is None else str(Path(str(root)).expanduser() / folder)


def checkpoint_path(cfg: DictConfig, group: str, key: str) -> str:
    """The checkpoint folder config group ``group`` names in ``key``, checked to exist (one line if missing)."""
    node = cfg[group]
    name = node.get("name", "?")
    if OmegaConf.is_missing(node, key):
        raise TerraInputError(f"{group}={name} needs a checkpoint folder; add {group}.{key}=/path/to/it")
    value: Any = node[key]
    if value is None:
        raise TerraInputError(
            f"{group}={name} needs Terra's weights: add terra_root=/path/to/Terra ({DOWNLOAD_HINT}), "
            f"or {group}.{key}=/path/to/the/folder"
        )
    path = Path(str(value)).expanduser()
    root = cfg.get("terra_root")
    if root is not None and not path.is_dir() and path.parent == Path(str(root)).expanduser():
        if not path.parent.is_dir():
            raise TerraInputError(f"terra_root={root} does not exist; point it at {DOWNLOAD_HINT}")
        raise TerraInputError(
            f"terra_root={root} has no {path.name}/ folder, which {group}={name} needs; download the whole "
            f"repo ({DOWNLOAD_HINT}) or set {group}.{key}=/path/to/it"
        )
    return str(path)
