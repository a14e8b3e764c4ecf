"""Fine-tuning and its data: driving logs → shards → training runs."""

from terra.core.lazy import moved_modules

MOVED_MODULES = moved_modules(__name__, {"prepare": "prepare_logs"})
