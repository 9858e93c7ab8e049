"""Run outputs: append-only JSONL written claim by claim, so a killed run resumes where it stopped.

A claim is done once its prediction line is on disk. The transcript line is written first, so after a
crash between the two, resuming drops the orphan transcript and debates that claim again.
"""
import json
import os
from pathlib import Path

PREDICTIONS = "predictions.jsonl"
TRANSCRIPTS = "transcripts.jsonl"
CONFIG = "config.json"
METRICS = "metrics.json"
SUBMISSION = "submission.json"

# Settings that change what a run predicts; resuming under different ones would mix two experiments.
IDENTITY_KEYS = ("method", "refine", "split", "data_dir", "evidence", "retrieved_file", "debater_model",
                 "moderator_model", "defense_model", "judge_models", "refine_model", "moderator_adapter", "use_4bit",
                 "temperature", "top_p", "seed", "max_new_tokens", "max_rounds", "voters", "corpus", "embedder",
                 "top_k", "novelty_threshold", "novelty_stop", "plateau_delta", "admit_threshold",
                 "dispute_threshold", "reflection_weights", "vote_weight", "quality_weight", "role_switch", "witness",
                 "madr_iterations", "structured", "prompts_hash")


class RunConflict(RuntimeError):
    pass


def read_jsonl(path):
    """Complete JSON lines of `path`; a torn last line (the process died mid-write) is cut off the file."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    keep = raw[: raw.rfind(b"\n") + 1]
    if len(keep) != len(raw):
        with open(path, "r+b") as f:
            f.truncate(len(keep))
    rows = []
    for number, line in enumerate(keep.decode("utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise RunConflict(f"{path}:{number}: not JSON ({err.msg}); fix or remove the line, "
                                  "or start over with --overwrite") from None
    return rows


def prepare(output_dir, config, overwrite=False):
    """Create or reopen a run directory; return the predictions already made (claim_id -> row)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in (PREDICTIONS, TRANSCRIPTS, METRICS, SUBMISSION):
            (out / name).unlink(missing_ok=True)
    old = out / CONFIG
    if old.exists() and (out / PREDICTIONS).exists():
        before = json.loads(old.read_text())
        # A setting the earlier run's config does not name did not exist then: it ran with today's default.
        changed = [k for k in IDENTITY_KEYS if k in before and before[k] != config.get(k)]
        if changed:
            raise RunConflict(
                f"{out} holds a run with other settings ({', '.join(f'{k}: {before.get(k)!r} -> {config.get(k)!r}' for k in changed)}); "
                "use --overwrite to start over or choose another --output-dir")
    done = {}
    for row in read_jsonl(out / PREDICTIONS):
        done.setdefault(row["claim_id"], row)
    kept, seen = [], set()
    for row in read_jsonl(out / TRANSCRIPTS):
        if row["claim_id"] in done and row["claim_id"] not in seen:
            kept.append(row)
            seen.add(row["claim_id"])
    _rewrite(out / TRANSCRIPTS, kept)
    _rewrite(out / PREDICTIONS, list(done.values()))
    write_json(out / CONFIG, config)
    return done


def _rewrite(path, rows):
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def write_json(path, obj):
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


class Writer:
    """Appends one claim's transcript and prediction, flushed to disk before the next claim."""

    def __init__(self, output_dir):
        out = Path(output_dir)
        self._transcripts = open(out / TRANSCRIPTS, "a", encoding="utf-8")
        self._predictions = open(out / PREDICTIONS, "a", encoding="utf-8")

    def write(self, record):
        for f, row in ((self._transcripts, record["transcript"]), (self._predictions, record["prediction"])):
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def close(self):
        self._transcripts.close()
        self._predictions.close()


def read_predictions(output_dir):
    return read_jsonl(Path(output_dir) / PREDICTIONS)


def submission(predictions, claims):
    """Predictions in the official AVeriTeC shape: the evidence the system used, as `questions`.

    That is the claim's evidence, unless the prediction names its own (the courtroom's admitted passages).
    """
    by_id = {c["claim_id"]: c for c in claims}
    rows = []
    for p in predictions:
        claim = by_id[p["claim_id"]]
        evidence = (p["evidence"] if "evidence" in p else claim["evidence"])[:10]
        rows.append({
            "claim_id": p["claim_id"],
            "claim": claim["claim"],
            "pred_label": p["label"],
            "label": p["label"],
            "justification": p["justification"],
            # What the scorer reports for our own runs: rounds, tokens, how the verdict was read.
            **{k: p[k] for k in ("rounds", "parse_status", "prompt_tokens", "encoded_tokens",
                                 "completion_tokens", "justification_unrefined", "label_probs") if k in p},
            "evidence": [{"question": e["question"], "answer": e["answer"], "url": e.get("url", "")}
                         for e in evidence],
            "questions": [{"question": e["question"],
                           "answers": [{"answer": e["answer"], "answer_type": "Abstractive",
                                        "source_url": e.get("url", "")}]} for e in evidence],
        })
    return rows
