"""The toolkit from Python: a notebook or another pipeline calls these instead of building CLI flags.

    from debate import Verifier, build, run
    config = build(split="demo", method="rag-cot", limit=2)   # the flags' names and defaults, checked
    metrics = run(config)                                      # = run_debate.py: the same output directory
    with Verifier(config) as verifier:                         # loads the models once
        predictions = verifier.verify([{"claim": "...", "evidence": [...]}])   # in memory, no directory
        more = verifier.verify(other_claims)                    # batch after batch, the same models
    view(config.output.output_dir, "report.html")              # = python -m eval.view: the run as one HTML file
    result = geval(["runs/a", "runs/b"], judge_model="M")     # = debatecv-geval: faithfulness per run

`build`, `load` and `save` are debate.pipeline.config's (settings by flag name; config.json).
"""
import contextlib
import gc
import os
import signal
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from debate.data import datasets, prompts
from debate.data.claims import ITEM_SHAPES, item_problem, item_shape, kind_of
from debate.data.inputs import DataError
from debate.engine import kv_pool, models, offline
from debate.methods import turns
from debate.pipeline import method_table, progress, run_claims, runner, stops
from debate.pipeline.config import COURTROOM_METHODS, RunConfig, build, load, save, to_dict  # noqa: F401 (the API's names)


def run(config: RunConfig, log: Callable[[str], Any] = print) -> Optional[dict]:
    """Verify the config's claims into its output directory exactly as run_debate.py does (resuming what
    is done); return the metrics (None for a split without gold labels).

    `log` gets each line the CLI would print, warnings too, as one string (debate.pipeline.progress.lines: the
    `debate` loggers' records for the length of the call; nothing stays attached after it).
    As in the CLI, one process writes a directory at a time (another holding it: debate.pipeline.lock.Busy),
    and Ctrl-C cuts no record: the "stopped: ..." line goes to `log` and KeyboardInterrupt propagates.
    SIGTERM is left to the host program."""
    with stops.handled(signal.SIGINT), progress.lines(log, log):
        try:
            return runner.run(build(**to_dict(config)))
        except KeyboardInterrupt as err:
            log(stops.stopped_line(err))
            raise


def courtroom_corpus(config: RunConfig) -> Optional[list]:
    """The passages the courtroom's retrieval searches where no --corpus is given and no split is read: the
    dataset's own corpus (Check-COVID's abstracts), else None (each claim's own evidence). A run of the CLI pools
    its split's evidence instead (debate.pipeline.run_claims); a Verifier's claims come batch by batch."""
    if config.method.method not in COURTROOM_METHODS or config.courtroom.corpus:
        return None
    return run_claims.own_corpus(datasets.get(config.data.dataset), config.data.data_dir)


class Verifier:
    """The config's method with its models loaded once: `verify(claims)` as often as wanted, then `close()`
    (or use it in a `with` block) to free the models.

    Verdicts are the labels of the config's dataset (`config.data.dataset`, and its split: Check-COVID's
    test-binary has two; a jsonl dataset's come from DATA_DIR/card.json): `labels` is that LabelSet. The
    config's other data settings and its output settings are not used, except that the courtroom's methods
    search, as in the CLI, --corpus or else the dataset's own corpus (Check-COVID's abstracts, read from
    config.data.data_dir); for a dataset without one, each claim's own evidence.
    """

    def __init__(self, config: RunConfig) -> None:
        self._budgets: Optional[contextlib.ExitStack] = None
        self.config = build(**to_dict(config))
        self.labels = labels_of(self.config)
        offline.set_offline()
        # This Verifier's own prompts, in use only inside its calls: another Verifier's --prompts cannot reach it.
        self.prompts = prompts.checked_set(self.config.method.prompts)
        with prompts.using(self.prompts):
            runner.check_run(self.config, [])
            self.agents = method_table.load_agents(self.config, method_table.model_roles(self.config))
            # The memory budget of its calls, decided once its weights are loaded (debate/engine/kv_pool.py), its own
            # until close() gives the process's back.
            g = self.config.generation
            self._budgets = contextlib.ExitStack()
            self._budgets.enter_context(kv_pool.kept_budgets())
            kv_pool.start_run(models.base_models(self.agents), g.gpu_memory_fraction, g.memory_gb,
                              rows=g.batch_size)
            self.settings = method_table.settings_of(self.config, self.agents)
            method_table.check_schemas(self.config, self.agents, self.settings, self.labels)
            self.options = method_table.method_options(self.config, self.labels, courtroom_corpus(self.config))
        self.streams = turns.Streams(turns.device_of(self.agents))

    def verify(self, claims: Sequence[Union[str, dict]]) -> List[dict]:
        """One prediction record per claim, in order (label, justification, label_probs, parse_status, token
        counts, ...). Nothing is written.

        A claim is a string or a dict with "claim" and optionally "evidence" (what the agents see: question-answer
        pairs {"question", "answer", "url"} or passages {"text", "url"}; none: no evidence), "claim_id" (default:
        its position) and "label" (the gold one, among `labels`).
        """
        if self.agents is None:
            raise RuntimeError("this Verifier is closed: its models were freed")
        claims = checked_claims(claims, self.labels)
        done: Dict[Any, dict] = {}
        with prompts.using(self.prompts):
            runner.verify_claims(self.config, self.agents, claims, self.settings, self.streams, self.options,
                                 lambda record: done.setdefault(record["prediction"]["claim_id"],
                                                                record["prediction"]))
        return [done[c["claim_id"]] for c in claims]

    def close(self) -> None:
        """Free the models (GPU memory included); verify() refuses afterwards."""
        self.agents = self.options = None
        if self._budgets is not None:
            self._budgets.close()
            self._budgets = None
        gc.collect()
        models.release_memory()

    def __enter__(self) -> "Verifier":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()  # None: an exception in the block goes on


