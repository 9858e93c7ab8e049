"""See a run: one self-contained HTML file for one run directory or several, opened from disk in a browser.

It holds the run's settings, metrics and figures, a claim table that sorts and filters, and every claim's
debate, turn by turn; with several runs, their metrics side by side, the paired bootstrap of accuracy and
the claims whose verdict differs.

Run ``python -m eval.view RUN_DIR [RUN_DIR ...] -o report.html`` (or ``debatecv-view``, or
``debate.api.view``). The file needs no server and no network: styles, the script and the figures
(matplotlib SVG, as data: images) are inline, and its Content-Security-Policy lets it load nothing else.
Model text never becomes markup: the page is built with text nodes only, and the JSON it carries has every
``<``, ``>`` and ``&`` escaped, so a transcript holding ``</script>`` stays text. Each claim's debate is its
own JSON block, parsed only when the claim is opened, so a 500-claim run opens and filters at once.
"""
import base64
import hashlib
import html
import json
import math
import sys
from datetime import datetime, timezone
from pathlib import Path

from debate.data.flags import Parser
from eval import figures, rundir
from eval.averitec import InputError

# The numbers the page shows (its metric rows, the paired test, the differing claims) are eval/view_metrics.py's.
from eval.view_metrics import differing_claims, fmt, metric_rows, paired_accuracy

ASSETS = Path(__file__).resolve().parent
# Shown in the run's own boxes, not among its other settings.
MODEL_KEYS = ("model", "debater_model", "moderator_model", "defense_model", "judge_models", "refine_model",
              "moderator_adapter", "embedder")
EXTRA_MODEL_KEYS = ("moderator_adapter", "embedder")  # shown whether or not config.json has `models`
HEAD_KEYS = ("dataset", "split", "evidence", "method", "refine", "task")


# ---------------------------------------------------------------- text and numbers


def esc(value):
    return html.escape("" if value is None else str(value), quote=True)


def _finite(value):
    """`value` with every NaN or infinity made null: JSON.parse refuses them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def script_json(value):
    """JSON safe inside a <script> element: no "<", ">" or "&" (so no "</script>" or "<!--"), no U+2028/9."""
    text = json.dumps(_finite(value), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    for char, code in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026"), ("\u2028", "\\u2028"),
                       ("\u2029", "\\u2029")):
        text = text.replace(char, code)
    return text


# ---------------------------------------------------------------- HTML pieces


def table(head, rows, cls=""):
    """An HTML table; every cell is escaped unless it is given as ("html", markup)."""
    def cell(value, tag):
        if isinstance(value, tuple) and value and value[0] == "html":
            return f"<{tag}>{value[1]}</{tag}>"
        return f"<{tag}>{esc(value)}</{tag}>"

    head_html = "<tr>" + "".join(cell(h, "th") for h in head) + "</tr>" if head else ""
    body = "".join("<tr>" + "".join(cell(v, "td") for v in row) + "</tr>" for row in rows)
    return f'<table class="{esc(cls)}"><thead>{head_html}</thead><tbody>{body}</tbody></table>'


def run_title(run):
    config = run["config"]
    parts = [config.get(k) for k in ("method", "split", "evidence") if config.get(k)]
    if config.get("refine") not in (None, "none"):
        parts.append(f"refined by {config['refine']}")
    return f"{run['name']}" + (f" ({', '.join(map(str, parts))})" if parts else "")


def run_info(run):
    """The run's head facts, its models and its software, as two-column rows."""
    config = run["config"]
    dataset = config.get("dataset")
    rows = [("directory", run["path"])]
    if isinstance(dataset, dict):
        rows.append(("dataset", dataset.get("name") or fmt(dataset)))
    for key in HEAD_KEYS:
        if (key != "dataset" or not isinstance(dataset, dict)) and config.get(key) is not None:
            rows.append((key, fmt(config[key])))
    rows.append(("labels", ", ".join(map(str, run["labels"])) or "-"))
    rows.append(("claims shown", f"{len(run['claims']):,}" + (f" (trial {run['trial']} of {run['trials']})"
                                                            if run["trials"] else "")))
    models = config.get("models")
    if isinstance(models, dict) and models:
        for role, m in models.items():
            if isinstance(m, dict):
                extra = ", ".join(str(m[k]) for k in ("dtype", "device") if m.get(k))
                adapter = f" + adapter {m['adapter']}" if m.get("adapter") else ""
                rows.append((f"model: {role}", f"{m.get('path')}{adapter}" + (f" ({extra})" if extra else "")))
            else:
                rows.append((f"model: {role}", fmt(m)))
    else:
        rows += [(f"model: {k}", fmt(config[k])) for k in MODEL_KEYS if config.get(k) and k not in EXTRA_MODEL_KEYS]
    rows += [(k.replace("_", " "), fmt(config[k])) for k in EXTRA_MODEL_KEYS if config.get(k)]
    for name, value in (config.get("versions") or {}).items():
        rows.append((f"version: {name}", value))
    rows.append(("git commit", config.get("git_commit") or "-"))
    for what, stamp in run["written"].items():
        if stamp:
            rows.append((f"written: {what}", stamp))
    for key, total in run["tokens"].items():
        rows.append((key.replace("_", " ") + " (total)", f"{total:,}"))
    return rows


