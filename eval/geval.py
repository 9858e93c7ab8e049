"""G-Eval faithfulness of a run's explanations (MADR's Table 2) and its agreement with people (its Table 4).

    python -m eval.geval RUN_DIR [RUN_DIR ...] --judge-model M --protocol all [--human FILE] [--json OUT]

Each run directory is one method, one row of the table: any run whose predictions carry justifications
(an explanation run of --task explain, a verification run with or without --refine madr). For each
explanation and protocol (debate.methods.geval: sentence or document level, with or without the error
typology) the judge model rates the explanation as a whole, or each of its sentences, from 1 to 5, against
the evidence it was written from (the record's own when it has some, as the courtroom's, else its claim's
under the run's evidence condition). The
sentences are nltk's Punkt sentences with its English model, as the METEOR tokenizer splits them
(eval.meteor). A rating's score is G-Eval's: the sum over s = 1..5 of s x p(s), p(s) the judge's
probability of answering s (renormalised over the five); a sentence-level score is the mean over the
explanation's sentences. Per method and protocol the table gives the mean over explanations and a 95%
percentile bootstrap interval (explanations resampled, 10,000 times, seed 0). An empty explanation has no
score; it is counted as `unscored`, never as a 1 or a 5.

Ratings are appended to RUN_DIR/geval.jsonl as they are made, one line per explanation and protocol, so
a stopped evaluation resumes; a line is reused only for the same judge and the same explanation text.

--human FILE: JSON lines {"run": NAME, "claim_id": ID, "score": NUMBER}, higher meaning more faithful (1 for
a faithful explanation and 0 for an unfaithful one, or minus its error count); NAME is a row's name (its
method, or --names) or its directory, and may be left out with one run directory; several lines for one
explanation are averaged. Kendall's tau-c between the people's scores and each protocol's, over the
explanations both score (all rows pooled), is reported as in Table 4.

The arithmetic here needs nothing above debate.data; `evaluate` loads the runs' claims and the judge
through the upper wings only when it is called.
"""
import hashlib
import json
import math
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from debate.data import jsonl
from eval.averitec import InputError
from eval.meteor import sentences

PROTOCOLS = ("sentence", "sentence-typology", "document", "document-typology")  # = debate.methods.geval's
SCORES = ("1", "2", "3", "4", "5")
RATINGS = "geval.jsonl"
SAMPLES, SEED = 10_000, 0
HEADERS = {"sentence": "sentence, no typology", "sentence-typology": "sentence, typology",
           "document": "document, no typology", "document-typology": "document, typology"}


# ---------------------------------------------------------------- the arithmetic


def weighted_score(probs):
    """G-Eval's score of one rating: sum of s x p(s) over the scores s, p renormalised; None without probabilities."""
    if not probs:
        return None
    total = sum(probs.values())
    if total <= 0:
        return None
    return sum(int(s) * p for s, p in probs.items()) / total


def explanation_score(unit_scores):
    """An explanation's score from its units' (its one document, or its sentences): their mean, over the units
    that were read; None when none was."""
    read = [s for s in unit_scores if s is not None]
    return sum(read) / len(read) if read else None


def units_of(protocol, explanation):
    """What the judge rates under `protocol`: the explanation itself, or each of its sentences; none when empty."""
    text = (explanation or "").strip()
    if not text:
        return []
    return sentences(text) if protocol.startswith("sentence") else [text]


def bootstrap_interval(values, samples=SAMPLES, seed=SEED):
    """95% percentile bootstrap interval of the mean of `values` (resampled with replacement); None when empty."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(samples, values.size))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return [float(low), float(high)]


def kendall_tau_c(x, y):
    """Kendall's tau-c (Stuart's) of paired values: 2 (C - D) / (n^2 (m - 1) / m), C and D the concordant and
    discordant pairs, m the smaller number of distinct values of x and of y. None when it is undefined
    (fewer than two pairs, or one side constant)."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_c: {len(x)} values against {len(y)}")
    n = len(x)
    m = min(len(set(x)), len(set(y)))
    if n < 2 or m < 2:
        return None
    def sign(v):
        return (v > 0) - (v < 0)

    # Concordant minus discordant pairs; a pair tied on either side counts as neither.
    balance = sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i in range(n) for j in range(i + 1, n))
    return 2 * balance / (n * n * (m - 1) / m)


