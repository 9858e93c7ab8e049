"""G-Eval faithfulness of a run's explanations (MADR's Table 2); for now what an explanation run reports
before any judge.
"""
from collections import Counter

from eval.meteor import sentences


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
