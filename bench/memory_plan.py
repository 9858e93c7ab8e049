"""The GPU memory a debate and a D-DPO step need, computed from a checkpoint's config, and what fits a card.

    python bench/memory_plan.py                                   # Llama-3.1-8B's shape, the defaults below
    python bench/memory_plan.py --config MODEL_DIR/config.json --gpu-gb 40 --context 4096 --lora-r 128
    python bench/memory_plan.py --check-cpu                       # the formula against a measured NF4 step here
    python bench/memory_plan.py --turn-tokens 192 --rounds 3      # claims in flight on 40 and 80 GB at 192-token turns
    python bench/memory_plan.py --docs                            # docs/gpus.md's table of claims in flight, as it is

The arithmetic is debate/engine/memory.py's, the same the engine's memory authority plans with; its docstring
says what each term counts. Weights: NF4 keeps every decoder projection in 4 bits, one 8-bit block scale
per 64 weights and one float32 second-level scale per 256 blocks (0.5 + 1/64 + 4/16384 bytes a weight);
embeddings, LM head and norms stay bf16. KV cache: one cache per conversation (DebateCV: the two Debaters
and the Moderator) and the next turn's buffer gathered while the old ones still hold (+1 conversation).
The model call: a whole-context prefill of the batch, and a structured decode step with one choice scored
(a trie of --trie-tokens tokens over the row's cache). A D-DPO step: the LoRA adapter in float32 with its
gradient and AdamW's two moments, gradient checkpointing, LoRA dropout's copies and masks at --lora-dropout,
the dequantised NF4 projection, the logits over the last --target tokens; on CUDA the attention is a fused
kernel (sdpa's; no scores kept), as it is on a CPU.
"Fits" is against the card's usable memory: its reported capacity less the CUDA context (usable_gib).

Claims in flight (in_flight_table): the run's budget on a card as the engine decides it (debate/engine/kv_pool.py:
--gpu-memory-fraction 0.9 of the capacity less the weights and the CUDA context), and the most claims whose
caches it holds all at once (debate.engine.memory.claims_in_flight: the budget split as the memory authority splits
it, memory.kv_plan, into a reserve, a decode place of 32 slots and a page arena; each claim decodes one conversation
in a slot and keeps its others in pages). A DebateCV claim's longest conversation, from its turn length and rounds: the
evidence and the meta prompt, then each round both arguments and the Moderator's reply (3 turns and the round's
prompt), then the final prompt's two arguments and the verdict (debatecv_context). More claims than fit still run:
the scheduler admits fewer at once and the engine drops the newest caches and re-encodes them later.
Everything is GiB (2**30 bytes), as torch.cuda.max_memory_allocated and bench/bench_dpo_memory.py report.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from debate.engine import memory  # noqa: E402
from debate.engine.memory import GIB, shape  # noqa: E402

# The card's usable bytes: an A100 40GB reports 42,405,855,232 bytes of global memory to CUDA (deviceQuery), and
# the CUDA context (driver, torch's kernels, cuBLAS workspace) takes about 0.5 GiB of it before any tensor.
CARDS = {40: 42_405_855_232}
CUDA_CONTEXT_GIB = 0.5
LLAMA_31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
                   max_position_embeddings=131072)
# The largest choice trie of the project's schemas is the labels' (a few tokens a label, plus the closing
# quote); 64 distinct tokens is a generous bound for any label set, and the pass is a few MiB per token.
TRIE_TOKENS = 64


# A DebateCV conversation besides its turns: the meta prompt with the evidence (HerO's retrieved evidence on AVeriTeC
# dev runs to about 1,500 tokens under Llama-3's tokenizer), and each round's prompt text around the arguments.
EVIDENCE_TOKENS = 1500
META_TOKENS = 400
ROUND_PROMPT_TOKENS = 200
FRACTION = 0.9  # --gpu-memory-fraction's default
CARD_GB = (40, 80)


def debatecv_context(turn, rounds, evidence=EVIDENCE_TOKENS):
    """The longest DebateCV conversation (the Moderator's, by the final prompt) in tokens."""
    return evidence + META_TOKENS + rounds * (3 * turn + ROUND_PROMPT_TOKENS) + 3 * turn + ROUND_PROMPT_TOKENS


def card_budget(gpu_gb, s, nf4):
    """The engine's budget on such a card: FRACTION of its capacity less the weights and the CUDA context."""
    quantised, rest = memory.weights_bytes(s, nf4)
    return int(FRACTION * CARDS.get(gpu_gb, gpu_gb * GIB) - quantised - rest - CUDA_CONTEXT_GIB * GIB)


def in_flight_table(s, args, window=None):
    """Claims in flight per card, and where the model's `window` is given, beside it what the engine kept before
    issue 53 (its reserve planned for the whole window with a turn's new tokens, not for the rows' widest slot)."""
    context = debatecv_context(args.turn_tokens, args.rounds, args.evidence_tokens)
    lines = [f"DebateCV, {args.rounds} rounds + final, {args.turn_tokens}-token turns, {args.evidence_tokens} tokens "
             f"of evidence: a claim's longest conversation {context:,} tokens, its {args.conversations} caches "
             f"{args.conversations * context * memory.kv_bytes_per_token(s) / GIB:.2f} GiB at most",
             "| card | weights | budget (0.9 of the card less weights and CUDA context) | claims in flight, all caches "
             "kept |" + (f" with the reserve for the {window:,}-token window (before issue 53) |" if window else ""),
             "|---|---|---:|---:|" + ("---:|" if window else "")]
    for gpu_gb in CARD_GB:
        for nf4 in (True, False):
            budget = card_budget(gpu_gb, s, nf4)
            n = memory.claims_in_flight(s, 2, budget, args.conversations, context, args.turn_tokens,
                                        trie=args.trie_tokens)
            line = f"| {gpu_gb} GB | {'NF4' if nf4 else 'bf16'} | {max(budget, 0) / GIB:.1f} GiB | {n} |"
            if window:
                whole = min(window + args.turn_tokens + args.trie_tokens,
                            max(budget, 0) // memory.kv_bytes_per_token(s))
                line += f" {memory.claims_in_flight(s, 2, budget, args.conversations, context, args.turn_tokens, trie=args.trie_tokens, reserve_width=whole)} |"  # noqa: E501
            lines.append(line)
    return "\n".join(lines)


DOCS_TURNS = (512, 192)  # docs/gpus.md's columns: the DebateCV paper's turn length, and a shorter one


def docs_table(s, rounds=3, evidence=EVIDENCE_TOKENS, conversations=3, trie=TRIE_TOKENS, turns=DOCS_TURNS):
    """docs/gpus.md's table of claims in flight, the docs' one source of the figure (tests/test_docs.py checks the page
    against it): per card and precision the budget, and the claims whose caches it keeps at each turn length."""
    head = "| card | weights | budget | " + " | ".join(
        f"claims in flight, {t}-token turns" if i == 0 else f"{t}-token turns" for i, t in enumerate(turns)) + " |"
    lines = [head, "|---|---|---:|" + "---:|" * len(turns)]
    for gpu_gb in CARD_GB:
        for nf4 in (True, False):
            budget = card_budget(gpu_gb, s, nf4)
            counts = [memory.claims_in_flight(s, 2, budget, conversations, debatecv_context(t, rounds, evidence), t,
                                              trie=trie) for t in turns]
            lines.append(f"| {gpu_gb} GB | {'NF4' if nf4 else 'bf16'} | {max(budget, 0) / GIB:.1f} GiB | "
                         + " | ".join(str(n) for n in counts) + " |")
    return "\n".join(lines)


def usable_gib(gpu_gb):
    """What a card advertised as `gpu_gb` GB lends to tensors: its reported capacity (where known, else gpu_gb
    GiB) less the CUDA context."""
    return CARDS.get(gpu_gb, gpu_gb * GIB) / GIB - CUDA_CONTEXT_GIB


def debate_gib(s, batch, context, conversations=3, nf4=True, trie=TRIE_TOKENS):
    """(weights, KV cache, the largest model call's transients) in GiB for `batch` claims of `context` tokens:
    a whole-context prefill and a structured decode step with one choice pass (debate.engine.memory)."""
    quantised, rest = memory.weights_bytes(s, nf4)
    kv = batch * (conversations + 1) * context * memory.kv_bytes_per_token(s)
    # The turn being gathered: its buffer is the +1 conversation above; the call's transients on top.
    call = memory.batch_bytes(s, 2, batch, 0, context, 0, batch, trie, fused=True) - batch * context * \
        memory.kv_bytes_per_token(s)
    return (quantised + rest) / GIB, kv / GIB, call / GIB


def dpo_step_gib(s, r, length, micro_batch=1, target=256, checkpointing=True, nf4=True, act_bytes=2,
                 dropout=0.05, fused_attention=True):
    """{part: GiB} of one D-DPO optimizer step, the weights included (debate.engine.memory.train_step_bytes)."""
    quantised, rest = memory.weights_bytes(s, nf4, dtype_bytes=act_bytes)
    parts = memory.train_step_bytes(s, r, length, micro_batch, target, checkpointing, nf4, act_bytes, dropout,
                                    fused_attention)
    return {"weights": (quantised + rest) / GIB, **{k: v / GIB for k, v in parts.items()}}


def fits(gpu_gib, s, context, conversations, nf4, trie):
    """The largest batch whose debate fits `gpu_gib` (0: not even one claim)."""
    batch = 0
    while sum(debate_gib(s, batch + 1, context, conversations, nf4, trie)) <= gpu_gib and batch < 4096:
        batch += 1
    return batch


def table(s, args):
    usable = usable_gib(args.gpu_gb)
    lines = [f"| | weights | KV cache | model call | total | fits {args.gpu_gb:g} GB ({usable:.1f} GiB usable)? |",
             "|---|---:|---:|---:|---:|---|"]
    for nf4 in (True, False):
        w, kv, call = debate_gib(s, args.batch_size, args.context, args.conversations, nf4, args.trie_tokens)
        total = w + kv + call
        lines.append(f"| debate, {'NF4' if nf4 else 'bf16'}, batch {args.batch_size} x {args.context} tokens | "
                     f"{w:.1f} | {kv:.1f} | {call:.1f} | {total:.1f} | {'yes' if total <= usable else 'no'}, "
                     f"batch <= {fits(usable, s, args.context, args.conversations, nf4, args.trie_tokens)} fits |")
    for nf4 in (True, False):
        parts = dpo_step_gib(s, args.lora_r, args.length, args.micro_batch, args.target, args.checkpointing, nf4,
                             dropout=args.lora_dropout)
        total = sum(parts.values())
        lines.append(f"| D-DPO step, {'NF4' if nf4 else 'bf16'} base, LoRA r {args.lora_r}, 2 x {args.length} "
                     f"tokens, dropout {args.lora_dropout:g} | {parts['weights']:.1f} | - | "
                     f"{total - parts['weights']:.1f} (LoRA+Adam {parts['lora + grads + AdamW']:.1f}, activations "
                     f"{parts['activations']:.1f}, LoRA dropout {parts['lora dropout']:.1f}, dequantised "
                     f"{parts['dequantised']:.1f}, logits {parts['logits']:.1f}) | {total:.1f} | "
                     f"{'yes' if total <= usable else 'no'} |")
    one = memory.choice_pass_bytes(s, args.trie_tokens, args.context, 2, fused=True) / 2**20
    lines.append(f"\nOne choice scored over a {args.context}-token context, a trie of {args.trie_tokens} tokens: "
                 f"{one:.0f} MiB (in the model call above). Usable: the card's reported capacity less "
                 f"{CUDA_CONTEXT_GIB} GiB of CUDA context.")
    return "\n".join(lines)


# --- the check on this machine: a tiny NF4 D-DPO step, through the project's own loader --------------------

CHECK_SHAPE = dict(vocab_size=4096, hidden_size=512, intermediate_size=1792, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
                   max_position_embeddings=4096)


def resident_bytes():
    """The process's resident set now (Linux: /proc/self/statm)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def _measure(model_dir, r, length, target):
    """In a fresh process: load NF4 through train.lora at its default LoRA dropout, then one D-DPO step; the
    resident set before the step and its high-water mark after (VmHWM: the step's peak above its start is
    the difference) and the weights' footprint. Printed as JSON."""
    import torch

    from train import lora, losses

    torch.manual_seed(0)
    model, _, loaded = lora.load_trainable(model_dir, r=r, alpha=2 * r, use_4bit=True)
    assert loaded.quantized
    import bitsandbytes as bnb

    size = lambda t: t.numel() * t.element_size()  # noqa: E731
    weights = sum(size(p) for n, p in model.named_parameters() if "lora_" not in n)
    for layer in model.modules():  # the NF4 block scales live beside the packed weights, not as parameters
        if isinstance(layer, bnb.nn.Linear4bit):
            state = layer.weight.quant_state
            weights += size(state.absmax) + (size(state.state2.absmax) if state.nested else 0)
    ids = lambda: torch.randint(0, CHECK_SHAPE["vocab_size"], (length,)).tolist()  # noqa: E731
    rows = [{"input_ids": x, "labels": [-100] * (length - target) + x[-target:]} for x in (ids(), ids())]
    batch = losses.collate(rows, 0, "cpu")
    batch["ref"] = torch.zeros(1, 2)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    model.train()
    Path("/proc/self/clear_refs").write_text("5")
    before = resident_bytes()
    loss, _, _ = losses.dpo_step_loss(model, batch, beta=0.1)
    loss.backward()
    optimizer.step()
    # This process's own high-water mark (VmHWM), restarted just before the step; ru_maxrss would carry the
    # parent's resident set in through fork and exec.
    after = int(Path("/proc/self/status").read_text().split("VmHWM:")[1].split()[0]) * 1024
    print(json.dumps({"weights_bytes": weights, "step_peak_bytes": after - before}))


def check_cpu(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tiny_models import build_tiny_tokenizer

    out = Path(args.cache) / f"memory-plan-check-{CHECK_SHAPE['vocab_size']}x{CHECK_SHAPE['hidden_size']}"
    if not (out / "config.json").exists():
        import torch

        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**CHECK_SHAPE)).save_pretrained(out)
        build_tiny_tokenizer().save_pretrained(out)
    r, length, target = 16, 1024, 128
    # Freed memory goes back to the system at once (every block above 64 KiB its own mapping), so the
    # resident set follows the live tensors instead of what glibc's heap keeps.
    run = subprocess.run([sys.executable, __file__, "--_measure", str(out), str(r), str(length), str(target)],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    s = shape(CHECK_SHAPE)
    # On a CPU the NF4 base computes in float32 (models.load_model): 4-byte activations, float32 embeddings.
    quantised, rest = memory.weights_bytes(s, True, dtype_bytes=4)
    parts = dpo_step_gib(s, r, length, 1, target, True, True, act_bytes=4)  # sdpa: fused on a CPU too
    step = sum(v for k, v in parts.items() if k != "weights") * GIB
    print(f"check on this CPU ({json.dumps(CHECK_SHAPE)}; LoRA r {r}, dropout 0.05, 2 x {length} tokens, "
          f"target {target}):")
    print(f"  weights: formula {(quantised + rest) / 2**20:.2f} MiB (NF4 part {quantised / 2**20:.2f}), measured "
          "(parameters' and block scales' bytes) "
          f"{measured['weights_bytes'] / 2**20:.2f} MiB")
    print(f"  one D-DPO step above the loaded model: formula {step / 2**20:.1f} MiB, measured (VmHWM after "
          "less the resident set before) "
          f"{measured['step_peak_bytes'] / 2**20:.1f} MiB")


def build_parser():
    """The script's flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="a checkpoint's config.json (default: Llama-3.1-8B's shape)")
    p.add_argument("--gpu-gb", type=float, default=40, help="the card's advertised memory in GB (usable_gib)")
    p.add_argument("--batch-size", type=int, default=8, help="claims debated together (run_debate.py's default)")
    p.add_argument("--context", type=int, default=4096, help="tokens of each conversation at its longest")
    p.add_argument("--conversations", type=int, default=3, help="caches kept per claim (DebateCV: 3)")
    p.add_argument("--lora-r", type=int, default=128)
    p.add_argument("--length", type=int, default=4096, help="D-DPO: tokens of chosen and of rejected")
    p.add_argument("--target", type=int, default=256, help="D-DPO: reply tokens at the end of each")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--lora-dropout", type=float, default=0.05, help="D-DPO: LoRA dropout (train_moderator's default)")
    p.add_argument("--turn-tokens", type=int, default=512, help="claims in flight: --max-new-tokens of the run "
                   "(the DebateCV paper's 512)")
    p.add_argument("--rounds", type=int, default=3, help="claims in flight: debate rounds before the final prompt")
    p.add_argument("--evidence-tokens", type=int, default=EVIDENCE_TOKENS,
                   help="claims in flight: tokens of a claim's evidence in its meta prompts")
    p.add_argument("--trie-tokens", type=int, default=TRIE_TOKENS,
                   help="distinct tokens of the largest choice's candidates (its token trie)")
    p.add_argument("--no-gradient-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--check-cpu", action="store_true", help="also measure a small NF4 D-DPO step on this CPU")
    p.add_argument("--docs", action="store_true", help="print docs/gpus.md's table of claims in flight (Llama-3.1-8B "
                   "or --config, --rounds, --evidence-tokens; 512- and 192-token turns) and nothing else")
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    return p


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--_measure":
        return _measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    p = build_parser()
    args = p.parse_args()
    config = json.loads(Path(args.config).read_text()) if args.config else LLAMA_31_8B
    s = shape(config)
    if args.docs:
        return print(docs_table(s, args.rounds, args.evidence_tokens, args.conversations, args.trie_tokens))
    print(f"{args.config or 'Llama-3.1-8B'}: {s['layers']} layers, hidden {s['hidden']}, vocabulary {s['vocab']}; "
          f"KV cache {memory.kv_bytes_per_token(s) / 1024:.0f} KiB a token; LoRA r {args.lora_r}: "
          f"{memory.lora_params(s, args.lora_r) / 1e6:.0f}M parameters")
    print(table(s, args))
    print()
    print(in_flight_table(s, args, config.get("max_position_embeddings")))
    if args.check_cpu:
        check_cpu(args)


if __name__ == "__main__":
    main()