def summarize(scores, samples=SAMPLES, seed=SEED):
    """{"mean", "interval", "n", "unscored"} of one method's explanation scores under one protocol (None: unscored)."""
    read = [s for s in scores if s is not None]
    return {"mean": sum(read) / len(read) if read else None, "interval": bootstrap_interval(read, samples, seed),
            "n": len(read), "unscored": len(scores) - len(read)}


def _cell(summary):
    if summary is None or summary["mean"] is None:
        return "-"
    low, high = summary["interval"]
    return f"{summary['mean']:.2f} [{low:.2f}, {high:.2f}]"


def table(result):
    """The paper's Table 2 layout as Markdown: a row per method, a column per protocol (sentence then document
    level, each without then with the typology); each cell the mean [95% interval]."""
    protocols = result["protocols"]
    lines = ["| method | n | " + " | ".join(HEADERS[p] for p in protocols) + " |",
             "|---|---|" + "---|" * len(protocols)]
    for row in result["methods"]:
        n = max((row["scores"][p]["n"] + row["scores"][p]["unscored"] for p in protocols), default=0)
        lines.append(f"| {row['name']} | {n} | " + " | ".join(_cell(row["scores"].get(p)) for p in protocols) + " |")
    return "\n".join(lines)


def agreement_table(agreement):
    """Table 4's layout: Kendall's tau-c of each protocol with the people's scores."""
    lines = ["| protocol | Kendall's tau-c | explanations |", "|---|---|---|"]
    for protocol, row in agreement.items():
        tau = "-" if row["tau_c"] is None else f"{row['tau_c']:.3f}"
        lines.append(f"| {HEADERS[protocol]} | {tau} | {row['n']} |")
    return "\n".join(lines)


def agreement(result, human):
    """{protocol: {"tau_c", "n"}}: Kendall's tau-c of people's scores (`human`: {(run name, claim_id): score})
    against each protocol's explanation scores, pooled over the methods."""
    out = {}
    for protocol in result["protocols"]:
        pairs = [(human[(row["name"], cid)], score) for row in result["methods"]
                 for cid, score in row["explanations"][protocol].items()
                 if score is not None and (row["name"], cid) in human]
        out[protocol] = {"tau_c": kendall_tau_c([h for h, _ in pairs], [s for _, s in pairs]), "n": len(pairs)}
    return out


def explanation_stats(predictions):
    """What an explanation run's metrics.json says before any judge: explanations, empty ones, mean words and
    sentences, tokens per claim, and for Self-Refine and MADR their stop reasons and mean revisions."""
    texts = [(p.get("justification") or "").strip() for p in predictions]
    n = len(predictions)
    stats = {"n": n, "empty": sum(not t for t in texts),
             "mean_words": sum(len(t.split()) for t in texts) / n if n else None,
             "mean_sentences": sum(len(sentences(t)) for t in texts if t) / n if n else None,
             "tokens_per_claim": sum(p.get("prompt_tokens", 0) + p.get("completion_tokens", 0)
                                     for p in predictions) / n if n else None}
    for method in ("self_refine", "madr"):
        runs = [p[method] for p in predictions if isinstance(p.get(method), dict)]
        if runs:
            stats[method] = {"stop_reasons": dict(Counter(r["stop_reason"] for r in runs)),
                             "mean_revisions": sum(r.get("revisions", 0) for r in runs) / len(runs)}
    return stats


