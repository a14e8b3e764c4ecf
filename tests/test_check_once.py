"""Each input is read and checked once, where it enters (docs/ARCHITECTURE.md, "Data flow"): counted with a
profiler on the functions' code objects, so calls through any import name count.

* ``terra-generate`` with a trajectory file: the file is read once and its actions validated once;
* a batch run: the settings checked once, the output lock taken once, the world model digested once, each sample's
  files digested once, its trajectory parsed and its actions validated once;
* a session step: the action parsed and validated once, the pose computed once.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import pytest

import terra.apps.generate
import terra.batch.config
import terra.core.lock
import terra.batch.samples
import terra.config.files
import terra.config.spec
import terra.contract.actions
import terra.inputs.actions
import terra.inputs.ego_motion
import terra.models.checkpoint
import terra.run
import terra.session.context
import terra.session.driver_input
from terra.batch import BatchConfig, run_batch
from tests.batch.test_batch import NUM_CONTEXT, NUM_FRAMES, demo_pipeline, scenes, terra_line  # noqa: F401

pytestmark = pytest.mark.usefixtures("single_thread")  # conftest: one torch thread


@contextmanager
def calls(*functions: Callable) -> Iterator[Counter]:
    """Count the calls of ``functions`` in every thread while the block runs (by code object)."""
    codes = {f.__code__: f.__name__ for f in functions}
    counts: Counter = Counter()
    lock = threading.Lock()

    def profile(frame, event, arg) -> None:
        if event == "call" and frame.f_code in codes:
            with lock:
                counts[codes[frame.f_code]] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        yield counts
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def test_generate_reads_a_trajectory_file_once_and_validates_its_actions_once(tmp_path):
    from hydra import compose, initialize_config_dir

    from terra.apps.runner import CONF_DIR

    trajectory = tmp_path / "trajectory.json"
    actions = terra.inputs.actions.actions_for_manoeuvre("curve_left", 6)
    trajectory.write_text(json.dumps({"actions": actions.tolist()}))
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=["backend=hf", "device=cpu", "num_frames=2", f"trajectory={trajectory}"])
    with calls(terra.inputs.actions.read_trajectory_file, terra.config.files.read_input_text,
               terra.contract.actions.validate_actions, terra.config.spec.run_spec, terra.run.resolve_run,
               terra.models.checkpoint.read_world_model_config) as counts:
        summary = terra.apps.generate.run(terra.apps.generate.generate_spec(cfg), tmp_path / "out")
    assert summary["generated_frames"] == 2
    assert counts == {"read_trajectory_file": 1, "read_input_text": 1, "validate_actions": 1, "run_spec": 1,
                      "resolve_run": 1, "read_world_model_config": 1}


def test_a_batch_checks_its_settings_and_takes_its_lock_once(tmp_path, scenes, demo_pipeline):
    samples = tmp_path / "samples.jsonl"
    samples.write_text("\n".join(terra_line(scenes, f"s{i}") for i in range(2)) + "\n")
    config = BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), backend="hf", device="cpu",
                         num_frames=NUM_FRAMES, num_context=NUM_CONTEXT, image_root=scenes["root"], progress=False)
    with calls(terra.batch.config.check_config, terra.core.lock._acquire, terra.batch.samples.sample_inputs,
               terra.contract.actions.validate_actions, terra.config.files.checkpoint_digest,
               terra.config.files.file_digest) as counts:
        result = run_batch(config, pipeline=demo_pipeline)
    assert result.counts["ok"] == 2
    # the world model (its 3 files) and the tokenizer (2) digested once for the run, each context image once
    assert counts == {"check_config": 1, "_acquire": 1, "sample_inputs": 2, "validate_actions": 2,
                      "checkpoint_digest": 2, "file_digest": 3 + 2 + 2 * NUM_CONTEXT}


def test_terra_rollout_checks_its_settings_and_checkpoint_folders_once(tmp_path):
    """batch_spec(cfg) builds the batch's RunSpec with run_spec on the Hydra config itself: each checkpoint folder
    is checked to exist once, and the samples file is opened once, before anything loads."""
    from hydra import compose, initialize_config_dir

    import terra.config.snapshot
    from terra.apps.runner import CONF_DIR
    from terra.batch import batch_spec

    samples = tmp_path / "samples.jsonl"
    samples.write_text("")
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("rollout", overrides=[f"samples={samples}", f"output.dir={tmp_path / 'out'}", "backend=hf"])
    with calls(terra.config.snapshot.checkpoint_path, terra.config.spec.run_spec,
               terra.config.files.open_input_file) as counts:
        spec = batch_spec(cfg)
    assert spec.sample_files == (samples,) and spec.run.backend == "hf"
    assert counts == {"checkpoint_path": 2, "run_spec": 1, "open_input_file": 1}  # world model, tokenizer


def test_a_session_step_parses_and_validates_its_action_once():
    from terra.generation.backends import create_backend
    from terra.session import SessionHost

    backend = create_backend("hf", "terra/assets/demo/world_model", device="cpu")
    action = terra.session.driver_input.drive_action(0.2, 30.0).tolist()
    with calls(terra.session.driver_input.parse_action, terra.contract.actions.validate_actions,
               terra.inputs.ego_motion.advance_pose) as counts:  # from before the engine's thread starts
        host = SessionHost(backend, max_frames=4)
        try:
            context = np.zeros((2, backend.layout.image_tokens), dtype=np.int64)
            session = host.open_context(terra.session.context.from_codes(context, (9, 16), None, 30.0), seed=0)
            before = counts.copy()
            frame = session.step({"actions": action}, decode=False)
            step = counts - before
        finally:
            host.close()
            backend.close()
    assert frame.index == 0 and frame.pose[0] > 0
    assert step == {"parse_action": 1, "validate_actions": 1, "advance_pose": 1}
