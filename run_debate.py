"""Verify claims on local models with DebateCV or one of the other systems of the field.

    python run_debate.py --split demo --limit 3                      # embedded demo claims and model
    python run_debate.py --split dev --evidence retrieved --data-dir DIR --model M
    python run_debate.py --method courtroom --corpus passages.jsonl --judge-models A B C ...
    python run_debate.py --method rag-cot --refine madr ...          # any method, justification refined by MADR
"""
from debate.pipeline import cli, progress, runner


def parse_args(argv=None):
    """The run's RunConfig (debate.pipeline.config), built once from the flags."""
    return cli.parse_run_args(argv, description=__doc__)


def main(argv=None):
    config = parse_args(argv)
    with progress.lines():  # the run's lines (the `debate` loggers at INFO) on stdout, its warnings on stderr
        return runner.main_guard(lambda: runner.run(config))


def console_main():
    """The `debatecv-run` console script: main() with nothing returned, as the script exits with
    whatever its function returns and the metrics are not an exit status."""
    main()


if __name__ == "__main__":
    main()
