"""The report's figures, drawn with matplotlib and kept as SVG text (eval.view puts them inline).

matplotlib is the optional extra `view` (`pip install "debatecv[view]"`): without it the report is still
written, with a line in place of each figure. Glyphs are drawn as paths (svg.fonttype "path"), so a figure
needs no font on the reader's machine, and ids are salted with a fixed string, so the same run gives the
same bytes. Nothing here knows a dataset: the labels are the run's own, in its order.
"""
import textwrap
from collections import Counter

BINS = 15  # the reliability diagram's bins, as eval.averitec.calibration's ECE
NO_VERDICT = "no verdict"
RIGHT, WRONG, NEUTRAL = "#3a7d44", "#b8403a", "#4c72b0"


def available():
    """Whether matplotlib can be imported here."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width, height):
    from matplotlib.figure import Figure

    # A Figure of its own, not pyplot's: no global state, no GUI backend chosen behind the caller's back.
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def to_svg(fig):
    """The SVG text of `fig` (text as paths, fixed ids, no date)."""
    import io

    import matplotlib

    out = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "debatecv", "font.size": 9}):
        fig.savefig(out, format="svg", metadata={"Date": None, "Creator": None})
    return out.getvalue()


def _wrap(label, width=14):
    # At spaces and slashes only: "Conflicting Evidence/Cherrypicking" splits after its slash, never mid-word.
    words = str(label).replace("/", "/ ").split(" ")
    return "\n".join(textwrap.wrap(" ".join(words), width, break_long_words=False)).replace("/ ", "/") or str(label)


def _counts_axis(ax, axis="y"):
    """Whole numbers on an axis of counts, at most a few ticks, with thousands separators."""
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MaxNLocator(nbins=5, integer=True))
    target.set_major_formatter(StrMethodFormatter("{x:,.0f}"))


def confusion(labels, golds, preds):
    """Gold (rows) against predicted (columns) counts; a column for claims without a verdict if any."""
    import numpy as np

    columns = list(labels) + ([NO_VERDICT] if any(p not in labels for p in preds) else [])
    counts = np.zeros((len(labels), len(columns)), dtype=int)
    for g, p in zip(golds, preds):
        if g in labels:
            counts[labels.index(g), columns.index(p if p in labels else NO_VERDICT)] += 1
    fig = _figure(1.6 + 0.9 * len(columns), 1.4 + 0.6 * len(labels))
    ax = fig.add_subplot()
    ax.imshow(counts, cmap="Blues", vmin=0, vmax=max(1, counts.max()))
    for (r, c), n in np.ndenumerate(counts):
        ax.text(c, r, str(n), ha="center", va="center", color="white" if n > counts.max() / 2 else "black")
    ax.set_xticks(range(len(columns)), [_wrap(c) for c in columns], rotation=30, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(len(labels)), [_wrap(g) for g in labels])
    ax.set_xlabel("predicted")
    ax.set_ylabel("gold")
    return fig


def reliability_bins(golds, probs, bins=BINS):
    """Per bin (lower, upper] of the top label's probability: (claims, mean top probability, accuracy of the
    top label), and the ECE over the claims that have probabilities and a gold label."""
    sums = [[0, 0.0, 0] for _ in range(bins)]
    for gold, p in zip(golds, probs):
        if not p or gold is None:
            continue
        top = max(p, key=lambda label: p[label] or 0.0)
        confidence = float(p[top] or 0.0)
        b = min(bins - 1, max(0, -int(-confidence * bins // 1) - 1))  # ceil(confidence * bins) - 1
        sums[b][0] += 1
        sums[b][1] += confidence
        sums[b][2] += top == gold
    n = sum(s[0] for s in sums)
    rows = [(count, conf / count if count else None, right / count if count else None) for count, conf, right in sums]
    ece = sum(count / n * abs(acc - conf) for count, conf, acc in rows if count) if n else None
    return rows, ece, n


def reliability(golds, probs, bins=BINS):
    """Accuracy of the top label against its probability, bin by bin, with the claims per bin below."""
    rows, ece, n = reliability_bins(golds, probs, bins)
    fig = _figure(5.2, 4.2)
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    width = 1 / bins
    centers = [(k + 0.5) * width for k in range(bins)]
    filled = [(x, acc) for x, (count, _, acc) in zip(centers, rows) if count]
    top.plot([0, 1], [0, 1], color="#888888", linestyle="--", linewidth=1, label="perfectly calibrated")
    top.bar([x for x, _ in filled], [acc for _, acc in filled], width=width * 0.9, color=NEUTRAL,
            label="accuracy of the top label")
    top.plot([conf for count, conf, _ in rows if count], [acc for count, _, acc in rows if count], "o",
             color="black", markersize=3, label="mean top probability in the bin")
    top.set_ylim(0, 1)
    top.set_ylabel("accuracy")
    top.set_title(f"ECE {ece:.3f} over {n} claims ({bins} bins)" if n else "no claim with probabilities")
    top.legend(loc="upper left", fontsize=7, frameon=False)
    bottom.bar(centers, [count for count, _, _ in rows], width=width * 0.9, color="#999999")
    bottom.set_xlim(0, 1)
    bottom.set_xlabel("probability of the top label")
    bottom.set_ylabel("claims")
    _counts_axis(bottom)
    return fig


def label_counts(labels, golds, preds):
    """How often each label is gold and how often predicted."""
    columns = list(labels) + ([NO_VERDICT] if any(p not in labels for p in preds) else [])
    gold_n, pred_n = Counter(golds), Counter(p if p in labels else NO_VERDICT for p in preds)
    fig = _figure(1.6 + 0.9 * len(columns), 3.2)
    ax = fig.add_subplot()
    xs = range(len(columns))
    has_gold = any(g is not None for g in golds)
    if has_gold:
        ax.bar([x - 0.2 for x in xs], [gold_n[c] for c in columns], width=0.4, color="#999999", label="gold")
    ax.bar([x + 0.2 * has_gold for x in xs], [pred_n[c] for c in columns], width=0.4, color=NEUTRAL,
           label="predicted")
    ax.set_xticks(list(xs), [_wrap(c) for c in columns], rotation=30, ha="right", rotation_mode="anchor")
    ax.set_ylabel("claims")
    _counts_axis(ax)
    ax.legend(frameon=False, fontsize=8)
    return fig


def _bars(ax, counts, title, color=NEUTRAL):
    keys = list(counts)
    ax.bar(range(len(keys)), [counts[k] for k in keys], color=color)
    ax.set_xticks(range(len(keys)), [_wrap(k, 12) for k in keys])
    ax.set_title(title)
    ax.set_ylabel("claims")
    _counts_axis(ax)


def rounds_and_stops(rounds, stops):
    """The rounds each claim took and why its debate stopped."""
    fig = _figure(7.0, 3.0)
    left, right = fig.subplots(1, 2)
    counted = Counter(r for r in rounds if r is not None)
    _bars(left, {str(k): counted[k] for k in sorted(counted)}, "rounds")
    _bars(right, dict(Counter(str(s) for s in stops if s is not None).most_common()), "stop reason", "#8172b2")
    return fig


def tokens(prompt, completion):
    """Prompt and completion tokens per claim (histograms)."""
    fig = _figure(7.0, 3.0)
    for ax, values, title in zip(fig.subplots(1, 2), (prompt, completion), ("prompt tokens", "completion tokens")):
        values = [v for v in values if v is not None]
        ax.hist(values, bins=min(30, max(1, len(set(values)))), color=NEUTRAL)
        ax.set_title(f"{title} per claim")
        ax.set_xlabel(f"tokens (total {sum(values):,})")
        ax.set_ylabel("claims")
        _counts_axis(ax)
        _counts_axis(ax, "x")
    return fig


def votes(ballots, seat_name="judge"):
    """Each seat's votes (a stacked bar per seat): `ballots` holds one list of votes (or None) per claim."""
    seats = max(len(b) for b in ballots)
    values = list(dict.fromkeys(str(v) if v is not None else "unreadable" for b in ballots for v in b))
    fig = _figure(1.8 + 0.8 * seats, 3.0)
    ax = fig.add_subplot()
    bottom = [0] * seats
    for value in values:
        heights = [sum(1 for b in ballots if len(b) > s and (str(b[s]) if b[s] is not None else "unreadable") == value)
                   for s in range(seats)]
        ax.bar(range(seats), heights, bottom=bottom, label=_wrap(value, 20))
        bottom = [a + b for a, b in zip(bottom, heights)]
    ax.set_xticks(range(seats), [f"{seat_name} {s + 1}" for s in range(seats)])
    ax.set_ylabel("claims")
    _counts_axis(ax)
    ax.legend(frameon=False, fontsize=7, loc="center left", bbox_to_anchor=(1, 0.5))
    return fig


