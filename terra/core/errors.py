"""The toolkit's one error type for user mistakes, and exceptions turned into one line."""

from __future__ import annotations


class TerraInputError(ValueError):
    """Bad user input (file, array, config value); ``str(err)`` is one line naming the input and the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def error_reason(err: BaseException, limit: int = 200) -> str:
    """What a third-party reader's exception says went wrong, as a short phrase for a one-line message."""
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



def past(value: float, bound: float) -> str:
    """``value`` with the fewest significant digits (3 at least) that still read past ``bound``."""
    value, bound = float(value), float(bound)
    whole = len(f"{abs(value):.0f}") if abs(value) < 1e6 else 0  # every digit before the point below a million
    for digits in range(max(3, whole), 18):
        text = f"{value:.{digits}g}"
        if (float(text) > bound) == (value > bound) and float(text) != bound:
            return text
    return repr(value)


MAX_QUOTE_CHARS = 200  # user text quoted in a message


def quoted(text: object) -> str:
    """User text (a name, an id, a cell) as a message quotes it."""
    text = str(text)
    shown = repr(text[:MAX_QUOTE_CHARS])
    if len(text) <= MAX_QUOTE_CHARS and len(shown) <= MAX_QUOTE_CHARS:
        return shown
    return f"{shown[: MAX_QUOTE_CHARS - 3]}... ({len(text)} characters)"


def clipped(text: object) -> str:
    """User text named unquoted (a file's name in an archive)."""
    text = str(text)
    return text if len(text) <= MAX_QUOTE_CHARS else f"{text[: MAX_QUOTE_CHARS - 3]}... ({len(text)} characters)"


MAX_ERROR_CHARS = 500  # an error recorded in a manifest or a drive's record is one line, cut to this length


def _gpu_out_of_memory(err: BaseException) -> bool:
    """torch's CUDA out-of-memory, matched by name (settings are checked before torch is imported)."""
    kind = type(err)
    return kind.__name__ == "OutOfMemoryError" and kind.__module__.split(".")[0] == "torch"


def error_line(err: BaseException, limit: int = MAX_ERROR_CHARS, memory_advice: str = "give smaller inputs") -> str:
    """An exception as one line of at most ``limit`` characters, for a record of what failed."""
    text = " ".join(str(err).split())
    if _gpu_out_of_memory(err):  # the fix first: a long detail is what gets cut
        text = f"the GPU ran out of memory: {memory_advice} (torch.OutOfMemoryError: {text or 'no detail'})"
    elif isinstance(err, RecursionError):
        text = "the input nests too deeply to be read (RecursionError); simplify it"
    elif isinstance(err, MemoryError):
        text = f"ran out of memory (MemoryError); {memory_advice}"
    elif not isinstance(err, TerraInputError):
        text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return text if len(text) <= limit else f"{text[: limit - 3]}..."
