"""A clip dataset encoded with an image tokenizer into one tokenized-clips file that ``terra-train`` reads."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from terra.config.assets import DEMO
from terra.config.backend import device_setting, num_threads_setting
from terra.config.checks import Range, required_path
from terra.config.output_dir import claim_output_file
from terra.contract.actions import NUM_ACTION_TOKENS
from terra.config.schema import check_schema, setting
from terra.core.errors import TerraInputError
from terra.core.progress import Progress
from terra.sim.dataset import ClipDataset
from terra.sim.tokens import TokenizedClips


@dataclass
class TokenizeConfig:
    """terra-tokenize's settings."""

    dataset: Optional[str] = setting("data/clips", "folder written by terra-make-dataset")
    tokenizer_path: Optional[str] = setting(None, "saved tokenizer (folder with config.json + model.safetensors), "
                                                  "e.g. the demo's, terra/assets/demo/tokenizer")
    out: Optional[str] = setting("data/tokens.safetensors", "the tokenized-clips file to write")
    batch_size: int = setting(64, "frames per encoder call", Range(1, 65536, 64, whole=True))
    device: str = device_setting()
    num_threads: Optional[Union[int, str]] = num_threads_setting()


@dataclass(frozen=True)
class TokenizeSpec:
    dataset: Path
    tokenizer: Path
    out: Path
    batch_size: int = 64
    device: str = "auto"
    num_threads: int | None = None  # torch CPU threads


def tokenize_spec(cfg: Any) -> TokenizeSpec:
    """Every setting of ``terra-tokenize`` checked once (the tokenizer folder must exist)."""
    tokenizer = required_path(cfg, "tokenizer_path", f"a saved tokenizer folder, e.g. the demo tokenizer's: "
                                                     f"tokenizer_path={DEMO / 'tokenizer'}")
    if not tokenizer.exists():
        raise TerraInputError(f"tokenizer {tokenizer} does not exist; pass tokenizer_path=<saved tokenizer folder>")
    dataset = required_path(cfg, "dataset", "a clip dataset folder")
    out = required_path(cfg, "out", "the tokenized-clips file to write", "FILE")
    values = check_schema(cfg, TokenizeConfig)
    return TokenizeSpec(dataset, tokenizer, out, values["batch_size"], values["device"], values["num_threads"])


def tokenize_dataset(dataset: ClipDataset, tokenizer: Any, batch_size: int = 64,
                     progress: bool = True) -> TokenizedClips:
    """Codes of every frame of ``dataset`` from ``tokenizer``, with the clips' actions, poses and routes (or None)."""
    import torch
    from einops import rearrange

    if tuple(tokenizer.image_size) != dataset.image_size:
        raise TerraInputError(f"the tokenizer works at {tuple(tokenizer.image_size)} but the dataset {dataset.path} "
                              f"holds {dataset.image_size} frames; render the dataset at the tokenizer's size")
    device = torch.device(getattr(tokenizer, "device", "cpu"))
    frames_per_clip = dataset.num_frames
    codes = np.empty((len(dataset), frames_per_clip, *tokenizer.grid_shape), dtype=np.int64)
    actions = np.empty((len(dataset), frames_per_clip, NUM_ACTION_TOKENS, 3), dtype=np.float32)
    poses = np.empty((len(dataset), frames_per_clip, 3), dtype=np.float64)
    route_points = dataset.route_points  # the dataset's resolution, kept as it is
    routes = None if route_points is None else np.empty((len(dataset), frames_per_clip, route_points, 3),
                                                        dtype=np.float32)
    off_pose = np.zeros(len(dataset), dtype=np.int64)
    clips_per_call = -(-batch_size // frames_per_clip)  # whole clips, at least batch_size frames an encoder call
    pending: list[np.ndarray] = []
    with torch.no_grad(), Progress(len(dataset), "tokenizing", "clip", enabled=progress) as bar:
        for i, clip in enumerate(bar.counted(dataset)):
            actions[i], poses[i], off_pose[i] = clip.actions, clip.poses, clip.off_pose_frames
            if routes is not None:
                routes[i] = clip.routes
            pending.append(clip.frames)
            if len(pending) == clips_per_call or i == len(dataset) - 1:
                images = rearrange(torch.from_numpy(np.concatenate(pending)).to(device), "b h w c -> b c h w")
                encoded = tokenizer.encode(images.float() / 127.5 - 1.0).cpu().numpy()
                codes[i + 1 - len(pending):i + 1] = encoded.reshape(len(pending), *codes.shape[1:])
                pending.clear()
    return TokenizedClips(codes=codes, actions=actions, poses=poses, codebook_size=int(tokenizer.codebook_size),
                          image_size=dataset.image_size, source=str(dataset.path), routes=routes,
                          off_pose_frames=off_pose)


def run(spec: TokenizeSpec) -> TokenizedClips:
    import torch

    from terra.core.device import resolve_device, set_threads
    from terra.sim.tokens import save_tokens
    from terra.tokenizer import load_tokenizer

    dataset = ClipDataset(spec.dataset)
    claim_output_file(spec.out, "out", inputs=[("dataset", dataset.path), ("tokenizer", str(spec.tokenizer))],
                      app="terra-tokenize")
    set_threads(spec.num_threads)
    tokenizer = load_tokenizer(str(spec.tokenizer), device=torch.device(resolve_device(spec.device))).eval()
    clips = replace(tokenize_dataset(dataset, tokenizer, spec.batch_size), tokenizer=str(spec.tokenizer))
    save_tokens(spec.out, clips)
    return clips
