"""Loading local models for the debate agents: HF directories or GGUF files, one copy per base,
LoRA adapters switched on per role.

- `load_model(path)` opens one model. `path` is a local Hugging Face directory (config.json and
  weights) or a `.gguf` file. A GGUF is dequantised by transformers once (about a minute for the
  270M default) and the result is cached as an ordinary HF directory, which later loads take in
  seconds and which 4-bit quantisation can start from (debate/engine/gguf.py).
- Precision: `use_4bit` None (the default) follows the device: CUDA -> 4-bit NF4 (bf16 where bitsandbytes
  cannot quantise), CPU -> float32, because bitsandbytes' CPU NF4 kernels are slower than float32 there
  and a CPU has the memory. True (`--4bit`) asks for NF4 on any device bitsandbytes quantises on (CPU
  included: what the tests run, and what lets a small machine hold a larger model); False (`--no-4bit`)
  never quantises. A GGUF with 4-bit is dequantised once (as always) and its cached HF weights are
  quantised to NF4 at load.
- `load_roles(...)` loads every distinct base once and hands the same model object to every role
  naming it. A role may carry a PEFT LoRA adapter; `adapter_scope(role_model)` must wrap every
  forward/generate call of a role so that only that role's adapter is in effect.

Nothing here touches the network: the HF offline switches are set before transformers is imported
and every `from_pretrained` call passes `local_files_only=True`.
"""
import contextlib
import inspect
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Mapping, Optional, Tuple, Union

# Must run before transformers/huggingface_hub are imported below: they read the switches at import.
from debate.engine.offline import set_offline  # noqa: E402

set_offline()

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

if TYPE_CHECKING:
    from peft import PeftModel

from debate.engine import gguf  # noqa: E402
from debate.engine.errors import ModelLoadError, one_line  # noqa: E402

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
Device = Union[None, str, torch.device]  # None: CUDA when there is one, else the CPU
Model = Union[PreTrainedModel, "PeftModel"]  # a causal LM, wrapped by peft once it carries adapters

# Fallback chat template for tokenizers that carry none: plain-text role headers. Each message is
# "### <Role>\n<content>"; an assistant message ends with the eos token, so a model fine-tuned on
# this format learns to stop there, and a generated reply (which ends in eos) re-renders to exactly
# the tokens that were generated. Starts with bos: encode the rendered text with
# add_special_tokens=False.
FALLBACK_CHAT_TEMPLATE = (
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{{ '### ' + message['role'] | capitalize + '\n' + message['content'] }}"
    "{% if message['role'] == 'assistant' and eos_token %}{{ eos_token }}{% endif %}"
    "{{ '\n\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '### Assistant\n' }}{% endif %}"
)

# Gemma's own turn format, used when the vocabulary has Gemma's turn tokens (the Gemma GGUFs ship
# no template): "<start_of_turn>user\n...<end_of_turn>\n", the assistant speaks as "model", and Gemma
# has no system role, so system text is put at the start of the next user turn.
GEMMA_CHAT_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% if bos_token %}{{ bos_token }}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] + '\n\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n'"
    " + ns.system + message['content'] + '<end_of_turn>\n' }}"
    "{% set ns.system = '' %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
GEMMA_TURN_TOKENS = ("<start_of_turn>", "<end_of_turn>")


@dataclass
class LoadedModel:
    model: Model  # a transformers causal LM, or a peft PeftModel once adapters are attached
    tokenizer: PreTrainedTokenizerBase
    path: str  # the path as resolved (absolute, symlinks followed): a directory or a .gguf file
    device: str  # "cpu", "cuda:0", ...
    dtype: torch.dtype  # torch dtype of the computation (the compute dtype when quantized)
    quantized: bool  # True when the weights are 4-bit (bitsandbytes NF4)
    load_dir: str = ""  # the HF directory actually loaded: `path`, or the GGUF's converted cache


@dataclass
class RoleModel:
    model: Model  # shared with every role on the same base
    tokenizer: PreTrainedTokenizerBase
    path: str
    adapter: str | None  # the peft adapter name for this role (None: base model only)
    loaded: LoadedModel
    adapter_path: str | None = None


def _resolve(path: PathLike) -> str:
    return os.path.realpath(os.path.expanduser(str(path)))


