"""What the tests and the benchmarks share: tiny random-weight models built locally in a second (no hub
access needed), and where the shared AVeriTeC data is.

`build_tiny_llama(dir)` writes a complete Hugging Face checkpoint (config, float32 safetensors,
generation config, a byte-level BPE tokenizer with a Llama-3-like chat template) that
`AutoModelForCausalLM` / `AutoTokenizer` and `debate.engine.models.load_model` open like any real model.
The same seed gives the same tokenizer and the same weights, so tests in different files can
compare outputs across builds.
"""
import os
import re
from pathlib import Path

import torch

# Sentences the BPE merges are learnt from. Debate-flavoured so that prompts in tests tokenize
# into a reasonable number of tokens; any other text still works (byte-level alphabet, no <unk>).
_CORPUS = [
    "The claim is supported by the evidence.",
    "The claim is refuted by the evidence.",
    "There is not enough evidence to verify the claim.",
    "The evidence is conflicting and the claim is cherry-picking.",
    "Affirmative debater: I argue the claim is true, citing the source.",
    "Negative debater: I argue the claim is false, citing the source.",
    "Moderator: both sides repeat themselves, so the debate ends with a verdict.",
    '{"Verdict": "Supported", "Proceeding Necessity": "No", "Justification for Verdict": ""}',
    "Question: who said it? Answer: the minister said it in a speech on the news.",
]

BOS = "<|begin_of_text|>"
EOT = "<|eot_id|>"  # end of a turn; the eos token, so generation stops at the end of a reply
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", EOT, PAD]

# Llama-3-like: every turn is a role header followed by its content and <|eot_id|>.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)


# Gemma's turn format (debate.engine.models.GEMMA_CHAT_TEMPLATE renders it): no system role, the assistant is "model".
GEMMA_SPECIAL_TOKENS = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>"]


def build_tiny_tokenizer(vocab_size=512, gemma=False):
    """A byte-level BPE tokenizer (PreTrainedTokenizerFast) with bos/eos/pad and the chat template
    (Llama-3-like; with `gemma`, Gemma's tokens and turn format)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=GEMMA_SPECIAL_TOKENS if gemma else SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(_CORPUS, trainer=trainer)
    if gemma:
        from debate.engine.models import GEMMA_CHAT_TEMPLATE

        tok = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<bos>", eos_token="<end_of_turn>",
                                      pad_token="<pad>", clean_up_tokenization_spaces=False)
        tok.chat_template = GEMMA_CHAT_TEMPLATE
        return tok
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=BOS, eos_token=EOT, pad_token=PAD, clean_up_tokenization_spaces=False
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_llama(dir, seed=0, **overrides):
    """Write a tiny random LlamaForCausalLM checkpoint (float32) plus tokenizer to `dir`; return `dir`.

    `overrides` go to LlamaConfig (e.g. num_hidden_layers=1, max_position_embeddings=512).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(dir, exist_ok=True)
    tok = build_tiny_tokenizer()
    settings = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,  # room for the courtroom's long contexts (engine.window)
        # Larger than the usual 0.02 so logits are peaked: greedy choices then have clear margins and
        # do not flip on float noise when tests compare cached against uncached decoding.
        initializer_range=0.2,
        tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    settings.update(overrides)
    return _save_random(LlamaForCausalLM, LlamaConfig(**settings), tok, dir, seed)


def build_tiny_gemma(dir, seed=0, **overrides):
    """Write a tiny random Gemma 3 text checkpoint (float32) plus a Gemma-format tokenizer to `dir`.

    Two sliding-window layers (window 16 tokens, far shorter than a debate turn's context) and one
    full-attention layer, Gemma 3's mix: what the engine's batch layout must not disturb.
    """
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    os.makedirs(dir, exist_ok=True)
    tok = build_tiny_tokenizer(gemma=True)
    settings = dict(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16,
        sliding_window=16, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        max_position_embeddings=32768, initializer_range=0.1,  # varied, peaked logits (0.2 repeats a token)
        tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
    )
    settings.update(overrides)
    return _save_random(Gemma3ForCausalLM, Gemma3TextConfig(**settings), tok, dir, seed)


def _save_random(model_class, config, tok, dir, seed):
    """Random float32 weights of `config` (seeded), saved with `tok` to `dir`; returns `dir`."""
    from transformers import GenerationConfig

    # Fork the RNG so building a model does not disturb the caller's random state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    model.eval()
    model.save_pretrained(dir)
    tok.save_pretrained(dir)
    return dir


