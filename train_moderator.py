"""Post-train the DebateCV Moderator on synthetic debates (SynDeC): D-SFT, then D-DPO.

    python train_moderator.py --stage all --split demo --out runs/syndec-demo     # embedded model and claims
    python train_moderator.py --stage synth --split train --data-dir DIR --model M --out runs/syndec
    python train_moderator.py --stage dpo --model M --out runs/syndec
    accelerate launch train_moderator.py --stage sft ...                         # data parallel on several GPUs

Then: python run_debate.py --moderator-model M --moderator-adapter runs/syndec/dpo/adapter ...
"""
import argparse
import sys

from debate.data import datasets
from debate.pipeline import cli, runner
from train import loop, stages, syndec


# Where a default comes from; the others are shown without a source.
TRAIN_SOURCES = {"batch_size": cli.OURS, "max_rounds": cli.PAPER, "lora_r": cli.PAPER, "lora_alpha": cli.PAPER,
                 "lr": cli.PAPER, "epochs": cli.PAPER, "micro_batch": cli.OURS, "grad_accum": cli.OURS,
                 "max_length": cli.OURS, "save_every": cli.OURS, "seed": cli.OURS}


def build_parser():
    p = cli.Parser(prog="train_moderator.py", description=__doc__)
    p.add_argument("--stage", choices=(*stages.STAGES, "all"), default="all", help="the stage to run, or all in order")
    p.add_argument("--out", default="runs/syndec", help="directory of every stage's outputs")
    p.add_argument("--overwrite", action="store_true", help="redo the stages asked for instead of skipping them; a stage's old output "
                   "is removed only once every check has passed")
    d = p.add_argument_group("synthesis (golden evidence, or --retrieved-file)")
    d.add_argument("--dataset", default="averitec", choices=datasets.NAMES,
                   help="the dataset of the training claims (run_debate.py --list-datasets shows them); the Moderator "
                   "then learns that dataset's labels")
    d.add_argument("--split", default="train", help="a split of the dataset: AVeriTeC's DIR/<split>.json or 'demo' "
                   "(embedded), Check-COVID's train, ...")
    d.add_argument("--data-dir", help="the dataset's folder (default: data/<dataset>; AVeriTeC: $DEBATECV_DATA, "
                   "else data/averitec)")
    d.add_argument("--retrieved-file", metavar="FILE",
                   help="debate on this retrieved evidence (HerO's format, keyed by claim_id; `run_debate.py "
                   "--knowledge-store DIR --retrieve-only` writes one) instead of the golden evidence the DebateCV "
                   "paper synthesises from (default: golden)")
    d.add_argument("--debate-retrieval", action="store_true",
                   help="synthesise debates that retrieve as they go (run_debate.py --debate-retrieval, ours): each "
                   "round both Debaters search --knowledge-store (each claim's own file) or --corpus, and novel "
                   "passages join the evidence the Moderator, and so its training context, reads")
    d.add_argument("--knowledge-store", metavar="DIR", help="with --debate-retrieval: DIR/<claim_id>.json, searched "
                   "during the debate (BM25, then re-ranking)")
    d.add_argument("--corpus", metavar="FILE", help="with --debate-retrieval: JSONL passages searched during the "
                   "debate (default: the dataset's corpus where it has one)")
    d.add_argument("--embedder", metavar="DIR", help="with --debate-retrieval: the sentence encoder (default: the "
                   "shipped all-MiniLM-L6-v2)")
    d.add_argument("--limit", type=int, help="only the first N claims (default: all)")
    d.add_argument("--batch-size", type=int, default=8, help="claims debated (or corrected) together (ours)")
    d.add_argument("--max-new-tokens", type=int,
                   help=f"per turn; default {cli.FULL_TURN}, the DebateCV paper's ({cli.DEMO_TURN} on the demo "
                   "split, ours)")
    d.add_argument("--max-rounds", type=int, default=3, help="debate rounds at most (the DebateCV paper's 3)")
    d.add_argument("--temperature", type=float, default=cli.PAPER_TEMPERATURE,
                   help=f"sampling temperature of synthesis and correction; 0 = greedy (default "
                   f"{cli.PAPER_TEMPERATURE}, the DebateCV paper's)")
    d.add_argument("--top-p", type=float, default=1.0, help="default 1.0, the DebateCV paper's")
    d.add_argument("--structured", action=argparse.BooleanOptionalAction, default=True,
                   help="decode the Moderator's and the Corrector's JSON answers under their schemas (ours)")
    m = p.add_argument_group("models")
    m.add_argument("--model", help="the Moderator's base model, trained here (default: embedded Gemma 3 270M)")
    m.add_argument("--debater-model", help="the Debaters during synthesis (default: --model)")
    m.add_argument("--corrector-model", help="the Corrector (default: --model)")
    # 4-bit QLoRA is ours, to fit one small GPU: the paper trained LoRA on a 40GB A100 and does not say it quantised.
    cli.add_4bit_flags(m, "the models (the trained base frozen under its LoRA, QLoRA)")
    t = p.add_argument_group("training (the DebateCV paper's Appendix C gives AdamW, lr, epochs, LoRA rank and "
                             "alpha; every other default is ours)")
    t.add_argument("--syndec", help="train on this SynDeC file (default: OUT's corrected one, else "
                   "OUT/syndec.jsonl)")
    t.add_argument("--sft-include-corrected", action="store_true",
                   help="D-SFT also on wrong records, with the gold verdict and corrected justification as target")
    t.add_argument("--init-adapter", help="start D-SFT from this LoRA adapter (default: a new one)")
    t.add_argument("--sft-adapter", help="D-DPO's starting point and reference (default: OUT/sft/adapter)")
    t.add_argument("--lora-r", type=int, default=128, help="LoRA rank")
    t.add_argument("--lora-alpha", type=int, default=256, help="LoRA alpha")
    t.add_argument("--lora-dropout", type=float, default=0.05,
                   help="LoRA dropout (ours; the paper does not give it); LoRA targets every linear layer (ours)")
    t.add_argument("--lr", type=float, default=2e-5, help="AdamW learning rate")
    t.add_argument("--epochs", type=int, default=2, help="passes over the records, per stage")
    t.add_argument("--micro-batch", type=int, default=1, help="examples (DPO: pairs) per forward pass (ours)")
    t.add_argument("--grad-accum", type=int, default=8, help="micro-batches per optimizer step (ours; the paper "
                   "gives no batch size)")
    t.add_argument("--warmup-ratio", type=float, default=0.03, help="share of steps warming up (ours)")
    t.add_argument("--schedule", choices=("cosine", "linear", "constant"), default="cosine",
                   help="learning-rate schedule (ours)")
    t.add_argument("--max-length", type=int, default=4096,
                   help="longest sequence (ours); longer debates lose their oldest rounds first, never the target")
    t.add_argument("--beta", type=float, default=0.1, help="DPO temperature (ours; the paper does not give it)")
    t.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                   help="keep activations instead of recomputing them (checkpointing is ours, to save memory)")
    t.add_argument("--save-every", type=int, default=50, help="optimizer steps between checkpoints (ours)")
    t.add_argument("--resume", action="store_true", help="continue a training stage from its last checkpoint")
    t.add_argument("--seed", type=int, default=0, help="random seed")
    cli.label_sources(p, TRAIN_SOURCES)
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    cli.check_cli(p, args, ("batch_size", "max_new_tokens", "max_rounds", "lora_r", "lora_alpha", "epochs",
                               "micro_batch", "grad_accum", "max_length", "save_every"))
    if args.lr <= 0 or args.beta <= 0 or not 0 <= args.warmup_ratio < 1 or not 0 <= args.lora_dropout < 1:
        p.error("--lr and --beta must be positive, --warmup-ratio and --lora-dropout in [0, 1)")
    return args


def main(argv=None):
    args = parse_args(argv)

    def go():
        try:
            return stages.run(args)
        except (syndec.SynDeCError, loop.TrainError) as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2)

    return runner.main_guard(go)


def console_main():
    """The `debatecv-train` console script: main() with nothing returned, as the script exits with
    whatever its function returns and what the stages return is not an exit status."""
    main()


if __name__ == "__main__":
    main()
