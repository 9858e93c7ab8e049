"""The GPU memory a debate and a D-DPO step need, computed from a checkpoint's config, and what fits a card.

    python bench/memory_plan.py                                   # Llama-3.1-8B's shape, the defaults below
    python bench/memory_plan.py --config MODEL_DIR/config.json --gpu-gb 40 --context 4096 --lora-r 128
    python bench/memory_plan.py --check-cpu                       # the formula against a measured NF4 step here

Weights: NF4 keeps every decoder projection in 4 bits, one 8-bit block scale per 64 weights and one float32
second-level scale per 256 blocks (double quantisation): 0.5 + 1/64 + 4/16384 bytes a weight. Embeddings,
the LM head and the norms stay bf16. KV cache: 2 (keys, values) x layers x key-value heads x head size x
2 bytes a token; the engine keeps one cache per conversation (DebateCV: the two Debaters and the Moderator)
and gathers the next turn's buffer while the old ones still hold (+1 conversation). A D-DPO step: the NF4
base, the LoRA adapter on every linear layer in float32 with its gradient and AdamW's two moments (16 bytes
a parameter), and with gradient checkpointing one saved hidden state per layer plus one layer's activations
being recomputed; the logits only over the last --target tokens (train/losses.py keeps no more).
Everything is GiB (2**30 bytes), as torch.cuda.max_memory_allocated and bench/bench_dpo_memory.py report.
"""
import argparse
import json
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 2 ** 30
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit code + 8-bit absmax per 64 + fp32 scale per 256 absmax blocks
LLAMA_31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)


def shape(config):
    """The numbers the formulas need, from a config.json's dict (text_config for multimodal configs)."""
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    return dict(vocab=config["vocab_size"], hidden=config["hidden_size"], inter=config["intermediate_size"],
                layers=config["num_hidden_layers"], heads=heads, kv_heads=config.get("num_key_value_heads", heads),
                head_dim=head_dim, tied=config.get("tie_word_embeddings", False))


def linear_shapes(s):
    """(in, out) of every linear layer of one decoder layer: q, k, v, o, gate, up, down."""
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    h, i = s["hidden"], s["inter"]
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def weights_bytes(s, nf4=True, dtype_bytes=2):
    """(quantised part, the rest) in bytes: decoder projections, then embeddings, LM head and norms."""
    linear = s["layers"] * sum(a * b for a, b in linear_shapes(s))
    rest = s["vocab"] * s["hidden"] * (1 if s["tied"] else 2) + (2 * s["layers"] + 1) * s["hidden"]
    return linear * (NF4_BYTES if nf4 else dtype_bytes), rest * dtype_bytes


def kv_bytes_per_token(s, dtype_bytes=2):
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * dtype_bytes


def debate_gib(s, batch, context, conversations=3, nf4=True):
    """(weights, KV cache, prefill activations) in GiB for `batch` claims of `context` tokens each."""
    quantised, rest = weights_bytes(s, nf4)
    kv = batch * (conversations + 1) * context * kv_bytes_per_token(s)
    # A prefill of one turn's new tokens (at most the context) for the whole batch: the MLP's three
    # intermediate-size tensors dominate; logits only for the last position.
    prefill = batch * context * (3 * s["inter"] + 4 * s["hidden"]) * 2 + batch * s["vocab"] * 4
    return (quantised + rest) / GIB, kv / GIB, prefill / GIB


def lora_params(s, r):
    return s["layers"] * sum((a + b) * r for a, b in linear_shapes(s))


def dpo_step_gib(s, r, length, micro_batch=1, target=256, checkpointing=True, nf4=True, act_bytes=2):
    """{part: GiB} of one D-DPO optimizer step; chosen and rejected rows of `length` tokens each."""
    quantised, rest = weights_bytes(s, nf4, dtype_bytes=2 if act_bytes == 2 else act_bytes)
    tokens = 2 * micro_batch * length
    per_layer = tokens * (4 * s["hidden"] + 2 * s["kv_heads"] * s["head_dim"] + 3 * s["inter"]) * act_bytes
    saved = tokens * s["hidden"] * act_bytes * s["layers"] if checkpointing else per_layer * s["layers"]
    return {"weights": (quantised + rest) / GIB,
            "lora + grads + AdamW": lora_params(s, r) * 16 / GIB,
            "activations": (saved + (per_layer if checkpointing else 0)) / GIB,
            # float32 logits, their log-softmax and its gradient over the target tokens
            "logits": 2 * micro_batch * (target + 1) * s["vocab"] * 4 * 3 / GIB}


def fits(gpu_gib, s, context, conversations, nf4):
    """The largest batch whose debate fits `gpu_gib` (0: not even one claim)."""
    batch = 0
    while sum(debate_gib(s, batch + 1, context, conversations, nf4)) <= gpu_gib and batch < 4096:
        batch += 1
    return batch


