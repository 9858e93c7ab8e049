"""Peak memory and tokens/s of one D-DPO optimizer step on a random-weight model of a real shape.

    python bench/bench_dpo_memory.py --shape llama-3.1-8b --length 4096     # on a GPU: 4-bit base, LoRA r 128
    python bench/bench_dpo_memory.py --shape tiny --length 512               # CPU smoke run of the same path

The random checkpoint is written once to --cache (bf16; 16 GB for the 8B shape) and loaded through
the same code as training (`train.lora.load_trainable`: NF4 base, on a CPU too, gradient checkpointing).
A pair is chosen + rejected of --length tokens each, of which the last --target tokens are the reply.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.tiny_models import build_tiny_tokenizer  # noqa: E402
from train import lora, losses  # noqa: E402

SHAPES = {
    "llama-3.1-8b": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                         rope_theta=500000.0, tie_word_embeddings=False),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=False),
}


def random_checkpoint(shape, cache):
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(cache) / f"random-{shape}"
    if (out / "config.json").exists():
        return str(out)
    config = LlamaConfig(**SHAPES[shape])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    build_tiny_tokenizer().save_pretrained(out)
    del model
    return str(out)


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--target", type=int, default=256)
    p.add_argument("--lora-r", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cache", default=str(Path.home() / ".cache/debatecv/bench"))
    return p


def main():
    p = build_parser()
    args = p.parse_args()

    path = random_checkpoint(args.shape, args.cache)
    model, tokenizer, loaded = lora.load_trainable(path, r=args.lora_r, alpha=2 * args.lora_r, use_4bit=True,
                                                   gradient_checkpointing=True)
    device = next(p for p in model.parameters()).device
    vocab = SHAPES[args.shape]["vocab_size"]
    generator = torch.Generator().manual_seed(0)

    def side():
        ids = torch.randint(0, vocab, (args.length,), generator=generator).tolist()
        return {"input_ids": ids, "labels": [-100] * (args.length - args.target) + ids[-args.target:]}

    batch = losses.collate([side(), side()], 0, device)
    batch["ref"] = torch.zeros(1, 2, device=device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-5)
    model.train()
    times = []
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.steps):
        start = time.time()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu",
                                                                                                             enabled=False)
        with autocast:
            loss, _, _ = losses.dpo_step_loss(model, batch, beta=0.1)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.time() - start)
    step = min(times[1:] or times)
    result = {"shape": args.shape, "length": args.length, "lora_r": args.lora_r, "quantized": loaded.quantized,
              "device": str(device), "trainable_params": sum(p.numel() for p in params),
              "seconds_per_step": round(step, 3), "tokens_per_s": round(2 * args.length / step, 1),
              "peak_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
              "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