def settings_rows(config):
    shown = set(HEAD_KEYS) | set(MODEL_KEYS) | {"models", "versions", "git_commit"}
    return [(k, fmt(v)) for k, v in config.items() if k not in shown]


def figure_html(run):
    if not figures.available():
        return ('<p class="note">Figures need matplotlib, which is not installed here: '
                '<code>pip install "debatecv[view]"</code>, then build the report again.</p>')
    parts = []
    for title, fig in figures.figures_for(run):
        data = base64.b64encode(figures.to_svg(fig).encode("utf-8")).decode("ascii")
        parts.append(f'<figure><img alt="{esc(title)}" src="data:image/svg+xml;base64,{data}">'
                     f"<figcaption>{esc(title)}</figcaption></figure>")
    return '<div class="figures">' + "".join(parts) + "</div>"


def run_section(run, k):
    metrics = run["metrics"]
    if metrics is None:
        metrics_html = ('<p class="note">No metrics.json: the run has not finished, or its claims have no gold '
                        "label.</p>")
    else:
        skip = ("confusion",) if figures.available() else ()
        metrics_html = table(("metric", "value", "interval"), metric_rows(metrics, skip), "metrics")
        if run["trials"]:
            metrics_html = (f'<p class="note">Mean and sample standard deviation over {run["trials"]} trials; the '
                            f"claims below are those of trial {run['trial']} (<code>--trial K</code> for another)."
                            "</p>" + metrics_html)
    settings = settings_rows(run["config"])
    return (
        f'<section class="tab" id="tab-r{k}" data-run="{k}"><h2>{esc(run_title(run))}</h2>'
        f'<div class="columns"><div><h3>Run</h3>{table((), run_info(run), "info")}'
        + (f"<details><summary>all settings ({len(settings)})</summary>{table((), settings, 'info')}</details>"
           if settings else "")
        + f"</div><div><h3>Metrics</h3>{metrics_html}</div></div>"
        f"<h3>Figures</h3>{figure_html(run)}"
        f'<h3>Claims</h3><div class="claims" data-run="{k}"><noscript>The claim table and the debates need '
        "JavaScript.</noscript></div></section>"
    )


def compare_section(runs, samples, seed):
    names = [f"{k + 1}. {run['name']}" for k, run in enumerate(runs)]
    rows_by_run = [{name: (value, interval)
                    for name, value, interval in metric_rows(run["metrics"] or {}, ("confusion",))} for run in runs]
    metric_names = list(dict.fromkeys(name for rows in rows_by_run for name in rows))
    side = [[name] + [" ".join(x for x in rows.get(name, ("-", "")) if x) for rows in rows_by_run]
            for name in metric_names]
    tests = []
    for k in range(1, len(runs)):
        result = paired_accuracy(runs[0], runs[k], samples, seed)
        if result is None:
            tests.append((names[0], names[k], "no claim with a gold label in common", "", "", "", "", ""))
            continue
        low, high = result["ci95"]
        tests.append((names[0], names[k], f"{result['n']:,}" + (f" x {result['trials']} trials"
                                                              if result["trials"] > 1 else ""),
                      fmt(result["a"]), fmt(result["b"]), f"{result['diff']:+.4f}", f"[{low:+.4f}, {high:+.4f}]",
                      f"{result['p_value']:.4f}"))
    differ = differing_claims(runs)
    differ_rows = []
    for key, text, gold, cells in differ:
        row = [key, text, gold if gold is not None else "-"]
        for cell in cells:
            if cell is None:
                row.append("-")
            else:
                k, i, label = cell
                row.append(("html", f'<a href="#r{k}-c{i}">{esc(label if label is not None else "no verdict")}</a>'))
        differ_rows.append(row)
    return (
        '<section class="tab" id="tab-compare"><h2>Runs compared</h2>'
        f"<h3>Paired bootstrap of accuracy</h3>"
        f'<p class="note">Run 1 against each other run, over the claims both decided that have a gold label '
        f"(<code>eval.compare.paired_bootstrap</code>, {samples:,} resamples, seed {seed}; two <code>--trials</code> "
        "runs of as many trials are resampled over trials too). The AVeriTeC evidence score needs the "
        "references: <code>python -m eval.compare A B --references R</code>.</p>"
        + table(("A", "B", "claims", "accuracy A", "accuracy B", "A - B", "95% CI of A - B", "p"), tests, "numbers")
        + f"<h3>Verdicts that differ ({len(differ):,} claims)</h3>"
        + table(["claim id", "claim", "gold"] + names, differ_rows, "differ")
        + "<h3>Metrics side by side</h3>"
        + (table(["metric"] + names, side, "metrics") if side else '<p class="note">No run has a metrics.json.</p>')
        + "</section>"
    )


