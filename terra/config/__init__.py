"""The light layer every entry point starts from (no torch): checks, input files, outputs, engine settings, sampling,
snapshots and :class:`RunSpec`.
"""

from terra.config.sampling import SamplingConfig
from terra.config.spec import RunSpec, run_spec

__all__ = ["RunSpec", "SamplingConfig", "run_spec"]
