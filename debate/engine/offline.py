"""The Hugging Face libraries' offline switches, set before anything of ours imports transformers: models.py
and gguf.py call `set_offline()` above their transformers imports (the libraries read the switches at import).
"""
import os
import sys


def set_offline():
    """Force the Hugging Face libraries offline (hub, transformers, datasets).

    Assigned rather than defaulted: the toolkit targets air-gapped machines, and a stray
    HF_HUB_OFFLINE=0 in a shell profile would otherwise make a typo in a path turn into a hub lookup.
    """
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ[name] = "1"
    # huggingface_hub reads the variable once, at import; if something imported it before us,
    # update the value it already read.
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and hasattr(constants, "HF_HUB_OFFLINE"):
        constants.HF_HUB_OFFLINE = True
