"""A run directory read back whole, for the report (eval.view): its settings, metrics and, claim by claim,
the prediction, the transcript and the evidence the agents saw.

Nothing here knows a dataset: the labels come from the run itself (metrics.json's or config.json's
`labels`, else the confusion matrix, the `label_probs` keys, the gold and predicted labels), and every
field a record carries is kept, known to the report or not. Reading never changes a byte (a torn last
line of a run that is still writing is skipped, not cut off).
"""
import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from debate.data import jsonl
from eval.averitec import InputError

PREDICTIONS = "predictions.jsonl"
TRANSCRIPTS = "transcripts.jsonl"
CONFIG = "config.json"
METRICS = "metrics.json"
SUBMISSION = "submission.json"
TOKEN_KEYS = ("prompt_tokens", "encoded_tokens", "completion_tokens")


def read_json(path: Union[str, Path]) -> Any:
    """The JSON value of `path`, None when there is no such file."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}): {err.msg}") from None


def read_lines(path: Union[str, Path]) -> List[dict]:
    """The JSON objects of the JSONL file `path` ([] without it); a torn last line (a run still writing) is
    left out."""
    return [row for _, row in read_numbered(path)]


def read_numbered(path: Union[str, Path],
                  missing: str = "is not a JSON object with a claim_id") -> List[Tuple[int, dict]]:
    """(line number, object) of the run file `path` ([] without it), each with a claim_id (`missing`: the words
    for a line without one); a torn last line (a run still writing) is left out."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        raw = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: cannot read: {err}") from None
    if not raw.endswith("\n"):
        raw = raw[: raw.rfind("\n") + 1]
    try:
        rows = list(jsonl.numbered(raw))
    except jsonl.BadLine as err:
        raise InputError(f"{path}: line {err.lineno} is not valid JSON: {err.error.msg}") from None
    for number, row in rows:
        if not isinstance(row, dict) or "claim_id" not in row:
            raise InputError(f"{path}: line {number} {missing}")
    return rows


def trial_dirs(path: Union[str, Path]) -> List[Path]:
    """trial-1/, trial-2/, ... of a `--trials` run, in order ([] for a run of one trial)."""
    found = [p for p in Path(path).glob("trial-*") if p.is_dir() and p.name[6:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[6:]))


def _key(claim_id):
    # The report keys claims by text: 7 and "7" are the same claim, as the scorer takes them.
    return str(claim_id).strip()


def label_set(config, metrics, predictions):
    """The run's labels in a stable order: the dataset's own list where the run records one, then whatever
    else the run names (confusion rows, `label_probs` keys in their order, then gold and predicted labels
    sorted)."""
    config, metrics = config or {}, metrics or {}
    dataset = config.get("dataset")
    declared = [source for source in (metrics.get("labels"), config.get("labels"),
                                      dataset.get("labels") if isinstance(dataset, dict) else None)
                if isinstance(source, list) and all(isinstance(x, str) for x in source)]
    ordered = list(declared[0]) if declared else []
    confusion = metrics.get("confusion")
    if isinstance(confusion, dict):
        ordered += [k for k in confusion if isinstance(confusion[k], dict) and "mean" not in confusion[k]]
    for p in predictions:
        if isinstance(p.get("label_probs"), dict):
            ordered += list(p["label_probs"])
    named = {p.get(key) for p in predictions for key in ("label", "gold_label")}
    ordered += sorted(x for x in named if isinstance(x, str))
    return list(dict.fromkeys(ordered))


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def claim_row(prediction, transcript, submitted, position):
    """One claim as the report shows it: its table row and the whole of what the run recorded of it."""
    gold = prediction.get("gold_label", prediction.get("gold"))
    label = prediction.get("label")
    probs = prediction.get("label_probs") if isinstance(prediction.get("label_probs"), dict) else None
    rounds = prediction.get("rounds")
    rounds = len(rounds) if isinstance(rounds, list) else _number(rounds)
    tokens = [_number(prediction.get(k)) for k in ("prompt_tokens", "completion_tokens")]
    evidence = prediction.get("evidence")
    if not isinstance(evidence, list):
        evidence = (transcript or {}).get("evidence") or (submitted or {}).get("evidence") or []
    return {
        "i": position,
        "id": _key(prediction["claim_id"]),
        "claim": (transcript or {}).get("claim") or (submitted or {}).get("claim") or "",
        "gold": gold,
        "pred": label,
        "probs": probs,
        "p": _number(probs.get(label)) if probs and isinstance(label, str) else None,
        "rounds": rounds,
        "stop": prediction.get("stop_reason"),
        # A record with no label key at all (an explanation task's) was never asked for a verdict.
        "correct": None if gold is None or "label" not in prediction else label == gold,
        "tokens": sum(t for t in tokens if t is not None) if any(t is not None for t in tokens) else None,
        "prediction": prediction,
        "turns": (transcript or {}).get("turns") or [],
        "transcript_extra": {k: v for k, v in (transcript or {}).items() if k not in ("claim_id", "claim", "turns")},
        "evidence": evidence,
    }


