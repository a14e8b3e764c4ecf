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


def error_reason(err: BaseException, limit: int = 200) -> str:
    """What a third-party reader's exception says went wrong, as a short phrase for a one-line message: its
    first sentence, cut to ``limit`` characters only when that sentence alone is longer. For a pickle that
    ``torch.load(weights_only=True)`` refused, the unpickler's own reason (what the file tried to load), not the
    advice around it."""
    text = str(err).strip()
    refused = text.startswith("Weights only load failed")
    marker = "WeightsUnpickler error:"
    if refused and marker in text:  # torch's advice, then the unpickler's reason, then a pointer to the docs
        text = text.split(marker, 1)[1].split("\n\n")[0]
    elif refused:  # paragraphs: the advice, the reason, the pointer
        reasons = [p for p in text.split("\n\n")[1:] if p.strip() and not p.strip().startswith(("Check the", "Please"))]
        text = reasons[0] if reasons else ""
    text = " ".join(text.split())
    end = text.find(". ")
    sentence = (text[: end + 1] if end >= 0 else text) or type(err).__name__
    sentence = sentence if len(sentence) <= limit else f"{sentence[: limit - 3]}..."
    return f"a pickle that would run code, refused: {sentence}" if refused else sentence