def table(s, args):
    lines = [f"| | weights | KV cache | prefill | total | fits {args.gpu_gb:g} GB? |", "|---|---:|---:|---:|---:|---|"]
    for nf4 in (True, False):
        w, kv, pre = debate_gib(s, args.batch_size, args.context, args.conversations, nf4)
        total = w + kv + pre
        lines.append(f"| debate, {'NF4' if nf4 else 'bf16'}, batch {args.batch_size} x {args.context} tokens | "
                     f"{w:.1f} | {kv:.1f} | {pre:.1f} | {total:.1f} | {'yes' if total <= args.gpu_gb else 'no'}, "
                     f"batch <= {fits(args.gpu_gb, s, args.context, args.conversations, nf4)} fits |")
    for nf4 in (True, False):
        parts = dpo_step_gib(s, args.lora_r, args.length, args.micro_batch, args.target, args.checkpointing, nf4)
        total = sum(parts.values())
        lines.append(f"| D-DPO step, {'NF4' if nf4 else 'bf16'} base, LoRA r {args.lora_r}, 2 x {args.length} "
                     f"tokens | {parts['weights']:.1f} | - | {total - parts['weights']:.1f} (LoRA+Adam "
                     f"{parts['lora + grads + AdamW']:.1f}, activations {parts['activations']:.1f}, logits "
                     f"{parts['logits']:.1f}) | {total:.1f} | {'yes' if total <= args.gpu_gb else 'no'} |")
    return "\n".join(lines)


# --- the check on this machine: a tiny NF4 D-DPO step, through the project's own loader --------------------

CHECK_SHAPE = dict(vocab_size=4096, hidden_size=512, intermediate_size=1792, num_hidden_layers=4,
                   num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False,
                   max_position_embeddings=4096)


def _measure(model_dir, r, length, target):
    """In a fresh process: load NF4 through train.lora, then one D-DPO step; the resident-set high-water mark
    before and after the step (ru_maxrss: the step's own transient peak is the difference) and the weights'
    footprint. Printed as JSON."""
    import torch

    from train import lora, losses

    torch.manual_seed(0)
    model, _, loaded = lora.load_trainable(model_dir, r=r, alpha=2 * r, use_4bit=True, dropout=0.0)
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
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    loss, _, _ = losses.dpo_step_loss(model, batch, beta=0.1)
    loss.backward()
    optimizer.step()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
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
    run = subprocess.run([sys.executable, __file__, "--_measure", str(out), str(r), str(length), str(target)],
                         capture_output=True, text=True, check=True)
    measured = json.loads(run.stdout.strip().splitlines()[-1])
    s = shape(CHECK_SHAPE)
    # On a CPU the NF4 base computes in float32 (models.load_model): 4-byte activations, float32 embeddings.
    quantised, rest = weights_bytes(s, True, dtype_bytes=4)
    parts = dpo_step_gib(s, r, length, 1, target, True, True, act_bytes=4)
    step = sum(v for k, v in parts.items() if k != "weights") * GIB
    print(f"check on this CPU ({json.dumps(CHECK_SHAPE)}; LoRA r {r}, 2 x {length} tokens, target {target}):")
    print(f"  weights: formula {(quantised + rest) / 2**20:.2f} MiB (NF4 part {quantised / 2**20:.2f}), measured "
          "(parameters' and block scales' bytes) "
          f"{measured['weights_bytes'] / 2**20:.2f} MiB")
    print(f"  one D-DPO step above the loaded model: formula {step / 2**20:.1f} MiB, measured (ru_maxrss rise) "
          f"{measured['step_peak_bytes'] / 2**20:.1f} MiB")


def build_parser():
    """The script's flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="a checkpoint's config.json (default: Llama-3.1-8B's shape)")
    p.add_argument("--gpu-gb", type=float, default=40, help="the card's memory in GiB")
    p.add_argument("--batch-size", type=int, default=8, help="claims debated together (run_debate.py's default)")
    p.add_argument("--context", type=int, default=4096, help="tokens of each conversation at its longest")
    p.add_argument("--conversations", type=int, default=3, help="caches kept per claim (DebateCV: 3)")
    p.add_argument("--lora-r", type=int, default=128)
    p.add_argument("--length", type=int, default=4096, help="D-DPO: tokens of chosen and of rejected")
    p.add_argument("--target", type=int, default=256, help="D-DPO: reply tokens at the end of each")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--no-gradient-checkpointing", dest="checkpointing", action="store_false")
    p.add_argument("--check-cpu", action="store_true", help="also measure a small NF4 D-DPO step on this CPU")
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    return p


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--_measure":
        return _measure(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    p = build_parser()
    args = p.parse_args()
    config = json.loads(Path(args.config).read_text()) if args.config else LLAMA_31_8B
    s = shape(config)
    print(f"{args.config or 'Llama-3.1-8B'}: {s['layers']} layers, hidden {s['hidden']}, vocabulary {s['vocab']}; "
          f"KV cache {kv_bytes_per_token(s) / 1024:.0f} KiB a token; LoRA r {args.lora_r}: "
          f"{lora_params(s, args.lora_r) / 1e6:.0f}M parameters")
    print(table(s, args))
    if args.check_cpu:
        check_cpu(args)


if __name__ == "__main__":
    main()