def _pick_device(device: Device) -> torch.device:
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device} was asked for, but CUDA is not available here")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _pick_dtype(dtype: Union[None, str, torch.dtype]) -> Optional[torch.dtype]:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    return value


# device type -> why bitsandbytes cannot quantise there (None: it can); probed once
_BNB_PROBLEMS: Dict[str, Optional[str]] = {}


def _bitsandbytes_problem(device: Union[str, torch.device]) -> Optional[str]:
    """None when bitsandbytes quantises to NF4 on `device`, else why not (one line).

    Probed by quantising 64 zeros: an install can import and still lack the kernels of a device (builds
    before 0.46 had no CPU NF4, a CUDA build may miss its libraries), and only trying tells.
    """
    device = torch.device(device)
    if device.type not in _BNB_PROBLEMS:
        try:
            import bitsandbytes
            import bitsandbytes.functional as bnb_functional
        except Exception as e:  # not only ImportError: a CUDA build raises others when its libraries are missing
            _BNB_PROBLEMS[device.type] = f"bitsandbytes is not importable ({one_line(e)})"
        else:
            try:
                bnb_functional.quantize_4bit(torch.zeros(64, device=device), quant_type="nf4")
                _BNB_PROBLEMS[device.type] = None
            except Exception as e:
                _BNB_PROBLEMS[device.type] = (f"bitsandbytes {getattr(bitsandbytes, '__version__', '?')} cannot "
                                              f"quantise to NF4 on {device.type} ({one_line(e)})")
    return _BNB_PROBLEMS[device.type]


def _bitsandbytes_available(device: Union[str, torch.device] = "cuda") -> bool:
    return _bitsandbytes_problem(device) is None


def _pick_4bit(use_4bit: Optional[bool], device: torch.device) -> bool:
    """Whether to load NF4 on `device`: None -> on CUDA when bitsandbytes can, never on a CPU (slower than
    float32 there); True -> NF4 or a ModelLoadError saying why not; False -> never."""
    if use_4bit is None:
        return device.type == "cuda" and _bitsandbytes_available(device)
    if not use_4bit:
        return False
    problem = _bitsandbytes_problem(device)
    if problem is not None:
        raise ModelLoadError(f"--4bit: {problem}; upgrade bitsandbytes (0.50.2 quantises on CPU and CUDA) "
                             "or pass --no-4bit")
    return True


def _is_model_dir(path: str, given: str) -> bool:
    """True for a Hugging Face model directory, False for a GGUF file; ModelLoadError for anything else.
    The one place both check_model and load_model tell the two apart."""
    if not os.path.exists(path):
        raise ModelLoadError(f"cannot load model {given!r}: no such file or directory (hub ids are not downloaded)")
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ModelLoadError(f"cannot load model {path}: not a model directory (no config.json)")
        return True
    try:
        is_gguf = gguf.is_gguf_file(path)
    except OSError as e:
        raise ModelLoadError(f"cannot load model {path}: {one_line(e)}") from e
    if not is_gguf:
        raise ModelLoadError(f"cannot load model {path}: not a GGUF file or a model directory")
    return False


def check_model(path: PathLike) -> Optional[PretrainedConfig]:
    """Check that `path` can be loaded, without reading weights; return its config (None for a GGUF not yet converted).

    Runs before a run writes anything, so a typo costs a second, not a destroyed run or minutes of
    loading: the path exists, a directory has a readable config.json of a known architecture and a
    tokenizer, a file is a GGUF. Raises ModelLoadError naming the path.
    """
    given = str(path)
    path = _resolve(path)
    if _is_model_dir(path, given):
        load_dir = path
    else:
        load_dir = gguf.converted_dir(path)
        if not os.path.isfile(os.path.join(load_dir, "config.json")):
            return None  # its config and tokenizer come out of the one-time conversion
    try:
        config = transformers.AutoConfig.from_pretrained(load_dir, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"cannot load model {path}: bad config.json ({one_line(e)})") from e
    try:
        AutoTokenizer.from_pretrained(load_dir, local_files_only=True)
    except Exception as e:
        raise ModelLoadError(f"cannot load model {path}: no usable tokenizer ({one_line(e)})") from e
    return config


