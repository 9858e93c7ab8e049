"""The engine's load error and its one-line message, shared by model loading (models.py) and GGUF conversion
(gguf.py)."""


class ModelLoadError(RuntimeError):
    """A model or adapter could not be loaded; the message names the path and the reason."""


def one_line(error):
    """An exception as one line for an `error:` message: its type and its text, whitespace folded, cut at
    400 characters (a tokenizer or safetensors error can run to pages)."""
    text = " ".join(str(error).split()) or "no message"
    if len(text) > 400:
        text = text[:400] + "..."
    return f"{type(error).__name__}: {text}"
