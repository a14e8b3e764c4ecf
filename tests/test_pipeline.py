"""WorldModelPipeline's tokenizer side: calls from several threads (batch writers, sessions, the server) run one
at a time, so the tokenizer's activations stay one batch beside an engine that holds most of the GPU."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from terra.generation.backends import create_backend
from terra.models.presets import TINY_TOKENIZER
from terra.pipeline import WorldModelPipeline
from tokenizer import LFQTokenizer


def test_concurrent_encode_and_decode_never_overlap_in_the_tokenizer(tiny_model_dir, single_thread) -> None:
    torch.manual_seed(0)
    tokenizer = LFQTokenizer(TINY_TOKENIZER)
    pipeline = WorldModelPipeline(tokenizer, create_backend("hf", tiny_model_dir, device="cpu"), decode_batch_size=2)
    inside, most = 0, 0
    guard = threading.Lock()

    def counted(method):
        def call(*args, **kwargs):
            nonlocal inside, most
            with guard:
                inside += 1
                most = max(most, inside)
            time.sleep(0.01)  # long enough for other threads to try to enter
            try:
                return method(*args, **kwargs)
            finally:
                with guard:
                    inside -= 1
        return call

    tokenizer.decode = counted(tokenizer.decode)
    tokenizer.encode = counted(tokenizer.encode)
    images = torch.rand(4, 3, *pipeline.image_size) * 2 - 1
    codes = pipeline.encode(images)
    with ThreadPoolExecutor(6) as pool:
        decoded = list(pool.map(lambda _: pipeline.decode(codes), range(6)))
        encoded = list(pool.map(lambda _: pipeline.encode(images), range(6)))
    assert most == 1
    assert all(np.array_equal(frames, decoded[0]) for frames in decoded)
    assert all(np.array_equal(c, codes) for c in encoded)
    assert decoded[0].shape == (4, *pipeline.image_size, 3)
