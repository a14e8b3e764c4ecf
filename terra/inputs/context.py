"""Context frames from what a user names: a folder, a glob, a video or a list of images, resized for the tokenizer."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    import torch


def resolve_path(path: str | os.PathLike, base: Path) -> str:
    """``path`` with ``~`` expanded; a relative one is taken from ``base``."""
    p = Path(path).expanduser()
    return str(p if p.is_absolute() else base / p)


def load_context(sources: str | os.PathLike | Sequence[str], image_size: tuple[int, int], num_context: int | None,
                 base: Path | None = None, resize: str = "crop") -> tuple[torch.Tensor, list[str]]:
    """The last ``num_context`` frames (None: all), resized: images ``[N, 3, H, W]`` in [-1, 1] and the sources read."""
    from terra.tokenizer.images import load_images

    single = isinstance(sources, (str, os.PathLike))
    if base is not None:
        sources = [resolve_path(s, base) for s in ([sources] if single else sources)]
    else:
        sources = str(sources) if single else [str(s) for s in sources]
    images = load_images(sources, image_size, last_n=num_context, resize=resize)
    return images, [sources] if isinstance(sources, str) else sources
