"""What a run records of its engine is what the engine ran with: the options the backend was built with
(terra/generation/resolve.py, ``engine_options``: the one place that decides them), not the options as configured.
A vLLM engine is sized for the run's rollouts: terra-generate's sidecar records ``max_num_seqs: 1`` for one sample
where conf/backend/vllm.yaml says 64, and terra-rollout's sidecars ``engine_options`` beside the settings as given.
"""

from __future__ import annotations

import dataclasses
import json

from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec
from terra.generation import backends, resolve
from tests.batch.test_batch import scenes, terra_line  # noqa: F401  (scenes: the module's context images)



def engines_built(monkeypatch) -> list:
    """The (kind, options) of every engine the run asks for, each served by a sequential Transformers backend on the
    CPU instead (a stand-in: what matters is what the run asked for)."""
    built = []
    real = backends.build_backend

    def build_backend(run):
        built.append((run.spec.backend, run.engine_options))
        spec = run.spec.replace(backend="hf", device="cpu", backend_options={},
                                sampling=run.spec.sampling.replace(decoding="sequential"))
        return real(dataclasses.replace(run, spec=spec, engine_options={}, passes_per_step=None))

    monkeypatch.setattr("terra.pipeline.build_backend", build_backend)
    monkeypatch.setattr("terra.generation.resolve.resolve_backend", lambda kind, device: kind)
    return built

def test_engine_options_size_a_vllm_engine_for_the_run_and_leave_transformers_as_set(monkeypatch, tiny_model_dir):
    monkeypatch.setattr(resolve, "resolve_backend", lambda kind, device: kind)  # vLLM's options, on any machine
    asked = {"max_num_seqs": 64, "enforce_eager": True}
    sequential = SamplingConfig(decoding="sequential")

    def engine(kind: str, options: dict, max_rollouts: int | None = None) -> dict:
        spec = RunSpec(tiny_model_dir, "", backend=kind, device="cpu", backend_options=options, sampling=sequential)
        return resolve.resolve_backend_run(spec, 1, max_rollouts=max_rollouts).engine_options

    assert engine("vllm", asked, 3) == {"max_num_seqs": 3, "enforce_eager": True}
    assert engine("vllm", asked) == asked  # no rollout count: the options decide
    assert engine("hf", {"max_batch_size": 8}, 3) == {"max_batch_size": 8}
    assert asked == {"max_num_seqs": 64, "enforce_eager": True}  # the caller's options are not changed


def test_the_sidecar_records_the_engine_the_run_built(monkeypatch, tmp_path, single_thread):
    """terra-generate with ``backend=vllm`` and one sample: the engine (a Transformers backend stands in for vLLM,
    built from the same call) gets ``max_num_seqs`` 1, and the sidecar says so."""
    from hydra import compose, initialize_config_dir

    import terra.apps.generate
    from terra.apps.runner import CONF_DIR

    built = engines_built(monkeypatch)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("generate", overrides=["backend=vllm", "device=cpu", "num_samples=1", "num_frames=1",
                                             "num_threads=1", "sampling.decoding=sequential"])
    assert cfg.backend.options.max_num_seqs == 64  # the control: what the configuration says
    out = tmp_path / "out"
    terra.apps.generate.run(terra.apps.generate.generate_spec(cfg), out)
    [(kind, options)] = built
    assert kind == "vllm" and options["max_num_seqs"] == 1
    [sidecar] = [json.loads(p.read_text()) for p in out.rglob("*.json") if "config" in p.read_text()]
    assert sidecar["config"]["backend"]["options"]["max_num_seqs"] == 1
    assert {k: v for k, v in sidecar["config"]["backend"]["options"].items() if k != "max_num_seqs"} == \
        {k: v for k, v in options.items() if k != "max_num_seqs"}



def test_a_batch_sidecar_records_the_engine_the_run_built(monkeypatch, tmp_path, scenes, single_thread):
    """terra-rollout's sidecars: ``engine_options`` is what the engine was built with (room for ``max_concurrent``
    rollouts), beside ``config``, the settings as given."""
    from terra.batch import BatchConfig, run_batch

    built = engines_built(monkeypatch)
    samples = tmp_path / "samples.jsonl"
    samples.write_text(terra_line(scenes, "a") + "\n")
    result = run_batch(BatchConfig(samples=str(samples), output_dir=str(tmp_path / "out"), image_root=scenes["root"],
                                   backend="vllm", device="cpu", num_frames=1, num_context=3, max_concurrent=2,
                                   num_threads=1, backend_options={"max_num_seqs": 64}))
    assert result.counts["ok"] == 1, result.records
    [(kind, options)] = built
    assert kind == "vllm" and options["max_num_seqs"] == 2
    sidecar = json.loads((tmp_path / "out" / "a.json").read_text())
    assert sidecar["engine_options"] == options and sidecar["config"]["backend_options"] == {"max_num_seqs": 64}
