"""Run outputs: append-only JSONL written claim by claim, so a killed run resumes where it stopped.

A claim is done once its prediction line is on disk. The transcript line is written first, so after a
crash between the two, resuming drops the orphan transcript and debates that claim again.
"""
import json
import os
import shutil
from pathlib import Path

from debate.data import jsonl

# The settings that change what a run predicts (config fields marked identity, and the prompts' hash).
from debate.pipeline.config import IDENTITY_KEYS

# The run's files are named once, where eval reads them back.
from eval.rundir import CONFIG, METRICS, PREDICTIONS, SUBMISSION, TRANSCRIPTS

RUN_FILES = (PREDICTIONS, TRANSCRIPTS, CONFIG, METRICS, SUBMISSION)
ASIDE = ".replaced-run"  # where --overwrite keeps the earlier run until the new one has written a claim


class RunConflict(RuntimeError):
    pass


def read_jsonl(path, repair=True):
    """Complete JSON lines of `path`; a torn last line (the process died mid-write) is cut off the file,
    or with `repair=False` only skipped, so that looking never changes a byte."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    keep = raw[: raw.rfind(b"\n") + 1]
    if len(keep) != len(raw) and repair:
        with open(path, "r+b") as f:
            f.truncate(len(keep))
    try:
        return [row for _, row in jsonl.numbered(keep.decode("utf-8"))]
    except jsonl.BadLine as err:
        raise RunConflict(f"{path}:{err.lineno}: not JSON ({err.error.msg}); fix or remove the line, "
                          "or start over with --overwrite") from None


def _by_claim(rows):
    done = {}
    for row in rows:
        done.setdefault(row["claim_id"], row)
    return done


def _short(value, width=60):
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def _identity(config):
    """The identity settings of a saved config; `use_4bit` as it was really used when the config says so
    (configs written before it recorded the precision in effect say what was asked for)."""
    config = dict(config)
    loaded = config.get("models")
    if isinstance(loaded, dict) and loaded and "use_4bit" in config:
        config["use_4bit"] = any(m.get("quantized") for m in loaded.values() if isinstance(m, dict))
    # A config from before --dtype says the dtype it ran in as its precision (nf4's compute dtype is not said).
    if "dtype" not in config and config.get("precision") not in (None, "nf4"):
        config["dtype"] = config["precision"]
    return config


def check(output_dir, config, overwrite=False):
    """What a run in `output_dir` would resume from (claim_id -> prediction), read without changing a byte.

    Raises RunConflict when the directory holds claims done under other identity settings. A directory
    with no claim done holds no run: whatever config it has (a start that failed) is no conflict.
    A setting that either config does not name is not compared: the earlier run's config did not name it
    (it ran with today's default), or this run does not use it (a model flag of another method's role).
    """
    out = Path(output_dir)
    if out.exists() and not out.is_dir():
        raise RunConflict(f"--output-dir {out} is a file, not a directory")
    existing = next(d for d in (out, *out.absolute().parents) if d.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunConflict(f"--output-dir {out}: cannot write in {existing} (permission denied)")
    if overwrite:
        return {}
    done = _by_claim(read_jsonl(out / PREDICTIONS, repair=False))
    if not done and (out / ASIDE).is_dir():
        out = out / ASIDE  # an --overwrite killed before its first claim: the run aside is the directory's run
        done = _by_claim(read_jsonl(out / PREDICTIONS, repair=False))
    old = out / CONFIG
    if done and old.exists():
        try:
            before = _identity(json.loads(old.read_text(encoding="utf-8")))
        except (OSError, ValueError) as err:
            raise RunConflict(f"{old}: unreadable ({err}); fix it or start over with --overwrite") from None
        changed = [k for k in IDENTITY_KEYS if k in before and k in config and before[k] != config[k]]
        if changed:
            raise RunConflict(
                f"{out} holds {len(done)} claims done with other settings "
                f"({'; '.join(f'{k}: {_short(before[k])} -> {_short(config[k])}' for k in changed)}); "
                "use --overwrite to start over or choose another --output-dir")
    return done


def recover(output_dir):
    """Settle what an --overwrite killed without a chance to clean up (SIGKILL) left: the earlier run in
    ASIDE comes back when the new one wrote no claim; ASIDE goes when it did. Call once the checks pass."""
    out = Path(output_dir)
    aside = out / ASIDE
    if not aside.is_dir():
        return
    if _by_claim(read_jsonl(out / PREDICTIONS, repair=False)):
        shutil.rmtree(aside)
        return
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for path in aside.iterdir():
        os.replace(path, out / path.name)
    aside.rmdir()


class RunDir:
    """The output directory while a run writes to it; a context manager opened once the models are loaded.

    Resuming: torn lines and orphan transcripts are dropped, and claims are appended. With
    `overwrite`, the earlier run's files are moved into ASIDE, and deleted only once the new run has
    written its first claim. Leaving the block before any claim is written (an error, ^C) puts the
    directory back as it was found: the earlier run restored, the files of this start removed, a
    directory this run created removed, so a corrected rerun needs no --overwrite.
    """

    def __init__(self, output_dir, config, overwrite=False):
        self.out, self.config, self.overwrite = Path(output_dir), config, overwrite
        self.done, self.written, self._created, self._writer = {}, 0, False, None

    def __enter__(self):
        out = self.out
        self._created = not out.exists()
        out.mkdir(parents=True, exist_ok=True)
        if self.overwrite:
            aside = out / ASIDE
            if aside.exists():
                # An earlier --overwrite stopped before its first claim: the run aside is still the one to keep.
                for name in RUN_FILES:
                    (out / name).unlink(missing_ok=True)
            else:
                aside.mkdir()
                for name in RUN_FILES:
                    if (out / name).exists():
                        os.replace(out / name, aside / name)
        else:
            recover(out)
            self.done = _by_claim(read_jsonl(out / PREDICTIONS))
            kept, seen = [], set()
            for row in read_jsonl(out / TRANSCRIPTS):
                if row["claim_id"] in self.done and row["claim_id"] not in seen:
                    kept.append(row)
                    seen.add(row["claim_id"])
            jsonl.write(out / TRANSCRIPTS, kept)
            jsonl.write(out / PREDICTIONS, list(self.done.values()))
        write_json(out / CONFIG, self.config)
        self._writer = Writer(out)
        return self

    def write(self, record):
        self._writer.write(record)
        self.written += 1
        if self.written == 1:
            shutil.rmtree(self.out / ASIDE, ignore_errors=True)

    def __exit__(self, exc_type, exc, tb):
        try:
            self._writer.close()
        except OSError:
            if exc_type is None:
                raise  # leaving on an error already (a full disk): what close could not flush is cut at resume
        if self.written or self.done:
            return False
        for name in RUN_FILES:
            (self.out / name).unlink(missing_ok=True)
        aside = self.out / ASIDE
        if aside.exists():
            for path in aside.iterdir():
                os.replace(path, self.out / path.name)
            aside.rmdir()
        if self._created:
            try:
                self.out.rmdir()
            except OSError:
                pass  # something else was put there meanwhile; leave it
        return False


def write_json(path, obj):
    """`obj` as indented JSON in `path`, written atomically (debate.data.jsonl.write_atomically)."""
    jsonl.write_atomically(path, lambda f: f.write(json.dumps(obj, indent=2, ensure_ascii=False) + "\n"))


class Writer:
    """Appends one claim's transcript and prediction, flushed to disk before the next claim."""

    def __init__(self, output_dir):
        out = Path(output_dir)
        self._transcripts = open(out / TRANSCRIPTS, "a", encoding="utf-8", newline="\n")
        self._predictions = open(out / PREDICTIONS, "a", encoding="utf-8", newline="\n")

    def write(self, record):
        # The transcript is durable before the prediction that marks the claim done is written.
        for f, row in ((self._transcripts, record["transcript"]), (self._predictions, record["prediction"])):
            try:
                jsonl.append_durably(f, [row])
            except OSError as err:  # a full disk: name the file (a failed write names none)
                err.filename = err.filename or f.name
                raise

    def close(self):
        try:
            self._transcripts.close()
        finally:
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
            # The predicted label under the official shape's key only: a second "label" key (it was there until
            # issue 54) read as the gold label beside dev.json's. eval.averitec still reads old files' "label".
            "pred_label": p["label"],
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
