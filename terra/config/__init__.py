"""The light layer every entry point starts from (no torch, no Transformers), on the ground floor (:mod:`terra.core`):
the checks (:mod:`terra.config.checks`), input files and strict JSON (:mod:`terra.config.files`), output folders and
names (:mod:`terra.config.outputs`), the engine settings (:mod:`terra.config.backend`), sampling
(:mod:`terra.config.sampling`), Terra snapshots (:mod:`terra.config.snapshot`) and :class:`RunSpec`, the checked
settings of a run (:mod:`terra.config.spec`).
"""

from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec, run_spec

__all__ = ["RunSpec", "SamplingConfig", "run_spec"]
