"""Encode every frame of a clip dataset with an image tokenizer into one tokenized-clips file.

    python scripts/tokenize_dataset.py dataset=data/clips tokenizer_path=models/tokenizer out=data/tokens.safetensors

Writes ``codes [N, T, h, w]``, ``actions [N, T, 6, 3]`` and ``poses [N, T, 3]`` (see terra/sim/tokens.py) for
scripts/train_world_model.py. The config is defined below (no YAML file): every key can be overridden.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import hydra
import numpy as np
import torch
from einops import rearrange
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig
from tqdm import tqdm

from terra.apps.runner import CONFIG_PATH, run_app
from terra.config.output_dir import claim_output_file
from terra.core.device import resolve_device
from terra.core.errors import TerraInputError
from terra.generation.actions import NUM_ACTION_TOKENS
from terra.sim.dataset import ClipDataset
from terra.sim.tokens import TokenizedClips, save_tokens
from terra.tokenizer import load_tokenizer

CONFIG = {
    "defaults": [{"override hydra/job_logging": "stdout"}, "_self_"],
    "dataset": "data/clips",  # folder written by scripts/make_dataset.py
    "tokenizer_path": "???",  # saved tokenizer (folder with config.json + model.safetensors)
    "out": "data/tokens.safetensors",
    "batch_size": 64,  # frames per encoder call
    "device": "auto",  # auto (cuda when available) | cpu | cuda | cuda:N
    "hydra": {"run": {"dir": "."}, "output_subdir": None, "job": {"chdir": False}},
}
ConfigStore.instance().store(name="tokenize_dataset", node=CONFIG)


@torch.no_grad()
def tokenize_dataset(
    dataset: ClipDataset, tokenizer: Any, batch_size: int = 64, progress: bool = True
) -> TokenizedClips:
    """Codes of every frame of ``dataset`` from ``tokenizer`` (``encode([B,3,H,W] in [-1,1]) -> [B,h,w]``)."""
    if tuple(tokenizer.image_size) != dataset.image_size:
        raise TerraInputError(
            f"the tokenizer works at {tuple(tokenizer.image_size)} but the dataset {dataset.path} holds "
            f"{dataset.image_size} frames; render the dataset at the tokenizer's size"
        )
    device = torch.device(getattr(tokenizer, "device", "cpu"))
    frames_per_clip = dataset.num_frames
    codes = np.empty((len(dataset), frames_per_clip, *tokenizer.grid_shape), dtype=np.int64)
    actions = np.empty((len(dataset), frames_per_clip, NUM_ACTION_TOKENS, 3), dtype=np.float32)
    poses = np.empty((len(dataset), frames_per_clip, 3), dtype=np.float64)
    flat = codes.reshape(-1, *tokenizer.grid_shape)
    pending: list[np.ndarray] = []
    done = 0

    def flush() -> None:
        nonlocal done
        batch = torch.from_numpy(np.concatenate(pending)).to(device)
        images = rearrange(batch, "b h w c -> b c h w").float() / 127.5 - 1.0
        flat[done : done + len(batch)] = tokenizer.encode(images).cpu().numpy()
        done += len(batch)
        pending.clear()

    for i, clip in enumerate(tqdm(dataset, total=len(dataset), desc="tokenizing", unit="clip", disable=not progress)):
        actions[i], poses[i] = clip.actions, clip.poses
        pending.append(clip.frames)
        if sum(len(p) for p in pending) >= batch_size:
            flush()
    if pending:
        flush()
    return TokenizedClips(codes=codes, actions=actions, poses=poses, codebook_size=int(tokenizer.codebook_size),
                          image_size=dataset.image_size, source=str(dataset.path))


def run(cfg: DictConfig) -> TokenizedClips:
    """Load the tokenizer named in ``cfg``, encode the dataset and write the tokens file; return the clips."""
    dataset = ClipDataset(cfg.dataset)
    if not Path(str(cfg.tokenizer_path)).exists():
        raise TerraInputError(
            f"tokenizer {cfg.tokenizer_path} does not exist; pass tokenizer_path=<saved tokenizer folder>"
        )
    out = Path(str(cfg.out)).expanduser()
    claim_output_file(out, "out", inputs=[("dataset", dataset.path), ("tokenizer", str(cfg.tokenizer_path))])
    tok = load_tokenizer(str(cfg.tokenizer_path), device=torch.device(resolve_device(str(cfg.device)))).eval()
    clips = tokenize_dataset(dataset, tok, int(cfg.batch_size))
    clips = TokenizedClips(**{**clips.__dict__, "tokenizer": str(cfg.tokenizer_path)})
    save_tokens(out, clips)  # replaces only a file the toolkit wrote (checked above)
    return clips


@hydra.main(config_path=CONFIG_PATH, config_name="tokenize_dataset", version_base=None)
def main(cfg: DictConfig) -> None:
    """Hydra entry point: tokenize, printing bad settings as one line (exit code 2)."""
    start = time.perf_counter()
    try:
        clips = run(cfg)
    except TerraInputError as err:
        print(f"tokenize_dataset: error: {err}", file=sys.stderr)
        sys.exit(2)
    n, t, h, w = clips.codes.shape
    print(f"wrote codes of {n} clips x {t} frames ({h}x{w} codes, codebook {clips.codebook_size}) to {cfg.out} "
          f"in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    run_app(main, "tokenize_dataset", "python scripts/tokenize_dataset.py")