def check_adapter(adapter: PathLike, base_config: Optional[PretrainedConfig] = None,
                  base_path: Optional[str] = None) -> None:
    """Check a LoRA adapter directory without loading it: its config, its weights file, and (when
    `base_config` is known) that it was trained on this base. Raises ModelLoadError."""
    adapter_path = _resolve(adapter)
    check_adapter_dir(adapter_path, str(adapter))
    if not any(os.path.isfile(os.path.join(adapter_path, name)) for name in ADAPTER_WEIGHTS):
        raise ModelLoadError(f"cannot load adapter {adapter_path}: no weights ({' or '.join(ADAPTER_WEIGHTS)})")
    if base_config is not None:
        check_adapter_base(adapter_path, base_config, base_path)


def check_roles(role_paths: Mapping[str, PathLike],
                role_adapters: Optional[Mapping[str, Optional[PathLike]]] = None) -> None:
    """What `load_roles` would refuse, found without loading a single weight: every base and adapter."""
    configs = {}
    for path in role_paths.values():
        key = _resolve(path)
        if key not in configs:
            configs[key] = check_model(path)
    for role, adapter in (role_adapters or {}).items():
        if adapter is not None:
            key = _resolve(role_paths[role])
            check_adapter(adapter, configs[key], key)


def native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU computes in bf16 natively (AVX512_BF16 or AMX's bf16, read from its flags; False where the
    OS does not say): there a CPU's matmuls run bf16 at once, elsewhere they convert to float32 and back."""
    try:
        flags = Path(cpuinfo).read_text(errors="replace").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _default_dtype(device: torch.device) -> torch.dtype:
    """A load's dtype when none is asked for: bf16 on CUDA (fp16 where the GPU has no bf16), float32 on a CPU (where
    training and the tests' references run)."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def run_dtype(asked: Optional[str] = None, device: Device = None) -> str:
    """The dtype a run's agents load in: `asked` (--dtype), else the device's default (bf16 on CUDA, float32 on a
    CPU). bf16 is not a CPU's default even where it computes it natively, measured faster there (the demo's decode
    steps 12%, its prompts 29%, docs/BENCHMARKS.md issue 59): a CPU's bf16 matmuls round a row differently beside
    other rows, so a seed's records would then hold only at the same --batch-size (tests/test_seeded_records.py
    fails in bf16), where in float32 they hold at any."""
    if asked:
        return asked
    return str(_default_dtype(_pick_device(device))).removeprefix("torch.")


def bf16_hint(info: Mapping[str, Mapping[str, Any]]) -> Optional[str]:
    """One line for a run in float32 on a CPU that computes bf16 natively: --dtype bfloat16 is faster there, and what
    it gives up (run_dtype). None otherwise."""
    if native_bf16() and any(m.get("device") == "cpu" and m.get("precision") == "float32" for m in info.values()):
        return ("this CPU computes bf16 natively: --dtype bfloat16 runs faster (the demo's steps 12%, its prompts "
                "29%), but a seed's records then hold only at the same --batch-size")
    return None


def precision(use_4bit: Optional[bool] = None, device: Device = None,
              dtype: Union[None, str, torch.dtype] = None) -> Dict[str, Any]:
    """How `load_model` will load on this machine, without loading: {"device", "dtype", "quantized",
    "precision"}; `precision` is "nf4" or the dtype (`dtype`, or the device's default). Raises ModelLoadError where
    4-bit is asked for and bitsandbytes cannot quantise here."""
    device = _pick_device(device)
    quantized = _pick_4bit(use_4bit, device)
    dtype = str(_pick_dtype(dtype) or _default_dtype(device)).removeprefix("torch.")
    return {"device": str(device), "dtype": dtype, "quantized": quantized, "precision": "nf4" if quantized else dtype}


def _set_chat_template(tokenizer: PreTrainedTokenizerBase, model: PreTrainedModel) -> None:
    """Give a template-less tokenizer a usable chat template (see FALLBACK/GEMMA_CHAT_TEMPLATE)."""
    if getattr(tokenizer, "chat_template", None):
        return
    vocab = tokenizer.get_vocab()
    if all(token in vocab for token in GEMMA_TURN_TOKENS):
        tokenizer.chat_template = GEMMA_CHAT_TEMPLATE
        # A reply ends with <end_of_turn>, not <eos>: make generate() stop there too.
        end_of_turn = vocab["<end_of_turn>"]
        eos = model.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if end_of_turn not in eos:
            model.generation_config.eos_token_id = eos + [end_of_turn]
        log.debug("tokenizer has no chat template; using Gemma's turn format")
    else:
        tokenizer.chat_template = FALLBACK_CHAT_TEMPLATE
        log.debug("tokenizer has no chat template; using the plain '### Role' fallback")


def _load_settings(device: torch.device, dtype: Optional[torch.dtype], use_4bit: Optional[bool], path: str,
                   device_map: Optional[str] = None) -> Tuple[Dict[str, Any], torch.dtype, bool]:
    """from_pretrained keyword arguments for a device: (kwargs, compute dtype, quantized).

    device_map "auto" (CUDA only): accelerate spreads the layers over every visible GPU, filling them in
    order, and moves the activations between them; the model's first device takes the inputs.
    """
    kwargs: Dict[str, Any] = {"local_files_only": True}
    quantized = _pick_4bit(use_4bit, device)
    if dtype is None:
        dtype = _default_dtype(device)
    if device.type == "cuda":
        kwargs["device_map"] = "auto" if device_map == "auto" else {"": device}
        if use_4bit is None and not quantized:
            log.debug("%s; loading %s in %s instead of 4-bit", _bitsandbytes_problem(device), path, dtype)
    elif quantized:
        kwargs["device_map"] = {"": device}  # bitsandbytes quantises as the weights are placed
    if quantized:
        from transformers import BitsAndBytesConfig

        # QLoRA's settings: NF4 with its block scales quantised too (double quant); matmuls in `dtype`
        # (bf16 on CUDA, float32 on a CPU).
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=True,
        )
    kwargs["dtype"] = dtype
    return kwargs, dtype, quantized


def load_model(path: PathLike, *, use_4bit: Optional[bool] = None, dtype: Union[None, str, torch.dtype] = None,
               device: Device = None, device_map: Optional[str] = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from a local HF directory or a .gguf file.

    `use_4bit`: None -> NF4 (double quant, bf16 compute) on CUDA where bitsandbytes can, else bf16 (fp16
    on GPUs without bf16); float32 on a CPU (a run's agents: `run_dtype`). True -> NF4 on any device (float32
    compute on a CPU), or
    ModelLoadError where bitsandbytes cannot; False -> never NF4. A GGUF is dequantised to its cached HF
    directory first, which is what 4-bit quantises. `dtype` overrides
    the unquantised dtype (or the compute dtype under 4-bit). `device_map="auto"`: on CUDA, one model
    over all visible GPUs (see _load_settings); ignored on a CPU. Raises ModelLoadError.
    """
    given = str(path)
    path = _resolve(path)
    device = _pick_device(device)
    dtype = _pick_dtype(dtype)

    if _is_model_dir(path, given):
        load_dir = path
    else:
        try:
            load_dir = gguf.convert(path)
        except ModelLoadError:
            raise
        except Exception as e:
            raise ModelLoadError(f"cannot load GGUF model {path}: {one_line(e)}") from e

    kwargs, dtype, quantized = _load_settings(device, dtype, use_4bit, path, device_map)
    if quantized and load_dir != path:
        log.debug("%s: quantising its dequantised weights (%s) to NF4", path, load_dir)

    try:
        tokenizer = AutoTokenizer.from_pretrained(load_dir, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(load_dir, **kwargs)
        if "device_map" not in kwargs:
            model.to(device)  # type: ignore[arg-type]  # functools.wraps hides that .to is a method
    except Exception as e:
        raise ModelLoadError(f"cannot load model {path}: {one_line(e)}") from e
    model.eval()

    # Batched generation pads; reusing eos as pad is safe because padded positions are masked out.
    # The embedding matrix is left alone (no new token, no resize).
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    _set_chat_template(tokenizer, model)

    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=path,
        # Spread by device_map "auto": every device the layers went to (an int is a GPU), the inputs' first.
        device=",".join(dict.fromkeys(f"cuda:{d}" if isinstance(d, int) else str(d)
                                      for d in model.hf_device_map.values()))  # type: ignore[operator]  # accelerate's
        if kwargs.get("device_map") == "auto" else str(device),
        dtype=dtype,
        quantized=quantized,
        load_dir=load_dir,
    )


BASE_FILE = "debatecv_base.json"  # written beside an adapter we train: which base it belongs to
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")  # what peft saves, by format


def base_fingerprint(config: PretrainedConfig) -> Dict[str, Any]:
    """What an adapter's shapes depend on; two bases that differ here cannot share an adapter."""
    config = getattr(config, "text_config", None) or config
    return {k: getattr(config, k, None) for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")}


def check_adapter_base(adapter_path: str, config: PretrainedConfig, base_path: Optional[str]) -> None:
    """Refuse an adapter trained on another base, by the fingerprint saved beside it (when there is one)."""
    try:
        with open(os.path.join(adapter_path, BASE_FILE)) as f:
            saved = json.load(f)
    except FileNotFoundError:
        return  # not one of ours; peft still refuses mismatched shapes when loading
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load adapter {adapter_path}: bad {BASE_FILE} ({one_line(e)})") from e
    here = base_fingerprint(config)
    if saved.get("fingerprint") != here:
        def describe(fingerprint):
            return ", ".join(f"{k} {v}" for k, v in (fingerprint or {}).items())

        raise ModelLoadError(
            f"adapter {adapter_path} was trained on another base model: {saved.get('base')} "
            f"({describe(saved.get('fingerprint'))}); this base is {base_path} ({describe(here)})")


def check_adapter_dir(adapter_path: str, given: str) -> None:
    """Refuse (ModelLoadError) a path that is not a PEFT adapter directory with a readable adapter_config.json;
    `given` is the path as the user wrote it, for the message."""
    config_path = os.path.join(adapter_path, "adapter_config.json")
    if not os.path.isdir(adapter_path):
        raise ModelLoadError(f"cannot load adapter {given!r}: not a directory")
    if not os.path.isfile(config_path):
        raise ModelLoadError(f"cannot load adapter {adapter_path}: no adapter_config.json (not a PEFT adapter "
                             "directory, or the training that writes it has not finished)")
    try:
        with open(config_path) as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"cannot load adapter {adapter_path}: bad adapter_config.json ({one_line(e)})") from e
    if not isinstance(config, dict) or "peft_type" not in config:
        raise ModelLoadError(f"cannot load adapter {adapter_path}: adapter_config.json has no peft_type")


@contextlib.contextmanager
def peft_wrap() -> Iterator[None]:
    """Around wrapping a model in peft: peft asks the base `is_gradient_checkpointing`, the name transformers 5.x
    deprecated for `is_activation_checkpointing` (same answer, a FutureWarning on every wrap, not ours to fix).
    Only that one warning, and only around the wrap, is silenced; where the property is gone, peft's getattr
    default applies."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def _attach_adapter(model: Model, adapter_path: str, name: str) -> "PeftModel":
    """Put adapter `name` on `model`; returns the (possibly new) PeftModel wrapping the base."""
    from peft import PeftModel

    try:
        if isinstance(model, PeftModel):
            wrapped = model
            wrapped.load_adapter(adapter_path, adapter_name=name, is_trainable=False)
        else:
            # This injects LoRA layers into the base in place; the base object stays shared.
            with peft_wrap():
                wrapped = PeftModel.from_pretrained(model, adapter_path, adapter_name=name, is_trainable=False)
    except Exception as e:
        raise ModelLoadError(f"cannot load adapter {adapter_path}: {one_line(e)}") from e
    wrapped.eval()
    return wrapped


def load_roles(role_paths: Mapping[str, PathLike], role_adapters: Optional[Mapping[str, Optional[PathLike]]] = None, *,
               use_4bit: Optional[bool] = None, device_map: Optional[str] = None,
               dtype: Union[None, str, torch.dtype] = None) -> Dict[str, RoleModel]:
    """Load the model of every role; a base named by several roles is loaded once and shared.

    role_paths: {role: model path}; role_adapters: {role: LoRA adapter dir or None}. A role with an
    adapter gets it under the adapter name `role` (one adapter dir used by several roles on the same
    base is loaded once, under the first role's name). Returns {role: RoleModel}.
    """
    role_adapters = dict(role_adapters or {})
    unknown = sorted(set(role_adapters) - set(role_paths))
    if unknown:
        raise ValueError(f"adapters given for roles without a model: {', '.join(unknown)}")

    bases = {}  # resolved path -> LoadedModel
    for role, path in role_paths.items():
        key = _resolve(path)
        if key not in bases:
            bases[key] = load_model(path, use_4bit=use_4bit, device_map=device_map, dtype=dtype)

    adapter_names: Dict[Tuple[str, str], str] = {}  # (base path, adapter path) -> adapter name
    adapter_path: Optional[str]
    for role, adapter in role_adapters.items():
        if adapter is None:
            continue
        base = bases[_resolve(role_paths[role])]
        adapter_path = _resolve(adapter)
        if (base.path, adapter_path) in adapter_names:
            continue
        check_adapter_dir(adapter_path, str(adapter))
        check_adapter_base(adapter_path, base.model.config, base.path)
        base.model = _attach_adapter(base.model, adapter_path, role)
        adapter_names[(base.path, adapter_path)] = role

    roles = {}
    for role, path in role_paths.items():
        base = bases[_resolve(path)]
        adapter = role_adapters.get(role)
        adapter_path = None if adapter is None else _resolve(adapter)
        roles[role] = RoleModel(
            model=base.model,
            tokenizer=base.tokenizer,
            path=base.path,
            # adapter_path is a str wherever adapter is one
            adapter=None if adapter is None else adapter_names[(base.path, adapter_path)],  # type: ignore[index]
            loaded=base,
            adapter_path=adapter_path,
        )
    return roles


def _activate(model: "PeftModel", name: str) -> None:
    # Older peft has no inference_mode; without it set_adapter marks the adapter trainable.
    if "inference_mode" in inspect.signature(model.set_adapter).parameters:
        model.set_adapter(name, inference_mode=True)
    else:
        model.set_adapter(name)


@contextlib.contextmanager
def adapter_scope(role_model: RoleModel) -> Iterator[Model]:
    """Make `role_model`'s model behave as that role's model for the duration of the block.

    A role with an adapter: its adapter is active and enabled. A role without one, on a base that
    carries adapters for other roles: all adapters are disabled (plain base). Scopes do not nest;
    call every forward/generate of a shared model inside the scope of the role it is for, since
    outside any scope the base keeps whichever adapter was last activated.
    """
    model: Any = role_model.model  # a PeftModel where any role on this base has an adapter
    if role_model.adapter is not None:
        _activate(model, role_model.adapter)
        yield model
    elif hasattr(model, "disable_adapter") and getattr(model, "peft_config", None):
        # Re-enabling adapters on exit marks them trainable again in peft; put back what was frozen
        # so inference never starts recording gradients for them.
        frozen = [p for p in model.parameters() if not p.requires_grad]
        try:
            with model.disable_adapter():
                yield model
        finally:
            for p in frozen:
                p.requires_grad_(False)
    else:
        yield model


def model_info(role_models: Mapping[str, RoleModel]) -> Dict[str, Dict[str, Any]]:
    """What each role ran on, JSON-ready, for a run's config.json."""
    info = {}
    for role, rm in role_models.items():
        loaded = rm.loaded
        info[role] = {
            "path": rm.path,
            "load_dir": loaded.load_dir,
            "adapter": rm.adapter_path,
            "adapter_name": rm.adapter,
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "quantized": loaded.quantized,
            "precision": "nf4" if loaded.quantized else str(loaded.dtype).removeprefix("torch."),
            "device": loaded.device,
        }
    return info


def precision_line(info: Mapping[str, Mapping[str, Any]]) -> str:
    """model_info's models in one line, roles grouped by model (its path's last part), adapter and precision:
    "Llama-3.1-8B-Instruct nf4 on cuda:0: affirmative, negative; ... + adapter dpo/adapter ...: moderator"."""
    groups: Dict[str, List[str]] = {}
    for role, m in info.items():
        adapter = f" + adapter {_last_parts(m['adapter'], 2)}" if m.get("adapter") else ""
        groups.setdefault(f"{_last_parts(m['path'])}{adapter} {m['precision']} on {m['device']}", []).append(role)
    return "; ".join(f"{how}: {', '.join(roles)}" for how, roles in groups.items())


def _last_parts(path: Any, parts: int = 1) -> str:
    """The last `parts` parts of a path, which name a model where its folders do not ("adapter" alone would not)."""
    return "/".join(os.path.normpath(str(path)).split(os.sep)[-parts:])


def base_models(role_models: Mapping[str, RoleModel]) -> List[Model]:
    """The distinct models the roles run on, each once (roles naming one base share its object)."""
    return list({id(rm.model): rm.model for rm in role_models.values()}.values())


def release_memory() -> None:
    """Give the memory of models no longer referenced back to the device (CUDA caches it otherwise)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
