"""The pipeline wing: one verification run from its settings to its output directory.

The typed run config (config), the flags of run_debate.py (cli), the run itself (runner: checks, loading,
verifying claim by claim; method_table: each method's function and models; config_file: config.json;
scoring: the scores and reports), the output files and resume (records), many processes (shards), one
writer per directory (lock), clean stops on a signal or a full disk (stops), what a run shows, its lines
and progress bar (progress), everything a run lacks said at once before torch is imported (preflight), and the CPU
threads that fit the job's allocation (threads). debate.api is the public face over it. (Not called `run`: a
subpackage of that name would shadow the API's `from debate import run`.)

May import: debate.methods, debate.engine, debate.data and eval (the scorer).
"""
