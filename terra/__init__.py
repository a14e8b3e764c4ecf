"""Terra toolkit: action-conditioned autoregressive world-model video generation.

Importing ``terra`` is light (no torch, no Transformers). The parts, by data flow (docs/ARCHITECTURE.md):
:mod:`terra.inputs` (context frames + trajectory → rollout requests), :mod:`terra.generation` (backends),
:mod:`terra.pipeline` (tokenizer → backend → frames), :mod:`terra.outputs`; the world model itself is in
:mod:`terra.models` (importing it registers ``llama_action`` with Transformers' Auto classes), its vLLM
port in :mod:`terra.vllm`, batch rollouts in :mod:`terra.batch`, the synthetic driving world in
:mod:`terra.sim`.
"""

import os

# gRPC (terra-alpasim, terra-drive's drivers) is never used across a fork here: worker processes are spawned and
# subprocesses exec. Its fork support would restart its poller thread in every forked child, where it runs between
# fork and exec (imageio's ffmpeg reader forks: tokenizer/images.py) and can log into the child's pipes or hang it.
# Set before anything imports grpc; the environment may still ask for it.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from terra.core.errors import TerraInputError  # noqa: E402

__all__ = ["TerraInputError"]
