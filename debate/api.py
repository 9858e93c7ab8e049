"""The toolkit from Python: a notebook or another pipeline calls these instead of building CLI flags.

    from debate import build, run, verify
    config = build(split="demo", method="rag-cot", limit=2)   # the flags' names and defaults, checked
    metrics = run(config)                                      # = run_debate.py: the same output directory
    predictions = verify([{"claim": "...", "evidence": [...]}], config)   # in memory, no directory

`build`, `load` and `save` are debate.pipeline.config's (settings by flag name; config.json).
"""
import signal

from debate.data import claims as data, prompts
from debate.engine import models
from debate.pipeline import runner, stops
from debate.methods import turns
from debate.pipeline.config import RunConfig, build, load, save, to_dict  # noqa: F401 (the API's names)


def run(config, log=print):
    """Verify the config's claims into its output directory exactly as run_debate.py does (resuming what
    is done); return the metrics (None for a split without gold labels).

    As in the CLI, one process writes a directory at a time (another holding it: debate.pipeline.lock.Busy),
    and Ctrl-C cuts no record: the "stopped: ..." line goes to `log` and KeyboardInterrupt propagates.
    SIGTERM is left to the host program."""
    with stops.handled(signal.SIGINT):
        try:
            return runner.run(build(**to_dict(config)), log=log)
        except KeyboardInterrupt as err:
            log(stops.stopped_line(err))
            raise


def verify(claims, config):
    """Verify a few claims in memory with the config's method and models; return one prediction record per
    claim, in order (label, justification, label_probs, parse_status, token counts, ...). Nothing is written.

    A claim is a string or a dict with "claim" and optionally "evidence" ([{"question", "answer", "url"}],
    what the agents see; none: no evidence), "claim_id" (default: its position) and "label" (the gold one).
    The config's data and output settings are not used. The models are loaded on every call.
    """
    config = build(**to_dict(config))
    claims = [_claim(c, i) for i, c in enumerate(claims)]
    models.set_offline()
    prompts.use_prompt_dir(config.method.prompts)
    runner.check_run(config, claims)
    roles = runner.model_roles(config)
    agents = runner.load_agents(config, roles)
    settings = runner.settings_of(config)
    runner.check_schemas(config, agents, settings)
    kwargs = runner.METHODS[config.method.method][2](config)
    done = {}
    runner.verify_claims(config, agents, claims, settings, turns.Streams(turns.device_of(agents)), kwargs,
                         lambda record: done.setdefault(record["prediction"]["claim_id"], record["prediction"]))
    return [done[c["claim_id"]] for c in claims]


def _claim(claim, index):
    """A claim record (data.py's shape) of what `verify` was given."""
    if isinstance(claim, str):
        claim = {"claim": claim}
    if not isinstance(claim, dict) or not isinstance(claim.get("claim"), str):
        raise data.DataError(f"claim {index}: a string or a dict with a 'claim' string, not {claim!r:.80}")
    evidence = claim.get("evidence") or []
    for k, item in enumerate(evidence):
        if not isinstance(item, dict) or not all(isinstance(item.get(key), str) for key in ("question", "answer")):
            raise data.DataError(f"claim {index}: evidence {k}: a dict with 'question' and 'answer' strings")
    return dict(claim, claim_id=claim.get("claim_id", index),
                evidence=[dict(e, url=e.get("url", "")) for e in evidence])