def _mtime(path):
    try:
        stamp = Path(path).stat().st_mtime
    except OSError:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def read_run(path: Union[str, Path], trial: Optional[int] = None) -> dict:
    """A run directory as a dict: path, config, metrics, labels, claims (see claim_row), token totals and,
    for a `--trials` run, its trials' metrics (claims then come from trial `trial`, default 1).

    Raises InputError (one line naming the path) for anything that is not a run directory."""
    top = Path(path)
    if not top.is_dir():
        raise InputError(f"{top}: not a run directory (no such directory)" if not top.exists()
                         else f"{top}: not a run directory (a file)")
    trials = trial_dirs(top)
    if trial is not None and not trials and trial != 1:
        raise InputError(f"{top}: a run of one trial, there is no trial {trial}")
    if trials and (trial or 1) > len(trials):
        raise InputError(f"{top}: has {len(trials)} trials, there is no trial {trial}")
    here = trials[(trial or 1) - 1] if trials else top
    if not (here / PREDICTIONS).is_file():
        raise InputError(f"{here}: not a run directory (no {PREDICTIONS} in it)")
    config = read_json(top / CONFIG) or read_json(here / CONFIG)
    metrics = read_json(top / METRICS)
    predictions = read_lines(here / PREDICTIONS)
    transcripts: Dict[str, dict] = {}
    for row in read_lines(here / TRANSCRIPTS):
        transcripts.setdefault(_key(row["claim_id"]), row)
    submission = read_json(here / SUBMISSION)
    submitted = {_key(s["claim_id"]): s for s in submission if isinstance(s, dict) and "claim_id" in s} \
        if isinstance(submission, list) else {}
    claims: List[dict] = []
    seen: set = set()
    for prediction in predictions:
        key = _key(prediction["claim_id"])
        if key in seen:
            continue  # a resumed run keeps the first line of a claim, as the runner does
        seen.add(key)
        claims.append(claim_row(prediction, transcripts.get(key), submitted.get(key), len(claims)))
    totals = {k: sum(_number(p.get(k)) or 0 for p in predictions) for k in TOKEN_KEYS
              if any(_number(p.get(k)) is not None for p in predictions)}
    return {
        "path": str(top),
        "name": top.resolve().name,
        "config": config if isinstance(config, dict) else {},
        "metrics": metrics if isinstance(metrics, dict) else None,
        "trials": len(trials),
        "trial": (trial or 1) if trials else None,
        "trial_metrics": [read_json(t / METRICS) for t in trials],
        "trial_correct": [_correct_by_claim(read_lines(t / PREDICTIONS)) for t in trials] if trials else None,
        "labels": label_set(config if isinstance(config, dict) else {}, metrics if isinstance(metrics, dict) else {},
                            [c["prediction"] for c in claims]),
        "claims": claims,
        "tokens": totals,
        "written": {"config.json": _mtime(here / CONFIG), "last prediction": _mtime(here / PREDICTIONS)},
    }


def _correct_by_claim(predictions):
    """claim key -> whether the prediction is right, over the claims with a gold label (for the paired test)."""
    out = {}
    for p in predictions:
        gold = p.get("gold_label", p.get("gold"))
        if gold is not None and "label" in p:
            out.setdefault(_key(p["claim_id"]), p["label"] == gold)
    return out