def build_random_lora(model_dir, out_dir, seed=1):
    """Save a LoRA adapter for `model_dir` whose B matrices are random, so it really changes outputs."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from debate.engine.models import peft_wrap

    base = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    with peft_wrap():
        peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    peft_model.save_pretrained(out_dir)
    return out_dir


def needs_wordnet():
    """The METEOR scores need WordNet: skip the rest of a test without it on a developer's machine (missing)."""
    from eval import wordnet

    try:
        wordnet.load_wordnet()
    except wordnet.WordNetMissingError as err:
        missing(str(err))


def missing(reason, shared_data=False):
    """A test's outside resource (shared data, WordNet) is absent: skip on a developer's machine; fail in CI,
    where .ci/run installs WordNet and shared/ is beside the clone. The reason names the test (pytest would show this
    helper's line as the skip's place) and, for shared data, the variable that points at it."""
    import pytest  # only the tests call this; the benchmarks and the package do not need pytest

    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    if shared_data and "DEBATECV_SHARED_DATA" not in reason:
        reason += "; set DEBATECV_SHARED_DATA to the shared data folder (or put shared/ beside the checkout)"
    if test:
        reason = f"{test}: {reason}"
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (CI must have it)")
    pytest.skip(reason)


def averitec_dir():
    """The shared AVeriTeC folder: $DEBATECV_SHARED_DATA (the data folder or its averitec/), else
    ../shared/data beside the checkout."""
    env = os.environ.get("DEBATECV_SHARED_DATA")
    base = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"
    return base if (base / "dev.json").is_file() else base / "averitec"


def shared_dir(dataset):
    """The shared folder of one dataset (check-covid, healthver, politihop, proclaim): beside averitec_dir()'s."""
    return averitec_dir().parent / dataset


def bench_claims(n, condition="golden"):
    """The benchmarks' claims: the first `n` of AVeriTeC dev with `condition`'s evidence (golden, or
    retrieved: the shared dev.retrieved.hero.jsonl), else the demo claims repeated under new ids; and the
    words saying which."""
    from debate.data import averitec, claims as data

    shared = averitec_dir()
    if (shared / "dev.json").is_file():
        claims = averitec.load_split("dev", shared)[:n]
        if len(claims) >= n:
            retrieved = shared / "dev.retrieved.hero.jsonl" if condition == "retrieved" else None
            return data.attach_evidence(claims, condition, retrieved), f"AVeriTeC dev, {condition} evidence"
    demo = data.attach_evidence(averitec.load_split("demo"), "golden")
    return [dict(demo[k % len(demo)], claim_id=k) for k in range(n)], "the demo claims, repeated"


def claim_pages(claim):
    """An AVeriTeC claim's own pages in its knowledge store's layout, for the tests' and bench/'s stores: one per
    substantive golden answer (its sentences), and one of the gold justification."""
    def sentences(text):
        return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]

    pages = []
    for q in claim["questions"]:
        for a in q.get("answers") or []:
            if a.get("answer_type") != "Unanswerable" and len(a["answer"].split()) > 3:
                pages.append({"url": a.get("source_url") or "https://example.org/answer", "type": "web",
                              "query": q["question"], "url2text": sentences(a["answer"])})
    if claim.get("justification"):
        pages.append({"url": "https://example.org/justification", "url2text": sentences(claim["justification"])})
    return pages


def build_wide_llama(dir, seed=0, **overrides):
    """A tiny Llama whose cache is large for its compute: eight 64-wide heads, each with its own keys and values
    (8 KiB of cache a token over its two layers), so a few claims' caches reach the tens of MiB a small budget is
    set against while the model stays quick on a CPU."""
    settings = dict(hidden_size=512, intermediate_size=256, num_hidden_layers=2, num_attention_heads=8,
                    num_key_value_heads=8, initializer_range=0.08)
    settings.update(overrides)
    return build_tiny_llama(dir, seed=seed, **settings)


def cpu_budget(nbytes):
    """A context manager: the CPU pool's memory budget set to `nbytes` (None: none) while it is open, its counts
    started afresh; yields the pool (debate.engine.kv_pool)."""
    import contextlib

    from debate.engine import kv_pool

    @contextlib.contextmanager
    def scope():
        pool = kv_pool.pool_for("cpu")
        before = pool.budget, pool.source
        kv_pool.configure("cpu", nbytes, "test")
        try:
            yield pool
        finally:
            pool.budget, pool.source = before

    return scope()
