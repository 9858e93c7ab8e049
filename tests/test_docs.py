"""Docs that cannot rot: every command README.md and docs/*.md show for one of our entry points uses flags that
entry point has and values its choices accept, every `--flag` the prose names exists, and every repo path and
page link they name exists. Parsers are built, never run: no model loads, nothing is written."""
import importlib
import importlib.util
import re
import shlex
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SHELL_FENCES = ("bash", "sh", "console", "shell")
# Flags of other tools a page may name in prose (pip, torchrun, pytest, lustre's mount): not ours to check.
FOREIGN_FLAGS = {"--no-deps", "--no-index", "--find-links", "--nproc_per_node", "--no-isolation"}


def _script_parser(relpath):
    """build_parser() of a script by its path (bench/x.py, run_debate.py), imported under a private name."""
    spec = importlib.util.spec_from_file_location(f"_docs_{Path(relpath).stem}", ROOT / relpath)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


@lru_cache(maxsize=None)
def parser_of(entry):
    """The argparse parser of an entry point ("run_debate.py", "eval.view", "bench/bench_view.py", ...)."""
    if entry == "run_debate.py":
        from debate.pipeline import cli

        return cli.run_parser()
    if entry.endswith(".py"):
        return _script_parser(entry)
    return importlib.import_module(entry).build_parser()


CONSOLE = {"debatecv-run": "run_debate.py", "debatecv-train": "train_moderator.py", "debatecv-view": "eval.view",
           "debatecv-geval": "debate.pipeline.geval_run"}
LAUNCHERS = ("torchrun", "accelerate")  # their own flags come first, then our script and its flags


def entry_point(words):
    """(entry point, its arguments) of a command's words, or None when it calls nothing of ours."""
    words = list(words)
    if words and words[0] in LAUNCHERS:
        script = next((i for i, w in enumerate(words) if w.endswith(".py")), None)
        return None if script is None else (words[script], words[script + 1:])
    if words and words[0] in CONSOLE:
        return CONSOLE[words[0]], words[1:]
    if len(words) >= 2 and words[0] in ("python", "python3"):
        if words[1] == "-m" and len(words) >= 3:
            module = words[2]
            ours = module.split(".")[0] in ("eval", "debate", "train")
            return (module, words[3:]) if ours else None
        script = words[1]
        if script in ("run_debate.py", "train_moderator.py") or re.fullmatch(r"bench/\w+\.py", script):
            return script, words[2:]
    return None


def commands(text):
    """(line number, command text) of every shell command in the fenced shell blocks of a page; a line ending in
    a backslash goes on on the next, `$ ` prompts are dropped."""
    found, fence, pending, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else (stripped[3:].strip() or "text")
            continue
        if fence not in SHELL_FENCES:
            continue
        if not pending:
            start = number
            stripped = stripped.removeprefix("$ ")
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        if pending + stripped:
            found.append((start, pending + stripped))
        pending = ""
    return found


def inline_commands(text):
    """(line number, command) of the inline code spans of a page's prose that call one of our entry points."""
    out = []
    for number, line, span in _prose_spans(text):
        if span.startswith(("python ", "python3 ", "debatecv-", "torchrun ", "accelerate launch ")):
            out.append((number, span))
    return out


def _prose_spans(text):
    """(line number, line, span) of every `code span` outside fenced blocks."""
    fence = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            for span in re.findall(r"`([^`]+)`", line):
                yield number, line, span


def _pieces(command):
    """The simple commands of a command line (split at &&, ||, ;, |), comments removed."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return []
    pieces, current = [], []
    for w in words:
        if w in ("&&", "||", ";", "|"):
            pieces.append(current)
            current = []
        else:
            current.append(w)
    return pieces + [current]


def _placeholder(value):
    """A value the page leaves to the reader: DIR, M, N, <split>, A|B, ..."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*", value)) or any(c in value for c in "<>|") or "..." in value


def _is_flag(word):
    """As argparse reads a word: a flag starts with "-" and is not a negative number or a quoted value with a space."""
    return word.startswith("-") and word != "-" and " " not in word and not re.fullmatch(r"-\d.*", word)