def labels_of(config: RunConfig) -> Any:
    """The LabelSet of a config's dataset and split."""
    return datasets.get(config.data.dataset).labels(config.data.split, config.data.data_dir)


def checked_claims(claims: Iterable[Union[str, dict]], labels: Any) -> List[dict]:
    """Claim records (debate.data.claims' shape) of what Verifier.verify was given; a bad one is a DataError."""
    return [_claim(c, i, labels) for i, c in enumerate(claims)]


def _claim(claim, index, labels):
    """A claim record (debate.data.claims' shape) of what `verify` was given."""
    if isinstance(claim, str):
        claim = {"claim": claim}
    if not isinstance(claim, dict) or not isinstance(claim.get("claim"), str):
        raise DataError(f"claim {index}: a string or a dict with a 'claim' string, not {claim!r:.80}")
    items = []
    for k, item in enumerate(claim.get("evidence") or []):
        if not isinstance(item, dict):
            raise DataError(f"claim {index}: evidence {k}: expected {ITEM_SHAPES} (url optional), got "
                            f"{kind_of(item)}")
        if item_shape(item) is None:
            raise DataError(f"claim {index}: {item_problem(item, f'evidence[{k}]', needed=('question', 'answer'))}")
        items.append(dict(item, url=item.get("url", "")))
    label = claim.get("label")
    if label is not None and labels.canonical(label) is None:
        raise DataError(f"claim {index}: label {label!r} is not one of {', '.join(labels.labels)}")
    shape = "qa" if items and all("question" in e for e in items) else "passages" if items else "qa"
    return dict(claim, claim_id=claim.get("claim_id", index), evidence=items, evidence_shape=shape,
                label=labels.canonical(label) if label is not None else None)


def verify(claims: Sequence[Union[str, dict]], config: RunConfig) -> List[dict]:
    """Verify a few claims in memory (see Verifier.verify), loading the config's models for this one call; to
    verify batch after batch, keep a Verifier instead."""
    checked_claims(claims, labels_of(build(**to_dict(config))))  # a bad claim is refused before any model loads
    with Verifier(config) as verifier:
        return verifier.verify(claims)


def view(run_dirs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]],
         output: Union[str, os.PathLike] = "report.html", **options: Any) -> Any:
    """Write the self-contained HTML report of one run directory or several (a list) to `output`, as
    `python -m eval.view` does; return its path. `options`: trial, prompts (False leaves the prompts out),
    samples, seed, title."""
    from eval import view as report

    return report.write(run_dirs, output, **options)


def geval(run_dirs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], judge_model: Optional[str] = None,
          protocols: Union[str, Sequence[str]] = "all", human: Optional[str] = None,
          names: Optional[Sequence[str]] = None,
          batch_size: int = 8, use_4bit: Optional[bool] = None, log: Callable[[str], Any] = print) -> dict:
    """G-Eval faithfulness of the explanations (justifications) of `run_dirs` (one path or several, one row
    each) as `debatecv-geval` scores them, judged by `judge_model` (default: the embedded model) under
    `protocols` ("all" or some of sentence, sentence-typology, document, document-typology); `human`: a JSONL
    file of people's scores for Kendall's tau-c. Returns the result: per row and protocol the mean and its 95%
    bootstrap interval, and every explanation's score; eval.geval_scores.table(result) is the paper's Table 2
    layout. `log` gets the judge's lines (each run's ratings to do), as `run`'s does.
    """
    from debate.pipeline import geval_run as judge_run

    run_dirs = [run_dirs] if isinstance(run_dirs, (str, os.PathLike)) else list(run_dirs)
    protocols = judge_run.PROTOCOLS if protocols == "all" else [protocols] if isinstance(protocols, str) else protocols
    with progress.lines(log, log):
        return judge_run.evaluate([str(d) for d in run_dirs], judge_model, list(protocols), human, names,
                                  batch_size, use_4bit)