def stats_line(stats):
    """One line of an explanation run's summary for the log."""
    if not stats["n"]:
        return "no explanations"
    parts = [f"{stats['n']} explanations ({stats['empty']} empty)", f"{stats['mean_words']:.1f} words",
             f"{stats['mean_sentences']:.1f} sentences", f"{stats['tokens_per_claim']:.0f} tokens per claim"]
    for method in ("self_refine", "madr"):
        if method in stats:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(stats[method]["stop_reasons"].items()))
            parts.append(f"{method}: {stats[method]['mean_revisions']:.2f} revisions ({reasons})")
    return "; ".join(parts)


# ---------------------------------------------------------------- reading the inputs


def _digest(text):
    return hashlib.sha256((text or "").encode("utf-8")).hexdigest()[:16]


def read_predictions(run_dir):
    """The run's predictions, each with a claim_id and a justification (a string, possibly empty)."""
    path = Path(run_dir) / "predictions.jsonl"
    if not path.is_file():
        trials = sorted(Path(run_dir).glob("trial-*/predictions.jsonl"))
        hint = f" (a run of --trials: give one of its trial directories, e.g. {trials[0].parent})" if trials else ""
        raise InputError(f"{run_dir}: no predictions.jsonl{hint}")
    try:
        rows = list(jsonl.numbered(path.read_text(encoding="utf-8")))
    except jsonl.BadLine as err:
        raise InputError(f"{path}: line {err.lineno} is not valid JSON: {err.error.msg}") from None
    for number, row in rows:
        if not isinstance(row, dict) or "claim_id" not in row:
            raise InputError(f"{path}: line {number}: a prediction needs a claim_id")
        if not isinstance(row.get("justification") or "", str):
            raise InputError(f"{path}: line {number}: justification is not a string")
    return [row for _, row in rows]


def read_human(path, names, only=None):
    """{(row name, claim_id as text): mean score} from a JSONL file of people's scores (see the module doc);
    `names` maps what a line may call a row (its name, its directory) to the row's name; `only`: the one row's
    name, which a line without "run" means."""
    path = Path(path)
    try:
        rows = list(jsonl.numbered(path.read_text(encoding="utf-8")))
    except OSError as err:
        raise InputError(f"--human {path}: cannot read: {err}") from None
    except jsonl.BadLine as err:
        raise InputError(f"--human {path}: line {err.lineno} is not valid JSON: {err.error.msg}") from None
    sums = defaultdict(list)
    for number, row in rows:
        where = f"--human {path}: line {number}"
        if not isinstance(row, dict) or "claim_id" not in row:
            raise InputError(f"{where}: needs a claim_id and a score")
        score = row.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise InputError(f"{where}: score must be a number, not {score!r}")
        run = row.get("run", only)
        if run not in names:
            raise InputError(f"{where}: run {run!r} is none of the rows: {', '.join(sorted(names))}"
                             if run is not None else f"{where}: needs a run (several run directories are scored)")
        sums[(names[run], str(row["claim_id"]))].append(float(score))
    return {key: sum(v) / len(v) for key, v in sums.items()}


def row_name(run_dir, saved):
    """A row's name: the run's method (its config.json), with "+madr" when refined, else the directory's name."""
    method = saved.get("method")
    if not method:
        return Path(run_dir).name
    return f"{method}+madr" if saved.get("refine") == "madr" and saved.get("task", "verify") == "verify" else method


# ---------------------------------------------------------------- judging (loads the upper wings when called)


def _claims_of(run_dir):
    """{claim_id as text: claim} of a run, read as its config.json says (all of the split, any --limit aside)."""
    from dataclasses import replace

    from debate.data.inputs import DataError
    from debate.pipeline import config as run_config, runner
    from debate.pipeline.config import ConfigError

    path = Path(run_dir) / "config.json"
    if not path.is_file():
        raise InputError(f"{run_dir}: no config.json (G-Eval reads the run's claims and evidence as it ran)")
    try:
        cfg = run_config.load(path)
        claims = runner.load_claims(replace(cfg, data=replace(cfg.data, limit=None)))
    except (ConfigError, DataError) as err:
        raise InputError(f"{path}: cannot read the run's claims: {err}") from None
    return {str(c["claim_id"]): c for c in claims}