def problems_of(where, entry, args):
    """What is wrong with `args` for `entry`: unknown flags, values outside a flag's choices."""
    try:
        parser = parser_of(entry)
    except FileNotFoundError:
        return [f"{where}: {entry} does not exist"]
    except (ImportError, AttributeError) as err:
        return [f"{where}: {entry} has no parser to check against ({err})"]
    options = parser._option_string_actions
    wrong = []
    i = 0
    while i < len(args):
        word = args[i]
        i += 1
        if word == "--":
            break  # the rest goes to another program (bench_proclaim passes it to run_debate.py)
        if not _is_flag(word):
            continue
        flag, _, inline = word.partition("=")
        action = options.get(flag)
        if action is None:
            wrong.append(f"{where}: {entry} has no flag {flag}")
            continue
        values = [inline] if inline else []
        if not inline and action.nargs != 0:
            while i < len(args) and not _is_flag(args[i]):
                values.append(args[i])
                i += 1
                if action.nargs in (None, "?"):
                    break
        if action.choices is not None:
            for value in values:
                if not _placeholder(value) and value not in action.choices:
                    wrong.append(f"{where}: {entry} {flag} does not accept {value!r} "
                                 f"(choices: {', '.join(map(str, action.choices))})")
    return wrong


def _rel(page):
    return page.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", DOCS, ids=_rel)
def test_every_documented_command_uses_flags_and_choices_its_entry_point_has(page):
    text = page.read_text(encoding="utf-8")
    wrong, checked = [], 0
    for number, command in commands(text) + inline_commands(text):
        for words in _pieces(command):
            found = entry_point(words)
            if found is not None:
                checked += 1
                wrong += problems_of(f"{_rel(page)}:{number}", *found)
    assert not wrong, "\n".join(wrong)


def test_the_checker_catches_a_renamed_flag_and_a_bad_choice():
    # The checker itself: a flag that is not there, and a choice a flag does not accept, are both reported
    # with the page, line and flag; a placeholder value is not.
    assert problems_of("x.md:3", "run_debate.py", ["--split", "dev", "--max-round", "3"]) == [
        "x.md:3: run_debate.py has no flag --max-round"]
    assert problems_of("x.md:4", "run_debate.py", ["--method", "debatecvv"])[0].startswith(
        "x.md:4: run_debate.py --method does not accept 'debatecvv'")
    assert problems_of("x.md:5", "run_debate.py", ["--method", "METHOD", "--evidence=golden"]) == []
    found = entry_point(shlex.split("torchrun --nproc_per_node 4 run_debate.py --split dev"))
    assert found == ("run_debate.py", ["--split", "dev"])
    assert commands("```bash\npython run_debate.py --split dev \\\n    --model M   # note\n```\n") == [
        (2, "python run_debate.py --split dev --model M   # note")]


USER_ENTRIES = ("run_debate.py", "train_moderator.py", "eval.averitec", "eval.compare", "eval.evidence_score",
                "eval.view", "eval.trials", "eval.meteor", "debate.pipeline.geval_run")


# Pages about more than the tools their commands call: the docs' index and the benchmarks name every tool's
# flags, and the API's keyword arguments are the run's flags.
PAGE_TOOLS = {"docs/README.md": set(USER_ENTRIES), "docs/BENCHMARKS.md": set(USER_ENTRIES),
              "docs/api.md": {"run_debate.py"}}
# The names a line of prose may use for a tool, to name a flag of a tool other than the page's.
TOOL_NAMES = {"run_debate.py": ("run_debate", "debatecv-run"), "train_moderator.py": ("train_moderator",
                                                                                      "debatecv-train"),
              "debate.pipeline.geval_run": ("debatecv-geval", "geval"), "eval.view": ("eval.view", "debatecv-view")}


def page_tools(text, page=None):
    """The entry points a page's commands call: the tools its prose is about."""
    tools = set(PAGE_TOOLS.get(_rel(page), ())) if page is not None else set()
    for _, command in commands(text) + inline_commands(text):
        for words in _pieces(command):
            found = entry_point(words)
            if found is not None:
                tools.add(found[0])
    return tools


def flags_of(tools):
    flags = set()
    for entry in tools:
        flags |= set(parser_of(entry)._option_string_actions)
    return flags


