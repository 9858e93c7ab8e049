"""G-Eval faithfulness of a run's explanations (MADR's Table 2) and its agreement with people (its Table 4).

This module is the arithmetic and the reading: a rating's score, an explanation's, the bootstrap interval,
Kendall's tau-c, the tables, the people's scores. The judge itself runs in the pipeline wing
(debate.pipeline.geval_run, `debatecv-geval RUN_DIR ... --judge-model M`), which reads each run's claims
through the runner, rates with debate.methods.geval_judge and computes its table here: eval reads
runs, it never starts one.

Each run directory is one method, one row of the table: any run whose predictions carry justifications
(an explanation run of --task explain, a verification run with or without --refine madr). For each
explanation and protocol (debate.methods.geval_judge: sentence or document level, with or without the error
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

Nothing here imports above debate.data, nor torch.
"""
import hashlib
import math
import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from debate.data import jsonl
from eval import rundir
from eval.averitec import InputError
from eval.meteor import sentences

PROTOCOLS = ("sentence", "sentence-typology", "document", "document-typology")  # = debate.methods.geval_judge's
SCORES = ("1", "2", "3", "4", "5")
RATINGS = "geval.jsonl"
SAMPLES, SEED = 10_000, 0
HEADERS = {"sentence": "sentence, no typology", "sentence-typology": "sentence, typology",
           "document": "document, no typology", "document-typology": "document, typology"}


# ---------------------------------------------------------------- the arithmetic


def weighted_score(probs: Optional[Mapping[str, float]]) -> Optional[float]:
    """G-Eval's score of one rating: sum of s x p(s) over the scores s, p renormalised; None without probabilities."""
    if not probs:
        return None
    total = sum(probs.values())
    if total <= 0:
        return None
    return sum(int(s) * p for s, p in probs.items()) / total


def explanation_score(unit_scores: Iterable[Optional[float]]) -> Optional[float]:
    """An explanation's score from its units' (its one document, or its sentences): their mean, over the units
    that were read; None when none was."""
    read = [s for s in unit_scores if s is not None]
    return sum(read) / len(read) if read else None


def units_of(protocol: str, explanation: Optional[str]) -> List[str]:
    """What the judge rates under `protocol`: the explanation itself, or each of its sentences; none when empty."""
    text = (explanation or "").strip()
    if not text:
        return []
    return sentences(text) if protocol.startswith("sentence") else [text]


def bootstrap_interval(values: Union[Sequence[float], np.ndarray], samples: int = SAMPLES,
                       seed: int = SEED) -> Optional[List[float]]:
    """95% percentile bootstrap interval of the mean of `values` (resampled with replacement); None when empty."""
    values = np.asarray(values, dtype=float)
    if values.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(samples, values.size))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return [float(low), float(high)]


def kendall_tau_c(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Kendall's tau-c (Stuart's) of paired values: 2 (C - D) / (n^2 (m - 1) / m), C and D the concordant and
    discordant pairs, m the smaller number of distinct values of x and of y. None when it is undefined
    (fewer than two pairs, or one side constant)."""
    if len(x) != len(y):
        raise ValueError(f"kendall_tau_c: {len(x)} values against {len(y)}")
    n = len(x)
    m = min(len(set(x)), len(set(y)))
    if n < 2 or m < 2:
        return None
    def sign(v: float) -> int:
        return (v > 0) - (v < 0)

    # Concordant minus discordant pairs; a pair tied on either side counts as neither.
    balance = sum(sign(x[i] - x[j]) * sign(y[i] - y[j]) for i in range(n) for j in range(i + 1, n))
    return 2 * balance / (n * n * (m - 1) / m)


def summarize(scores: Sequence[Optional[float]], samples: int = SAMPLES, seed: int = SEED) -> Dict[str, Any]:
    """{"mean", "interval", "n", "unscored"} of one method's explanation scores under one protocol (None: unscored)."""
    read: List[float] = [s for s in scores if s is not None]
    return {"mean": sum(read) / len(read) if read else None, "interval": bootstrap_interval(read, samples, seed),
            "n": len(read), "unscored": len(scores) - len(read)}


def _cell(summary: Optional[Dict[str, Any]]) -> str:
    if summary is None or summary["mean"] is None:
        return "-"
    low, high = summary["interval"]
    return f"{summary['mean']:.2f} [{low:.2f}, {high:.2f}]"


