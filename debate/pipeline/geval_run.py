"""The G-Eval faithfulness judge's run: every explanation of some finished runs rated by a judge model.

    debatecv-geval RUN_DIR [RUN_DIR ...] --judge-model M --protocol all [--human FILE] [--json OUT]
    (in a checkout: python -m debate.pipeline.geval_run ...)

It is a run of the pipeline wing as any other: each run's claims and evidence are read back through the
runner (debate.pipeline.runner.load_claims, as the run's config.json says), the judge is loaded by the
engine and asked by debate.methods.geval_judge, and the ratings, scores, intervals and tables are
eval.geval_scores's arithmetic. So eval only reads runs, and nothing in eval starts one.

The module doc of eval.geval_scores says what is scored and how; ratings are appended to RUN_DIR/geval.jsonl
as they are made, so a stopped evaluation resumes.
"""
import json
import logging
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

from debate.data import jsonl
from debate.data.flags import Parser
from debate.data.inputs import DataError
from debate.data.prompts import PromptError, format_evidence
from debate.engine import errors, gguf, models, offline
from debate.methods import geval_judge as judging
from debate.pipeline import config as run_config, progress, runner
from debate.pipeline.config import ConfigError
from debate.pipeline.records import read_jsonl
from eval import geval_scores
from eval.averitec import InputError
from eval.geval_scores import (
    PROTOCOLS,
    RATINGS,
    SAMPLES,
    SEED,
    agreement,
    agreement_table,
    explanation_digest,
    explanation_score,
    read_human,
    read_predictions,
    row_name,
    summarize,
    table,
    units_of,
    weighted_score,
)

log = logging.getLogger(__name__)


def _claims_of(run_dir):
    """{claim_id as text: claim} of a run, read as its config.json says (all of the split, any --limit aside)."""
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
    return {(str(r["claim_id"]), r["protocol"]): r for r in read_jsonl(path) if r.get("judge") == judge}


def evaluate(run_dirs, judge_model=None, protocols=PROTOCOLS, human=None, names=None, batch_size=8,
             use_4bit=None, samples=SAMPLES, seed=SEED):
    """Score every explanation of `run_dirs` under `protocols` with the judge model (default: the embedded one);
    returns {"judge", "protocols", "methods": [{"name", "run_dir", "scores": {protocol: summary},
    "explanations": {protocol: {claim_id: score}}}], "agreement" (with `human`)}. Every input is checked
    before the judge loads."""
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
    judge_path = judge_model or gguf.default_model_path()
    models.check_roles({"geval_judge": judge_path})

    offline.set_offline()
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
                if line is None or line["explanation_sha"] != explanation_digest(explanation):
                    todo.append((p, protocol))
        log.info(f"{run['name']}: {len(run['predictions'])} explanations x {len(protocols)} protocols, "
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
                                  "explanation_sha": explanation_digest(p.get("justification")),
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
    parser = Parser(prog="debatecv-geval", description=__doc__.split("\n")[0])
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
    # eval.geval_scores's doc says what is scored and how (its first two paragraphs and last line are about code).
    parser.epilog = geval_scores.__doc__.split("\n\n", 2)[2].rsplit("\n\n", 1)[0]
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.batch_size < 1 or args.samples < 1:
        parser.error("--batch-size and --samples must be at least 1")
    protocols = list(PROTOCOLS) if args.protocol == ["all"] else args.protocol
    try:
        with progress.lines(say=progress.to_stderr):  # its lines on stderr: stdout is the table
            result = evaluate(args.run_dirs, args.judge_model, protocols, args.human, args.names, args.batch_size,
                              args.use_4bit, args.samples, args.seed)
    except (InputError, errors.ModelLoadError, PromptError) as err:
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


def console_main():
    """The `debatecv-geval` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
