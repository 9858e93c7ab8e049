"""The Moderator model for training: a frozen (4-bit on CUDA) base with a trainable LoRA adapter."""
import json
import os
import warnings
from contextlib import contextmanager

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load_file

from debate.engine import models


@contextmanager
def _peft_asks_the_old_name():
    """peft's PeftModel asks the base model `is_gradient_checkpointing`, the name transformers 5.x deprecated for
    `is_activation_checkpointing` (same answer, a FutureWarning on every wrap). Only that one warning, and only
    around the wrap, is silenced; where the property is gone, peft's getattr default applies."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def load_trainable(base_path, *, adapter=None, r=128, alpha=256, dropout=0.05, use_4bit=True,
                   gradient_checkpointing=True, device=None):
    """(peft model, tokenizer, LoadedModel): a new LoRA on every linear layer, or `adapter` made trainable.

    On CUDA the base is 4-bit NF4 with bf16 compute (QLoRA) when bitsandbytes is there; the LoRA
    weights stay float32. Gradient checkpointing recomputes activations in the backward pass instead
    of keeping them, which is what lets 4k-token pairs fit.
    """
    loaded = models.load_model(base_path, use_4bit=use_4bit, device=device)
    model = loaded.model
    if gradient_checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # the newer name; early 5.x only has the old
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if adapter:
        models.check_adapter_dir(adapter, str(adapter))
        models.check_adapter_base(adapter, model.config, loaded.path)
        try:
            with _peft_asks_the_old_name():
                model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
        except Exception as e:
            raise models.ModelLoadError(f"cannot load adapter {adapter}: {models.one_line(e)}") from e
    else:
        config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear",
                            task_type="CAUSAL_LM")
        with _peft_asks_the_old_name():
            model = get_peft_model(model, config)
    for name, p in model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()  # optimizer state and updates in fp32, whatever the base's dtype
    return model, loaded.tokenizer, loaded


def save_adapter(model, out_dir, loaded):
    """Save the adapter the standard way, plus the base fingerprint run_debate checks before using it."""
    model.save_pretrained(out_dir)
    with open(os.path.join(out_dir, models.BASE_FILE), "w") as f:
        json.dump({"base": loaded.path, "fingerprint": models.base_fingerprint(model.config)}, f, indent=2)


def load_adapter_weights(model, adapter_dir):
    """Put the weights of a saved adapter (a checkpoint) into `model`'s active adapter, in place."""
    state = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    result = set_peft_model_state_dict(model, state)
    if getattr(result, "unexpected_keys", None):
        raise RuntimeError(f"{adapter_dir}: adapter weights do not fit this model ({result.unexpected_keys[:3]})")
