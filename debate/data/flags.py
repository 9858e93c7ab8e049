"""The parser every command line uses (run_debate.py, train_moderator.py, eval's and the faithfulness judge's):
its help names each flag's default and where that value comes from, and a bad flag is one `error:` line.

It sits in the data wing because every wing, eval/ and train/ may import data: eval's command lines use it
without importing the pipeline wing (eval reads runs, it never starts them).
"""
import argparse
import difflib
import re


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default and, where it is known, where that value comes from.

    The source is the `source` attribute `label_sources` puts on an action ("the paper's", "ours"); a
    help text that already says its default is left as it is, and so is a switch (it has no value).
    """

    def _get_help_string(self, action):
        text = action.help or ""
        if action.nargs == 0 or action.default in (None, argparse.SUPPRESS) or "default" in text:
            return text
        default = action.default
        shown = " ".join(str(v) for v in default) if isinstance(default, (list, tuple)) else str(default)
        source = getattr(action, "source", None)
        return f"{text} (default: {shown.replace('%', '%%')}{', ' + source if source else ''})".lstrip()


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose error is the one line that matters and a pointer to --help, not the usage."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"error: {message}{self.suggestion(message)}\n"
                  f"(see `{self.prog} --help` for every flag and its default)\n")

    def suggestion(self, message):
        """"; did you mean --limit?" for the flag or choice argparse's `message` refuses, when one is close; else "".
        Python 3.11's argparse offers none, and a typo otherwise costs a trip through --help."""
        unknown = re.match(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
            given = [word.split("=")[0] for word in unknown.group(1).split() if word.startswith("-")]
            meant = [(word, close(word, flags)) for word in given]
            return "".join(f"; {word}: did you mean {m}?" for word, m in meant if m)
        choice = re.match(r"argument .*: invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:
            meant = close(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
            return f"; did you mean {meant}?" if meant else ""
        return ""


def close(word, candidates):
    """The candidate nearest `word` when one is near enough to be a typo of it (difflib's ratio, 0.6), else None."""
    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None