def confidence(values, correct):
    """The courtroom's confidence, for right and wrong verdicts apart (all together without gold labels)."""
    fig = _figure(5.0, 3.0)
    ax = fig.add_subplot()
    edges = [k / 20 for k in range(21)]
    if any(c is not None for c in correct):
        ax.hist([[v for v, c in zip(values, correct) if c], [v for v, c in zip(values, correct) if c is False]],
                bins=edges, stacked=True, color=[RIGHT, WRONG], label=["right", "wrong"])
        ax.legend(frameon=False, fontsize=8)
    else:
        ax.hist(values, bins=edges, color=NEUTRAL)
    ax.set_xlim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("claims")
    _counts_axis(ax)
    return fig


def figures_for(run):
    """[(title, figure)] for a run read by eval.rundir.read_run: what its records allow."""
    claims, labels = run["claims"], run["labels"]
    golds = [c["gold"] for c in claims]
    preds = [c["pred"] for c in claims]
    has_gold = any(g is not None for g in golds)
    out = []
    if has_gold:
        out.append(("Confusion matrix", confusion(labels, golds, preds)))
        if any(c["probs"] for c in claims):
            out.append(("Reliability diagram (calibration)", reliability(golds, [c["probs"] for c in claims])))
    out.append(("Predicted and gold labels" if has_gold else "Predicted labels", label_counts(labels, golds, preds)))
    if any(c["rounds"] is not None or c["stop"] is not None for c in claims):
        out.append(("Rounds and stop reasons", rounds_and_stops([c["rounds"] for c in claims],
                                                                [c["stop"] for c in claims])))
    prompt = [c["prediction"].get("prompt_tokens") for c in claims]
    completion = [c["prediction"].get("completion_tokens") for c in claims]
    if any(isinstance(v, (int, float)) for v in prompt + completion):
        out.append(("Tokens per claim", tokens(prompt, completion)))
    ballots = [c["prediction"]["votes"] for c in claims if isinstance(c["prediction"].get("votes"), list)]
    if ballots and any(ballots):
        courtroom = any("confidence" in c["prediction"] for c in claims)
        out.append(("Judges' votes" if courtroom else "Voters' votes",
                    votes(ballots, "judge" if courtroom else "voter")))
    scored = [(c["prediction"]["confidence"], c["correct"]) for c in claims
              if isinstance(c["prediction"].get("confidence"), (int, float))]
    if scored:
        out.append(("Panel confidence", confidence([v for v, _ in scored], [c for _, c in scored])))
    return out
