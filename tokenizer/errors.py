"""The toolkit's one error type for user mistakes, defined at its lowest layer so every part can raise it.

Every entry point (CLI, scripts, Python API) raises :class:`InputError` (``terra.config.TerraInputError`` is
the same class) for bad input: its message is one line that names the offending input and says how to fix
it. The CLI prints that line and exits with code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input (file, array, config value); ``str(err)`` is one line naming the input and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
