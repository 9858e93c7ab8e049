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

# Only the flags' modules at the top (no torch): --help and a bad flag answer at once; the stages' modules are
# imported in main() once the command line and its files have passed.
from debate.pipeline import cli
from train import preflight, settings
from train.settings import DEFAULTS as D

# Where a default comes from; the others are shown without a source.
TRAIN_SOURCES = {"batch_size": cli.OURS, "max_rounds": cli.PAPER, "lora_r": cli.PAPER, "lora_alpha": cli.PAPER,
                 "lr": cli.PAPER, "epochs": cli.PAPER, "micro_batch": cli.OURS, "grad_accum": cli.OURS,
                 "max_length": cli.OURS, "save_every": cli.OURS, "seed": cli.OURS}


def build_parser():
    p = cli.Parser(prog="train_moderator.py", description=__doc__)
    p.add_argument("--stage", choices=(*settings.STAGES, "all"), default=D.stage,
                   help="the stage to run, or all in order")
    p.add_argument("--out", default=D.out, help="directory of every stage's outputs")
    p.add_argument("--overwrite", action="store_true", help="redo the stages asked for instead of skipping them; a "
                   "stage's old output is removed only once every check has passed")
    d = p.add_argument_group("synthesis (golden evidence, or --retrieved-file)")
    d.add_argument("--dataset", default=D.dataset, choices=datasets.NAMES,
                   help="the dataset of the training claims (run_debate.py --list-datasets shows them); the Moderator "
                   "then learns that dataset's labels")
    d.add_argument("--split", default=D.split, help="a split of the dataset: AVeriTeC's DIR/<split>.json or 'demo' "
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
                   "during the debate (BM25, then re-ranking; default: none, --corpus or the dataset's corpus)")
    d.add_argument("--corpus", metavar="FILE", help="with --debate-retrieval: JSONL passages searched during the "
                   "debate (default: the dataset's corpus where it has one)")
    d.add_argument("--embedder", metavar="DIR", help="with --debate-retrieval: the sentence encoder (default: the "
                   "shipped all-MiniLM-L6-v2)")
    d.add_argument("--limit", type=int, help="only the first N claims (default: all)")
    d.add_argument("--batch-size", type=int, default=D.batch_size, help="claims debated (or corrected) together (ours)")
    d.add_argument("--max-new-tokens", type=int,
                   help=f"per turn; default {cli.FULL_TURN}, the DebateCV paper's ({cli.DEMO_TURN} on the demo "
                   "split, ours)")
    d.add_argument("--max-rounds", type=int, default=D.max_rounds,
                   help="debate rounds at most (the DebateCV paper's 3)")
    d.add_argument("--temperature", type=float, default=D.temperature,
                   help=f"sampling temperature of synthesis and correction; 0 = greedy (default "
                   f"{D.temperature}, the DebateCV paper's)")
    d.add_argument("--top-p", type=float, default=D.top_p, help="default 1.0, the DebateCV paper's")
    d.add_argument("--structured", action=argparse.BooleanOptionalAction, default=D.structured,
                   help="decode the Moderator's and the Corrector's JSON answers under their schemas (ours)")
    d.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="the synthesis run's decode step compiled, CUDA graphs on a GPU (run_debate.py --compile; "
                   "default: on with CUDA, off on a CPU; ours)")
    d.add_argument("--memory-gb", type=float,
                   help="the synthesis run's memory budget in GiB (run_debate.py --memory-gb; default: 0.9 of the "
                   "card's capacity less the weights, half of it of the RAM available on a CPU; ours)")
    m = p.add_argument_group("models")
    m.add_argument("--model", help="the Moderator's base model, trained here; 'demo' (here or in the flags below): the "
                   "embedded Gemma 3 270M, a base model for the demo (default: that model on --split demo; any other "
                   "split stops and asks for a model)")
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
    t.add_argument("--lora-r", type=int, default=D.lora_r, help="LoRA rank")
    t.add_argument("--lora-alpha", type=int, default=D.lora_alpha, help="LoRA alpha")
    t.add_argument("--lora-dropout", type=float, default=D.lora_dropout,
                   help="LoRA dropout (ours; the paper does not give it); LoRA targets every linear layer (ours)")
    t.add_argument("--lr", type=float, default=D.lr, help="AdamW learning rate")
    t.add_argument("--epochs", type=int, default=D.epochs, help="passes over the records, per stage")
    t.add_argument("--micro-batch", type=int, default=D.micro_batch,
                   help="examples (DPO: pairs) per forward pass (ours)")
    t.add_argument("--grad-accum", type=int, default=D.grad_accum,
                   help="micro-batches per optimizer step (ours; the paper gives no batch size)")
    t.add_argument("--warmup-ratio", type=float, default=D.warmup_ratio, help="share of steps warming up (ours)")
    t.add_argument("--schedule", choices=settings.SCHEDULES, default=D.schedule,
                   help="learning-rate schedule (ours)")
    t.add_argument("--max-length", type=int, default=D.max_length,
                   help="longest sequence (ours); longer debates lose their oldest rounds first, never the target")
    t.add_argument("--beta", type=float, default=D.beta, help="DPO temperature (ours; the paper does not give it)")
    t.add_argument("--no-gradient-checkpointing", dest="gradient_checkpointing", action="store_false",
                   help="keep activations instead of recomputing them (checkpointing is ours, to save memory)")
    t.add_argument("--save-every", type=int, default=D.save_every, help="optimizer steps between checkpoints (ours)")
    t.add_argument("--resume", action="store_true", help="continue a training stage from its last checkpoint")
    t.add_argument("--seed", type=int, default=D.seed, help="random seed")
    cli.label_sources(p, TRAIN_SOURCES)
    return p


def parse_args(argv=None, check=False):
    """The training settings (train/settings.py) of a command line; a bad value is one `error:` message, and with
    `check` so is everything the stages need and lack (train/preflight.py), together."""
    parser = build_parser()
    return settings.from_args(parser.parse_args(argv), parser, check=preflight.problems if check else None)


def main(argv=None):
    args = parse_args(argv, check=True)  # everything missing in one message, before torch is imported
    from debate.engine import offline
    from debate.pipeline import progress, runner
    from train import loop, stages, syndec

    offline.set_offline()  # before any model loads: hub kernels off among the switches (debate/engine/offline.py)

    def go():
        try:
            return stages.run(args)
        except (syndec.SynDeCError, loop.TrainError) as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2)

    # What the stages log (the `train` loggers) and what the synth stage's run logs (the `debate` loggers), at
    # INFO, as plain lines on stdout; warnings on stderr.
    with progress.lines(logger="train"), progress.lines():
        return runner.main_guard(go)


def console_main():
    """The `debatecv-train` console script: main() with nothing returned, as the script exits with
    whatever its function returns and what the stages return is not an exit status."""
    main()


if __name__ == "__main__":
    main()
