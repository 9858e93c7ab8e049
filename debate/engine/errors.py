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


class ContextOverflow(RuntimeError):
    """Some rows of a turn could not run: `failed` maps each row to the reason in words (its context would pass
    the model's window, or one conversation alone needs more than the memory budget). The other rows ran:
    `replies` holds their replies (None for a failed row, whose conversation is left as it was). A claim with a
    failed row ends with a note in its record; the run goes on."""

    def __init__(self, failed, replies):
        self.failed, self.replies = dict(failed), list(replies)
        # The conversations of the claim that could not go on, as far as they are known (the scheduler knows every
        # one of the claim's; a turn run directly, its own): what its record keeps of the work done.
        self.conversations = []
        super().__init__("; ".join(sorted(set(self.failed.values()))))
