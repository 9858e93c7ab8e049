"""The Moderator model for training: a frozen base (NF4 by default on CUDA, on any device with --4bit) with a
trainable LoRA adapter: QLoRA when the base is 4-bit."""
import json
import os
from typing import TYPE_CHECKING, Any, Optional, Tuple, Union

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load_file

from debate.engine import errors, models
from debate.engine.errors import one_line
from train.settings import DEFAULTS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def load_trainable(base_path: models.PathLike, *, adapter: Optional[str] = None, r: int = DEFAULTS.lora_r,
                   alpha: int = DEFAULTS.lora_alpha, dropout: float = DEFAULTS.lora_dropout,
                   use_4bit: Optional[bool] = None, gradient_checkpointing: bool = DEFAULTS.gradient_checkpointing,
                   device: models.Device = None, dtype: Union[None, str, torch.dtype] = None,
                   ) -> Tuple[PeftModel, "PreTrainedTokenizerBase", models.LoadedModel]:
    """(peft model, tokenizer, LoadedModel): a new LoRA on every linear layer, or `adapter` made trainable.

    `use_4bit` as in models.load_model: by default the base is 4-bit NF4 with bf16 compute on CUDA (QLoRA),
    float32 on a CPU; True quantises on a CPU too. The base stays frozen; the LoRA weights are float32.
    Gradient checkpointing recomputes activations in the backward pass instead of keeping them, which is
    what lets 4k-token pairs fit. `dtype`: the compute dtype (models.load_model's; bf16 on a CPU runs the
    GPU's setting there, with train.loop.autocast in bf16).
    """
    loaded = models.load_model(base_path, use_4bit=use_4bit, device=device, dtype=dtype)
    model = loaded.model
    if loaded.quantized:
        _keep_trainable_layout(model)
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
            with models.peft_wrap():
                model = PeftModel.from_pretrained(model, adapter, is_trainable=True)
        except Exception as e:
            raise errors.ModelLoadError(f"cannot load adapter {adapter}: {one_line(e)}") from e
    else:
        config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules="all-linear",
                            task_type="CAUSAL_LM")
        with models.peft_wrap():
            model = get_peft_model(model, config)
    for name, p in model.named_parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()  # optimizer state and updates in fp32, whatever the base's dtype
    return model, loaded.tokenizer, loaded


def _keep_trainable_layout(model: torch.nn.Module) -> None:
    """Keep an NF4 base's weights in the layout that backpropagates, on a CPU too.

    bitsandbytes (0.48 to 0.50 at least) repacks a Linear4bit's weights for a faster CPU kernel the first time
    it runs in eval mode without gradients, on CPUs with AVX512-BF16, and that kernel has no backward: every
    later training step then gets no gradient at all, silently. D-DPO's reference pass runs in eval mode
    before training, so it would trigger that; switching the repack off per layer avoids it (training only;
    debates keep the fast kernel). tests/test_4bit.py trains after an eval pass to hold this.
    """
    import bitsandbytes as bnb

    for module in model.modules():
        if isinstance(module, bnb.nn.Linear4bit):
            module.support_avx512bf16_for_cpu = False


def save_adapter(model: PeftModel, out_dir: models.PathLike, loaded: models.LoadedModel) -> None:
    """Save the adapter the standard way, plus the base fingerprint run_debate checks before using it."""
    model.save_pretrained(out_dir)  # type: ignore[arg-type]  # peft says str; a Path works as well
    with open(os.path.join(out_dir, models.BASE_FILE), "w") as f:
        json.dump({"base": loaded.path, "fingerprint": models.base_fingerprint(model.config)}, f, indent=2)


def load_adapter_weights(model: PeftModel, adapter_dir: models.PathLike) -> None:
    """Put the weights of a saved adapter (a checkpoint) into `model`'s active adapter, in place."""
    state = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    result: Any = set_peft_model_state_dict(model, state)  # its fields differ between peft versions
    if getattr(result, "unexpected_keys", None):
        raise RuntimeError(f"{adapter_dir}: adapter weights do not fit this model ({result.unexpected_keys[:3]})")