def table(result: Dict[str, Any]) -> str:
    """The paper's Table 2 layout as Markdown: a row per method, a column per protocol (sentence then document
    level, each without then with the typology); each cell the mean [95% interval]."""
    protocols = result["protocols"]
    lines = ["| method | n | " + " | ".join(HEADERS[p] for p in protocols) + " |",
             "|---|---|" + "---|" * len(protocols)]
    for row in result["methods"]:
        n = max((row["scores"][p]["n"] + row["scores"][p]["unscored"] for p in protocols), default=0)
        lines.append(f"| {row['name']} | {n} | " + " | ".join(_cell(row["scores"].get(p)) for p in protocols) + " |")
    return "\n".join(lines)


def agreement_table(agreement: Mapping[str, Dict[str, Any]]) -> str:
    """Table 4's layout: Kendall's tau-c of each protocol with the people's scores."""
    lines = ["| protocol | Kendall's tau-c | explanations |", "|---|---|---|"]
    for protocol, row in agreement.items():
        tau = "-" if row["tau_c"] is None else f"{row['tau_c']:.3f}"
        lines.append(f"| {HEADERS[protocol]} | {tau} | {row['n']} |")
    return "\n".join(lines)


def agreement(result: Dict[str, Any], human: Mapping[Tuple[str, str], float]) -> Dict[str, Dict[str, Any]]:
    """{protocol: {"tau_c", "n"}}: Kendall's tau-c of people's scores (`human`: {(run name, claim_id): score})
    against each protocol's explanation scores, pooled over the methods."""
    out: Dict[str, Dict[str, Any]] = {}
    for protocol in result["protocols"]:
        pairs = [(human[(row["name"], cid)], score) for row in result["methods"]
                 for cid, score in row["explanations"][protocol].items()
                 if score is not None and (row["name"], cid) in human]
        out[protocol] = {"tau_c": kendall_tau_c([h for h, _ in pairs], [s for _, s in pairs]), "n": len(pairs)}
    return out


def explanation_stats(predictions: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """What an explanation run's metrics.json says before any judge: explanations, empty ones, mean words and
    sentences, tokens per claim, and for Self-Refine and MADR their stop reasons and mean revisions."""
    texts = [(p.get("justification") or "").strip() for p in predictions]
    n = len(predictions)
    stats: Dict[str, Any] = {"n": n, "empty": sum(not t for t in texts),
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


def stats_line(stats: Dict[str, Any]) -> str:
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


def explanation_digest(text: Optional[str]) -> str:
    """The short sha256 a rating line keeps of the explanation it rated: a changed explanation is rated again."""
    return hashlib.sha256((text or "").encode("utf-8")).hexdigest()[:16]


def read_predictions(run_dir: Union[str, os.PathLike]) -> List[Dict[str, Any]]:
    """The run's predictions, each with a claim_id and a justification (a string, possibly empty)."""
    path = Path(run_dir) / rundir.PREDICTIONS
    if not path.is_file():
        trials = sorted(Path(run_dir).glob(f"trial-*/{rundir.PREDICTIONS}"))
        hint = f" (a run of --trials: give one of its trial directories, e.g. {trials[0].parent})" if trials else ""
        raise InputError(f"{run_dir}: no {rundir.PREDICTIONS}{hint}")
    rows = rundir.read_numbered(path, missing="is a prediction without a claim_id")
    for number, row in rows:
        if not isinstance(row.get("justification") or "", str):
            raise InputError(f"{path}: line {number}: justification is not a string")
    return [row for _, row in rows]


def read_human(path: Union[str, os.PathLike], names: Mapping[str, str],
               only: Optional[str] = None) -> Dict[Tuple[str, str], float]:
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
    sums: Dict[Tuple[str, str], List[float]] = defaultdict(list)  # (row, claim_id) -> its scores
    for number, row in rows:
        where = f"--human {path}: line {number}"
        if not isinstance(row, dict) or "claim_id" not in row:
            raise InputError(f"{where}: needs a claim_id and a score")
        score = row.get("score")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(score):
            raise InputError(f"{where}: score must be a number, not {score!r}")
        run: Any = row.get("run", only)  # the line's own word; refused below unless one of `names`
        if run not in names:
            raise InputError(f"{where}: run {run!r} is none of the rows: {', '.join(sorted(names))}"
                             if run is not None else f"{where}: needs a run (several run directories are scored)")
        sums[(names[run], str(row["claim_id"]))].append(float(score))
    return {key: sum(v) / len(v) for key, v in sums.items()}


def row_name(run_dir: Union[str, os.PathLike], saved: Mapping[str, Any]) -> str:
    """A row's name: the run's method (its config.json), with "+madr" when refined, else the directory's name."""
    method = saved.get("method")
    if not method:
        return Path(run_dir).name
    return f"{method}+madr" if saved.get("refine") == "madr" and saved.get("task", "verify") == "verify" else method
