"""Host reads a model forward, counted from outside the engine: how often the decode loop waits for the device.

    python bench/bench_host_reads.py --tiny --claims 4 --batch-size 4 --turns 192 --turn-lengths 48 --structured

Runs one row of bench/bench_gpu.py's matrix (DebateCV on AVeriTeC dev claims, the real runner, continuous batching,
KV reuse, bf16/fp32) with every way a tensor's values reach Python patched to count (`.item()`, `.tolist()`,
`.cpu()`, `.numpy()`, `bool()`, `int()`, `float()`, `.__index__()`) and every forward of a causal LM counted (a
global forward pre-hook on modules whose class name ends in "ForCausalLM"). On a GPU each read waits for the device
to finish the work queued before it; on a CPU nothing waits, but the count is the same code's, so a CPU run says how
often the path CUDA runs would stop. Prints one JSON line: reads, forwards, reads a forward, and the decode steps.
"""
import json
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench import bench_gpu  # noqa: E402

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class Counter:
    """Counts tensor reads and causal-LM forwards while active."""

    def __init__(self) -> None:
        self.reads = {name: 0 for name in READS}
        self.forwards = 0
        self._saved = {}
        self._hook = None

    def __enter__(self) -> "Counter":
        for name in READS:
            original = getattr(torch.Tensor, name)
            self._saved[name] = original

            def counted(tensor, *args, _name=name, _original=original, **kwargs):
                self.reads[_name] += 1
                return _original(tensor, *args, **kwargs)

            setattr(torch.Tensor, name, counted)

        def pre(module, args):
            if type(module).__name__.endswith("ForCausalLM"):
                self.forwards += 1

        self._hook = torch.nn.modules.module.register_module_forward_pre_hook(pre)
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._saved.items():
            setattr(torch.Tensor, name, original)
        self._hook.remove()


def build_parser():
    """bench/bench_gpu.py's flags: this runs one row of its matrix (tests/test_docs.py checks the documented
    commands against them)."""
    return bench_gpu.build_parser()


def main() -> int:
    p = build_parser()
    args = p.parse_args()
    if not (Path(args.data_dir) / "dev.json").exists():
        print(f"error: {args.data_dir}/dev.json not found (--data-dir)", file=sys.stderr)
        return 2
    path = bench_gpu.checkpoint(args.cache, args.tiny, args.data_dir, args.vocab_size)
    bench_gpu.set_turn_lengths(args)
    out_dir = Path(tempfile.mkdtemp(prefix="bench_host_reads-"))
    try:
        with Counter() as counter:
            row = bench_gpu.run_once(path, args, True, False, args.turns[0], out_dir, True)
        decode = json.loads((out_dir / "config.json").read_text()).get("decode", {})
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    reads = sum(counter.reads.values())
    print(json.dumps({"reads": reads, "forwards": counter.forwards,
                      "reads_a_forward": round(reads / max(counter.forwards, 1), 3),
                      "by_kind": {k: v for k, v in counter.reads.items() if v}, "decode": decode,
                      "claims": row["claims"], "seconds": row["seconds"], "structured": args.structured}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