def debate_blocks(run, k, prompts=True):
    """One JSON block per claim: its debate, parsed by the page only when the claim is opened."""
    blocks = []
    for c in run["claims"]:
        turns = c["turns"] if prompts else [{key: v for key, v in t.items() if key != "prompt"} for t in c["turns"]]
        data = {"id": c["id"], "claim": c["claim"], "prediction": c["prediction"], "turns": turns,
                "evidence": c["evidence"], "transcript": c["transcript_extra"]}
        blocks.append(f'<script type="application/json" id="d{k}-{c["i"]}">{script_json(data)}</script>')
    return "\n".join(blocks)


def table_data(runs):
    """What the claim tables are built from: per run its name, labels and one small row per claim."""
    keys = ("i", "id", "claim", "gold", "pred", "probs", "p", "rounds", "stop", "correct", "tokens")
    return [{"name": run_title(run), "labels": run["labels"], "trial": run["trial"],
             "rows": [{key: c[key] for key in keys} for c in run["claims"]]} for run in runs]


# ---------------------------------------------------------------- the page


def build(run_dirs, trial=None, prompts=True, samples=10_000, seed=0, title=None):
    """The report of `run_dirs` (one or more run directories) as one HTML string."""
    if isinstance(run_dirs, (str, Path)):
        run_dirs = [run_dirs]
    if not run_dirs:
        raise InputError("no run directory given")
    runs = [rundir.read_run(path, trial) for path in run_dirs]
    names = [run["name"] for run in runs]
    for run in runs:
        if names.count(run["name"]) > 1:
            run["name"] = run["path"]
    return page(runs, prompts=prompts, samples=samples, seed=seed, title=title)


def page(runs, prompts=True, samples=10_000, seed=0, title=None):
    script = (ASSETS / "view.js").read_text(encoding="utf-8")
    style = (ASSETS / "view.css").read_text(encoding="utf-8")
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
    # Only this page's own script runs, and nothing can be fetched: no network, even from a hostile transcript.
    policy = (f"default-src 'none'; script-src 'sha256-{digest}'; style-src 'unsafe-inline'; img-src data:; "
              "base-uri 'none'; form-action 'none'")
    title = title or "debatecv report: " + ", ".join(run["name"] for run in runs)
    tabs = (['<button type="button" data-tab="tab-compare">compare</button>'] if len(runs) > 1 else []) + [
        f'<button type="button" data-tab="tab-r{k}">{k + 1}. {esc(run["name"])}</button>' for k, run in enumerate(runs)]
    built = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body = (compare_section(runs, samples, seed) if len(runs) > 1 else "") + "".join(
        run_section(run, k) for k, run in enumerate(runs))
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>{esc(title)}</title><style>{style}</style></head>'
        f'<body><header><h1>{esc(title)}</h1><p class="note">Built {built} by <code>eval.view</code> from '
        f"{len(runs)} run director{'y' if len(runs) == 1 else 'ies'}. Opens from the file alone: nothing here "
        f'is fetched from anywhere.</p><nav id="tabs">{"".join(tabs)}</nav></header><main>{body}</main>'
        '<aside id="debate" hidden><div class="bar"><button type="button" id="prev">&larr; previous</button>'
        '<button type="button" id="next">next &rarr;</button><button type="button" id="close">close (Esc)</button>'
        '</div><div id="debate-body"></div></aside>'
        f'<script type="application/json" id="runs-data">{script_json(table_data(runs))}</script>\n'
        + "\n".join(debate_blocks(run, k, prompts) for k, run in enumerate(runs))
        + f"\n<script>{script}</script></body></html>\n"
    )


def write(run_dirs, output="report.html", **options):
    """Write the report of `run_dirs` to `output`; return its path. Options as `build`'s."""
    output = Path(output)
    if not output.parent.is_dir():
        raise InputError(f"{output}: cannot write the report: no directory {output.parent}")
    text = build(run_dirs, **options)
    try:
        # A lone surrogate a model may have produced cannot be UTF-8; it becomes "?" rather than stopping the report.
        output.write_text(text, encoding="utf-8", errors="replace")
    except OSError as err:
        raise InputError(f"{output}: cannot write the report: {err.strerror}") from None
    return output


# ---------------------------------------------------------------- command line


def build_parser():
    parser = Parser(prog="python -m eval.view", description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (with two or more, they are "
                        "compared; the first is A of every paired test)")
    parser.add_argument("-o", "--output", default="report.html", help="the HTML file to write")
    parser.add_argument("--trial", type=int, help="for --trials runs: whose claims and debates to show (default 1)")
    parser.add_argument("--no-prompts", dest="prompts", action="store_false",
                        help="leave every turn's prompt out (a smaller file; the replies stay)")
    parser.add_argument("--samples", type=int, default=10_000, help="paired bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap resampling")
    parser.add_argument("--title", help="the page's title (default: the runs' names)")
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be positive")
    if args.trial is not None and args.trial < 1:
        parser.error("--trial counts from 1")
    try:
        path = write(args.runs, args.output, trial=args.trial, prompts=args.prompts, samples=args.samples,
                     seed=args.seed, title=args.title)
    except InputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not figures.available():
        print('note: matplotlib is not installed, so the report has no figures (pip install "debatecv[view]")',
              file=sys.stderr)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB)")
    return 0


def console_main():
    """The `debatecv-view` console script."""
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