@pytest.mark.parametrize("page", DOCS, ids=_rel)
def test_every_flag_the_prose_names_belongs_to_the_pages_own_tools(page):
    # A page's prose names flags on their own (`--madr-iterations N`); each must be a flag of a tool the page's
    # own commands call (of any user-facing entry point on a page that calls none), so that a flag of another
    # tool is not passed off as this one's. The benchmarks page names its scripts' flags too.
    text = page.read_text(encoding="utf-8")
    tools = page_tools(text, page) or set(USER_ENTRIES)
    flags = flags_of(tools)
    wrong, lines = [], text.splitlines()
    for number, line, span in _prose_spans(text):
        if span.startswith(("python ", "python3 ", "debatecv-", "torchrun ", "accelerate ")):
            continue  # a whole command: checked against its own entry point above
        for flag in re.findall(r"(?<![\w-])(--[a-z0-9][a-z0-9-]*)", span):
            if flag in flags or flag in FOREIGN_FLAGS or (page.name == "BENCHMARKS.md" and _bench_flag(flag)):
                continue
            owners = [entry for entry in USER_ENTRIES if flag in parser_of(entry)._option_string_actions]
            said = " ".join(lines[max(0, number - 3):number])
            if any(name in said for owner in owners for name in TOOL_NAMES.get(owner, (owner,))):
                continue  # the sentence says whose flag it is (on this line or the two before)
            wrong.append(f"{_rel(page)}:{number}: {flag} is not a flag of this page's tools "
                         f"({', '.join(sorted(tools))}); it is one of: {', '.join(owners) or 'none'}")
    assert not wrong, "\n".join(wrong)


@lru_cache(maxsize=None)
def _bench_flags():
    flags = set()
    for script in sorted((ROOT / "bench").glob("*.py")):
        flags |= set(parser_of(script.relative_to(ROOT).as_posix())._option_string_actions)
    return flags


def _bench_flag(flag):
    return flag in _bench_flags()


REPO_PATH = re.compile(r"(?:debate|eval|train|bench|tests|prompts|docs)/[\w./-]*|(?:run_debate|train_moderator)\.py"
                       r"|setup\.cfg|pyproject\.toml|README\.md")


