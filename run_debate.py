"""Verify claims on local models with DebateCV or one of the other systems of the field.

    python run_debate.py --split demo --limit 3                      # embedded demo claims and model
    python run_debate.py --split dev --evidence retrieved --data-dir DIR --model M
    python run_debate.py --method courtroom --corpus passages.jsonl --judge-models A B C ...
    python run_debate.py --method rag-cot --refine madr ...          # any method, justification refined by MADR
"""
# Only the flags' modules at the top: --help, a bad flag and a missing file answer in about a second. The run's
# modules import torch and transformers (seconds, a minute on a loaded machine), so main() imports them once the
# command line and its files have passed (debate/pipeline/preflight.py).
from debate.pipeline import cli, preflight


def parse_args(argv=None, check=False):
    """The run's RunConfig (debate.pipeline.config), built once from the flags; `check`: also refuse, in the same
    message, the files and folders the run needs and lacks (debate/pipeline/preflight.py)."""
    return cli.parse_run_args(argv, description=__doc__, check=preflight.problems if check else None)


def main(argv=None):
    config = parse_args(argv, check=True)  # every missing thing in one message, before anything heavy
    from debate.pipeline import progress, runner

    with progress.lines():  # the run's lines (the `debate` loggers at INFO) on stdout, its warnings on stderr
        return runner.main_guard(lambda: runner.run(config))


def console_main():
    """The `debatecv-run` console script: main() with nothing returned, as the script exits with
    whatever its function returns and the metrics are not an exit status."""
    main()


if __name__ == "__main__":
    main()
