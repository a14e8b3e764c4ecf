"""The ground floor: what every wing shares and nothing of the project's is imported for.

The error type (:mod:`terra.core.errors`), atomic writes and the output marker (:mod:`terra.core.atomic`), one run
per output folder (:mod:`terra.core.lock`), folders a run created (:mod:`terra.core.folders`), the device and
thread settings (:mod:`terra.core.device`) and lazy package faces (:mod:`terra.core.lazy`). At module level these
import the standard library only (torch inside functions), so ``import terra.tokenizer`` loads nothing more.
One import path per name: this face re-exports nothing.
"""
