"""Terra toolkit: action-conditioned autoregressive world-model video generation."""

import os

# gRPC is never used across a fork here, and its fork support can hang a forked child; set before grpc is imported.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from terra.core.errors import TerraInputError  # noqa: E402

__all__ = ["TerraInputError"]
