"""Every preflight message (debate/pipeline/preflight.py, train/preflight.py) names the flag the user typed and its
path, alone on one `error:` line, and the command stops before torch is imported.

The commands run in one fresh process (this one has torch already), each in a child forked from it: a command that
gets past a check that should have stopped it, and imports torch, spoils no other case.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each command in a child of a process that imported only the scripts' flag modules; the child reports its exit
# status, what it wrote on stderr, and whether torch got imported.
SCRIPT = """\
import contextlib, io, json, os, sys
import run_debate, train_moderator
results = {}
for name, (script, argv) in json.loads(sys.argv[1]).items():
    read, write = os.pipe()
    if os.fork() == 0:
        os.close(read)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                sys.modules[script].main(argv)
                code = 0
            except SystemExit as stop:
                code = stop.code
            except BaseException as error:
                code = repr(error)
        os.write(write, json.dumps([code, err.getvalue(), 'torch' in sys.modules]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        results[name] = json.loads(answer.read())
    os.wait()
print(json.dumps(results))
"""


def cases(tmp):
    """name: (script, argv, the message's start, flag and path included). A model directory whose config.json is
    empty passes preflight (it checks paths alone) and would fail the deeper check, after torch."""
    model, data, out, file = tmp / "model", tmp / "data", tmp / "out", tmp / "file"
    no = lambda name: tmp / f"no-{name}"  # noqa: E731  a path that is not there, named for its case
    run = ["--split", "demo", "--output-dir", str(out)]
    run_model = run + ["--model", str(model)]
    train = ["--split", "demo", "--model", str(model), "--out", str(out)]
    missing_model = "no such file or directory (a Hugging Face directory or a .gguf file"
    return {
        "--model": ("run_debate", run + ["--model", str(no("model"))], f"--model {no('model')}: {missing_model}"),
        "--debater-model": ("run_debate", run_model + ["--debater-model", str(no("debater"))],
                            f"--debater-model {no('debater')}: {missing_model}"),
        "--judge-models": ("run_debate", run_model + ["--method", "courtroom", "--judge-models", str(no("judge"))],
                           f"--judge-models {no('judge')}: {missing_model}"),
        "--moderator-adapter": ("run_debate", run_model + ["--moderator-adapter", str(no("adapter"))],
                                f"--moderator-adapter {no('adapter')}: no such directory"),
        "--knowledge-store": ("run_debate", ["--split", "dev", "--data-dir", str(data), "--evidence", "retrieved",
                                             "--model", str(model), "--output-dir", str(out), "--knowledge-store",
                                             str(no("store"))], f"--knowledge-store {no('store')}: no such directory"),
        "--corpus": ("run_debate", run_model + ["--method", "courtroom", "--corpus", str(no("corpus"))],
                     f"--corpus {no('corpus')}: no such file"),
        "--prompts": ("run_debate", run_model + ["--prompts", str(no("prompts"))],
                      f"--prompts {no('prompts')}: no such directory"),
        "--output-dir": ("run_debate", ["--split", "demo", "--model", str(model), "--output-dir", str(file)],
                         f"{file}: exists and is not a directory; give --output-dir DIR"),
        "--syndec": ("train_moderator", train + ["--stage", "sft", "--syndec", str(no("syndec"))],
                     f"--syndec {no('syndec')}: no such file"),
        "--retrieved-file": ("train_moderator", train + ["--stage", "synth", "--retrieved-file", str(no("retrieved"))],
                             f"--retrieved-file {no('retrieved')}: no such file"),
        "--init-adapter": ("train_moderator", train + ["--stage", "sft", "--syndec", str(file),
                                                       "--init-adapter", str(no("init"))],
                           f"--init-adapter {no('init')}: no such directory"),
        "--out": ("train_moderator", ["--split", "demo", "--model", str(model), "--out", str(file)],
                  f"{file}: exists and is not a directory; give --out DIR"),
    }


NAMES = list(cases(Path("/")))


@pytest.fixture(scope="module")
def said(tmp_path_factory):
    """Each case's exit status, stderr and whether torch was imported, and the message it should have said."""
    tmp = tmp_path_factory.mktemp("preflight")
    (tmp / "model").mkdir()
    (tmp / "model" / "config.json").write_text("{}")
    (tmp / "data").mkdir()
    (tmp / "data" / "dev.json").write_text((ROOT / "debate/data/demo/claims.json").read_text())
    (tmp / "file").write_text("")
    every = cases(tmp)
    commands = {name: [script, argv] for name, (script, argv, _) in every.items()}
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(commands)], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    return {name: (*results[name], every[name][2]) for name in every}


@pytest.mark.parametrize("name", NAMES)
def test_each_preflight_message_names_the_flag_typed_and_its_path_before_torch(said, name):
    code, err, torch, message = said[name]
    assert code == 2, (code, err)
    assert err.startswith(f"error: {message}") and len(err.splitlines()) == 1, err
    assert not torch  # stopped on the paths alone, before the run's modules