def _done_ratings(path, judge):
    """{(claim_id text, protocol): line} of the ratings already in `path` by `judge`."""
    if not path.is_file():
        return {}
    from debate.pipeline.records import read_jsonl

    return {(str(r["claim_id"]), r["protocol"]): r for r in read_jsonl(path) if r.get("judge") == judge}


def evaluate(run_dirs, judge_model=None, protocols=PROTOCOLS, human=None, names=None, batch_size=8,
             use_4bit=None, samples=SAMPLES, seed=SEED, log=print):
    """Score every explanation of `run_dirs` under `protocols` with the judge model (default: the embedded one);
    returns {"judge", "protocols", "methods": [{"name", "run_dir", "scores": {protocol: summary},
    "explanations": {protocol: {claim_id: score}}}], "agreement" (with `human`)}. Every input is checked
    before the judge loads."""
    from debate.engine import models
    from debate.methods import geval as judging
    from debate.data.prompts import format_evidence

    unknown = [p for p in protocols if p not in PROTOCOLS]
    if unknown or not protocols:
        raise InputError(f"--protocol: {', '.join(unknown) or 'none given'}; the protocols are all or "
                         f"{', '.join(PROTOCOLS)}")
    if names is not None and len(names) != len(run_dirs):
        raise InputError(f"--names gives {len(names)} names for {len(run_dirs)} run directories")
    runs = []
    for i, run_dir in enumerate(run_dirs):
        predictions = read_predictions(run_dir)
        saved = json.loads((Path(run_dir) / "config.json").read_text(encoding="utf-8")) if (
            Path(run_dir) / "config.json").is_file() else {}
        claims = _claims_of(run_dir)
        missing = [p["claim_id"] for p in predictions if str(p["claim_id"]) not in claims]
        if missing:
            raise InputError(f"{run_dir}: claim {missing[0]!r} of its predictions is not in its split")
        runs.append({"dir": str(run_dir), "name": names[i] if names else row_name(run_dir, saved),
                     "predictions": predictions, "claims": claims})
    taken = Counter(r["name"] for r in runs)
    for r in runs:
        if taken[r["name"]] > 1:
            r["name"] = f"{r['name']} ({r['dir']})"  # two runs of one method: their directories tell them apart
    lookup = {**{r["dir"]: r["name"] for r in runs}, **{Path(r["dir"]).name: r["name"] for r in runs},
              **{r["name"]: r["name"] for r in runs}}
    people = read_human(human, lookup, runs[0]["name"] if len(runs) == 1 else None) if human else None
    judge_path = judge_model or models.default_model_path()
    models.check_roles({"geval_judge": judge_path})

    models.set_offline()
    agent = models.load_roles({"geval_judge": judge_path}, use_4bit=use_4bit)["geval_judge"]
    settings = judging.judge_settings()
    judge = str(judge_path)
    result = {"judge": judge, "protocols": list(protocols), "methods": []}
    for run in runs:
        path = Path(run["dir"]) / RATINGS
        done = _done_ratings(path, judge)
        todo = []
        for p in run["predictions"]:
            explanation = p.get("justification") or ""
            for protocol in protocols:
                line = done.get((str(p["claim_id"]), protocol))
                if line is None or line["explanation_sha"] != _digest(explanation):
                    todo.append((p, protocol))
        log(f"{run['name']}: {len(run['predictions'])} explanations x {len(protocols)} protocols, "
            f"{len(run['predictions']) * len(protocols) - len(todo)} ratings already in {path}")
        with open(path, "a", encoding="utf-8", newline="\n") as out:
            # A few explanations at a time: their ratings are written (and resumable) once the batch is judged.
            step = max(1, batch_size)
            for start in range(0, len(todo), step):
                chunk = todo[start:start + step]
                units, owners = [], []
                for k, (p, protocol) in enumerate(chunk):
                    # The evidence it was written from: the record's own (the courtroom's), else the claim's.
                    claim = run["claims"][str(p["claim_id"])]
                    evidence = format_evidence(p["evidence"] if "evidence" in p else claim["evidence"])
                    for text in units_of(protocol, p.get("justification")):
                        units.append((protocol, evidence, text))
                        owners.append(k)
                rated = judging.rate(agent, units, settings, batch_size) if units else []
                lines = []
                for k, (p, protocol) in enumerate(chunk):
                    mine = [dict(rating, text=unit[2], score=weighted_score(rating["probs"]))
                            for unit, owner, rating in zip(units, owners, rated) if owner == k]
                    lines.append({"claim_id": p["claim_id"], "protocol": protocol, "judge": judge,
                                  "explanation_sha": _digest(p.get("justification")),
                                  "score": explanation_score([u["score"] for u in mine]) if mine else None,
                                  "units": [{key: u[key] for key in ("text", "probs", "score", "status")}
                                            for u in mine]})
                jsonl.append_durably(out, lines)
                for line in lines:
                    done[(str(line["claim_id"]), line["protocol"])] = line
        explanations = {protocol: {str(p["claim_id"]): done[(str(p["claim_id"]), protocol)]["score"]
                                   for p in run["predictions"]} for protocol in protocols}
        result["methods"].append({"name": run["name"], "run_dir": run["dir"], "explanations": explanations,
                                  "scores": {protocol: summarize(list(explanations[protocol].values()), samples, seed)
                                             for protocol in protocols}})
    if people is not None:
        result["agreement"] = agreement(result, people)
    return result


