"""Fine-tuning and its data: driving logs → shards → training runs.

``terra-prepare-logs`` is terra/training/prepare_logs.py (its old path ``terra.training.prepare`` still imports until
0.2.0: terra/core/lazy.py).
"""

from terra.core.lazy import moved_modules

MOVED_MODULES = moved_modules(__name__, {"prepare": "prepare_logs"})
