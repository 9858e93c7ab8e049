"""Is transformers' own continuous batching (`model.generate_batch`) token-identical to `model.generate`?

    python bench/check_hf_continuous.py                  # tiny random Llama, CPU, greedy
    python bench/check_hf_continuous.py --model DIR      # a checkpoint of yours (on CUDA when there is one)

Issue 11 asks to build on transformers' continuous-batching manager only if it proves token-identical to
plain generation. This runs the same prompts (debate-like: a long shared system prompt, different
questions) both ways under greedy decoding, one prompt at a time for `generate` (no padding at all), and
prints how many completions match, where the first mismatch starts, and the seconds each way.
"""
import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402

from tests.tiny_models import build_tiny_llama  # noqa: E402

SYSTEM = ("You are the Moderator of a debate about a claim. Read the evidence, weigh both sides and say which "
          "verdict the evidence supports: Supported, Refuted, Not Enough Evidence or Conflicting Evidence. ")


def prompts(tokenizer, n):
    chats = [[{"role": "system", "content": SYSTEM * (1 + i % 3)},
              {"role": "user", "content": f"Round {i}: argument {'for' if i % 2 else 'against'} claim number {i}."}]
             for i in range(n)]
    return [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
            for c in chats]


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="a Hugging Face directory (default: a tiny random Llama built here)")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    return p


def main():
    p = build_parser()
    args = p.parse_args()
    path = args.model or build_tiny_llama(Path(tempfile.mkdtemp()) / "tiny", seed=0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    model = model.to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    inputs = prompts(tokenizer, args.prompts)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)

    start = time.perf_counter()
    plain = []
    with torch.inference_mode():
        for ids in inputs:
            out = model.generate(torch.tensor([ids], device=device), generation_config=config)
            plain.append(out[0, len(ids):].tolist())
    plain_s = time.perf_counter() - start

    start = time.perf_counter()
    try:
        results = model.generate_batch(inputs, generation_config=config, progress_bar=False)
        batched = [list(results[key].generated_tokens) for key in sorted(results, key=lambda k: int(k.split("_")[-1]))]
        error = None
    except Exception as err:  # an API that refuses the device or the model is a result too
        batched, error = [], f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    batch_s = time.perf_counter() - start

    def first_difference(a, b):
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a),
                                                                                                           len(b)))

    same = sum(a == b for a, b in zip(plain, batched))
    report = {"transformers": __import__("transformers").__version__, "torch": torch.__version__, "device": device,
              "prompts": len(inputs), "identical": same, "error": error,
              "first_mismatch_token": [first_difference(a, b) for a, b in zip(plain, batched) if a != b],
              "generate_s": round(plain_s, 2), "generate_batch_s": round(batch_s, 2)}
    print(json.dumps(report, indent=2))
    return 0 if error is None and same == len(inputs) else 1


if __name__ == "__main__":
    sys.exit(main())