def build_parser():
    # Only the command line needs the pipeline wing's one-line errors; the arithmetic imports nothing above data.
    from debate.pipeline.cli import Parser

    parser = Parser(prog="python -m eval.geval", description=__doc__.split("\n")[0])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories, one row of the table each")
    parser.add_argument("--judge-model", help="the judge: HF directory or .gguf file (default: the embedded Gemma 3 "
                        "270M, whose ratings mean little; the paper's judge was GPT-4 Turbo)")
    parser.add_argument("--protocol", nargs="+", default=["all"], metavar="P",
                        help=f"all, or some of {', '.join(PROTOCOLS)} (default: all)")
    parser.add_argument("--human", metavar="FILE", help="people's scores per explanation (JSONL, see below): "
                        "Kendall's tau-c per protocol (default: none)")
    parser.add_argument("--names", nargs="+", metavar="NAME", help="the rows' names, one per RUN_DIR "
                        "(default: each run's method)")
    parser.add_argument("--batch-size", type=int, default=8, help="ratings per model call (default: 8)")
    parser.add_argument("--4bit", dest="use_4bit", action="store_true", default=None,
                        help="load the judge in 4-bit NF4 on any device, a CPU included (default: NF4 on CUDA, "
                        "float32 on a CPU)")
    parser.add_argument("--no-4bit", dest="use_4bit", action="store_false",
                        help="never 4-bit: the judge in bf16 on CUDA, float32 on a CPU")
    parser.add_argument("--samples", type=int, default=SAMPLES, help=f"bootstrap resamples (default: {SAMPLES})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed of the bootstrap (default: {SEED})")
    parser.add_argument("--json", metavar="OUT", help="also write the whole result (every explanation's score) here "
                        "(default: the table only)")
    parser.epilog = __doc__.split("\n\n", 1)[1]
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.samples < 1:
        parser.error("--batch-size and --samples must be at least 1")
    protocols = list(PROTOCOLS) if args.protocol == ["all"] else args.protocol
    from debate.engine.models import ModelLoadError
    from debate.data.prompts import PromptError

    try:
        result = evaluate(args.run_dirs, args.judge_model, protocols, args.human, args.names, args.batch_size,
                          args.use_4bit, args.samples, args.seed, log=lambda text: print(text, file=sys.stderr))
    except (InputError, ModelLoadError, PromptError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"G-Eval faithfulness (judge {result['judge']}): mean [95% bootstrap interval] over explanations")
    print(table(result))
    if "agreement" in result:
        print("\nAgreement with people")
        print(agreement_table(result["agreement"]))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
