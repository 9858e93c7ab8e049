"""The Hugging Face libraries' offline switches, set before anything of ours imports transformers: the package
debate/__init__.py calls `set_offline()`, so it runs whatever module of the project a process imports first (train
imports debate first); models.py and gguf.py call it again above their transformers imports (the libraries read the
switches at import), and runs call it once more before loading (it only assigns).
"""
import logging
import os
import sys


def set_offline():
    """Force the Hugging Face libraries offline (hub, transformers, datasets).

    Assigned rather than defaulted: the toolkit targets air-gapped machines, and a stray
    HF_HUB_OFFLINE=0 in a shell profile would otherwise make a typo in a path turn into a hub lookup.
    """
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY"):
        os.environ[name] = "1"
    # transformers 5.25 asks the `kernels` package for hub kernels on every load unless this says no, and with
    # `kernels` kept out (below) it then refuses to load an NF4 model ("Kernels are not available"). Read at each
    # load, so setting it here is in time.
    os.environ["USE_HUB_KERNELS"] = "NO"
    # huggingface_hub reads the variable once, at import; if something imported it before us,
    # update the value it already read.
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None and hasattr(constants, "HF_HUB_OFFLINE"):
        constants.HF_HUB_OFFLINE = True
    keep_bitsandbytes_off_the_hub()


def keep_bitsandbytes_off_the_hub():
    """Stop bitsandbytes' one hub lookup before it is imported, and the warning it prints when it cannot make it.

    bitsandbytes (0.48 to 0.50.2 at least), when imported on a CPU with AVX512-BF16, calls
    `kernels.get_kernel("kernels-community/quantization-bitsandbytes")`: a download of a faster CPU kernel from
    the Hugging Face Hub, which an air-gapped machine must never attempt. It has no switch for this. A `kernels`
    entry of None in sys.modules makes that import fail at once, without looking on disk or on the hub, so
    bitsandbytes takes its built-in CPU kernel (transformers then also sees no `kernels` package). Its
    "Failed to load CPU gemm_4bit_forward from kernels-community ... pip install kernels" warning then reports
    only the import we stopped and would tell an offline user to install a package they must not use: its
    logger is set to errors only. Both must happen before bitsandbytes is imported (peft and transformers
    import it), which is why they live here, with the other switches set before those imports.
    """
    sys.modules.setdefault("kernels", None)
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
