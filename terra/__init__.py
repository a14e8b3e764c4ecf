"""Terra toolkit: action-conditioned autoregressive world-model video generation."""

import os

# gRPC (terra-alpasim, terra-drive's drivers) is never used across a fork here: worker processes are spawned and
# subprocesses exec. Its fork support would restart its poller thread in every forked child, where it runs between
# fork and exec (imageio's ffmpeg reader forks: tokenizer/images.py) and can log into the child's pipes or hang it.
# Set before anything imports grpc; the environment may still ask for it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from terra.core.errors import TerraInputError  # noqa: E402

__all__ = ["TerraInputError"]