@pytest.mark.parametrize("page", DOCS, ids=_rel)
def test_every_repo_path_and_page_link_exists(page):
    text = page.read_text(encoding="utf-8")
    wrong = []
    for number, _, span in _prose_spans(text):
        for word in span.split():
            word = word.strip(",;:()")
            # bench/out/ holds what the benchmarks write (not in the repository)
            if REPO_PATH.fullmatch(word) and not word.startswith("bench/out/") and not (ROOT / word).exists():
                wrong.append(f"{_rel(page)}:{number}: `{word}` does not exist")
    for number, line in enumerate(text.splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists():
                wrong.append(f"{_rel(page)}:{number}: link {target} leads nowhere")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                wrong.append(f"{_rel(page)}:{number}: link {target}: {linked.name} has no heading #{anchor}")
    assert not wrong, "\n".join(wrong)


@lru_cache(maxsize=None)
def anchors(page):
    """The #anchors of a Markdown page's headings, as GitHub makes them (lower case, punctuation dropped,
    spaces as hyphens, a repeated heading numbered -1, -2, ...), and any <a id/name="..."> in it."""
    found, seen = set(), {}
    fence = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.strip().startswith("```"):
            fence = not fence
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading and not fence:
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
        found |= set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return found


def test_the_link_check_catches_a_broken_anchor(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Top\n## Two words, and `code`\n## Two words, and `code`\n", encoding="utf-8")
    assert anchors(page) == {"top", "two-words-and-code", "two-words-and-code-1"}


def test_the_front_page_is_short_and_shows_the_demo_and_the_averitec_command():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    first_screen = "\n".join(readme.splitlines()[:60])
    assert "python run_debate.py --split demo" in first_screen
    assert "python run_debate.py --split dev --evidence retrieved --data-dir DIR" in first_screen
    for page in ("averitec", "methods", "courtroom", "madr", "explain", "training", "datasets", "viewer", "api",
                 "gpus", "runs"):
        assert f"(docs/{page}.md)" in readme, f"the front page does not link docs/{page}.md"


# --- one source for every figure the pages repeat (issue 49) ------------------------------------------------------

TABLE_START, TABLE_END = "<!-- bench/memory_plan.py --docs -->", "<!-- end -->"
# A claims-in-flight figure of the plan, in the words pages have used for it: "fits 15 claims at once", "keeps 6 to
# 10 claims' caches at once", "batch <= 13 fits", "from 14 claims in flight to 13". A run's own log line ("2 claims in
# flight at most", quoted from a measured run) is a measurement, not the plan's figure.
PLAN_FIGURE = re.compile(r"(?:\b\d+(?: to \d+)? claims?(?:'s caches|' caches)?\s+(?:at once|in flight(?! at most)))"
                         r"|(?:\bfits \d+ claims)|(?:\bbatch <= \d+)")


def page_text(page):
    return page.read_text(encoding="utf-8")


def test_the_claims_in_flight_table_is_the_memory_plans_own():
    """gpus.md's table is what `bench/memory_plan.py --docs` prints: the plan's arithmetic changes, the page fails here
    until the table is printed again."""
    spec = importlib.util.spec_from_file_location("_docs_memory_plan", ROOT / "bench" / "memory_plan.py")
    plan = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plan)
    text = page_text(ROOT / "docs" / "gpus.md")
    assert text.count(TABLE_START) == 1 and text.count(TABLE_END) >= 1
    shown = text.split(TABLE_START)[1].split(TABLE_END)[0].strip()
    assert shown == plan.docs_table(plan.shape(plan.LLAMA_31_8B))


def test_no_page_quotes_the_plans_claims_in_flight_but_its_table():
    """The figure lives in one table; every other page (and gpus.md's own prose) links to it instead of quoting it, so
    two pages cannot give two numbers for it (4bit.md said 15 / 11, gpus.md 6 to 10, BENCHMARKS 13 / 9)."""
    quoted = {}
    for page in DOCS:
        text = page_text(page)
        if page.name == "gpus.md" and TABLE_START in text:
            text = text.split(TABLE_START)[0] + text.split(TABLE_START)[1].split(TABLE_END, 1)[-1]
        found = PLAN_FIGURE.findall(" ".join(text.split()))
        if found:
            quoted[page.name] = found
    assert quoted == {}


def test_the_claims_in_flight_check_finds_the_words_pages_used():
    said = ["the debate in NF4 fits 15 claims at once (bf16: 11)", "an 8B model keeps 6 to 10 claims' caches at once",
            "| yes, batch <= 13 fits |", "80 GB NF4 went from 14 claims in flight to 13"]
    assert all(PLAN_FIGURE.search(s) for s in said)
    assert not PLAN_FIGURE.search("of a 2.00 GiB budget; 2 claims in flight at most; no cache dropped")


def sentences(page):
    """A page's prose as sentences (code fences dropped, lines joined)."""
    prose = re.sub(r"```.*?```", " ", page_text(page), flags=re.S)
    return re.split(r"(?<=[.!?])\s+(?=[A-Z`(*])", " ".join(prose.split()))


def test_the_pages_say_one_thing_about_wordnet_compiled_tokens_and_precision():
    for page in DOCS:
        for s in sentences(page):
            # WordNet is optional: whatever says a thing needs it says that only METEOR does.
            if re.search(r"\bneeds? WordNet\b", s):
                assert "METEOR" in s, f"{page.name}: {s}"
    pages = {p.name if p.parent == ROOT / "docs" else "README": p for p in DOCS}
    # Compiled decoding gives the eager tokens only up to the order of summation, and every page that says so says
    # that a near-tie can fall the other way.
    for name in ("README", "gpus.md"):
        text = " ".join(page_text(pages[name]).split())
        assert "the same tokens as eagerly" in text.lower() and "near-tie" in text, name
    # NF4 is ours: the papers' precision is --no-4bit, and the front page, gpus.md and 4bit.md all say it.
    for name in ("README", "gpus.md", "4bit.md"):
        assert any("--no-4bit" in s and "papers' precision" in s for s in sentences(pages[name])), name


def test_a_timing_outside_benchmarks_says_its_date_and_pages_agree_on_it():
    dated = {}
    for page in DOCS:
        if page.name == "BENCHMARKS.md":
            continue  # its sections carry their dates
        text = " ".join(page_text(page).split())
        for m in re.finditer(r"\b\d+ min \d+ s\b", text):
            near = text[max(0, m.start() - 120):m.end() + 120]
            dates = re.findall(r"20\d\d-\d\d-\d\d", near)
            assert dates, f"{page.name}: '{m.group()}' has no date near it"
            dated.setdefault(m.group(), set()).add(min(dates, key=lambda d: abs(near.index(d) - 120)))
    assert all(len(days) == 1 for days in dated.values()), dated
