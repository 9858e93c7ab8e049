"""One writer per directory, clean stops and a full disk: a second process is refused, Ctrl-C and SIGTERM end a
run in one line, a full disk too, and whatever was done is kept and resumed to the uninterrupted run's result.

The runs are the tiny random model on the demo claims, greedy, so a resumed run is compared line for line.
Subprocesses signal only once a claim is on disk, and are frozen (SIGSTOP) while the test acts, so a loaded
machine cannot make a run finish before it is stopped.
"""
import contextlib
import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import run_debate
from debate.data import jsonl
from debate.engine import models
from debate.pipeline import lock, records, stops
from tests.conftest import run_argv

ROOT = Path(__file__).resolve().parents[1]
CLAIMS = 2


def restart(written):
    """What a stop's line says of the claims not written (a claim in progress keeps none of its turns)."""
    rest = CLAIMS - len(written)
    return (f"the {rest} claims not written restart from their first turn" if rest != 1
            else "the 1 claim not written restarts from its first turn")


def argv(model, out, *extra):
    # One claim at a time, so a run stopped after its first claim still has claims to go.
    return run_argv(model, out, *extra, max_new_tokens=16, limit=CLAIMS, temperature=0, batch_size=1)


@pytest.fixture(scope="module")
def whole(tiny, tmp_path_factory):
    """The uninterrupted run every stopped one must end up equal to."""
    out = tmp_path_factory.mktemp("whole") / "run"
    run_debate.main(argv(tiny, out))
    return out


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler while the test sends SIGINT to this process: a test runner started in the
    background by a non-interactive shell inherits SIGINT ignored, which a run rightly keeps ignoring."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []


def comparable(record):
    """A record less `encoded_tokens`: the prompt tokens a claim encoded depend on the pages the claims before it left
    (debate.engine.kv_pool shares pages by prefix across claims), which a resumed run has not seen."""
    return {k: v for k, v in record.items() if k != "encoded_tokens"}


def same_run(out, whole):
    """Every claim of `whole`, with the same record, and the same scores."""
    for name in (records.PREDICTIONS, records.TRANSCRIPTS):
        assert sorted(map(comparable, lines(out / name)), key=lambda r: r["claim_id"]) == \
               sorted(map(comparable, lines(whole / name)), key=lambda r: r["claim_id"]), name
    assert json.loads((out / records.METRICS).read_text()) == json.loads((whole / records.METRICS).read_text())
    assert not (out / lock.LOCK).exists()


def start(args, logs):
    """run_debate.py as a user starts it from a shell, SIGINT at its default (a non-interactive shell's children
    may inherit it ignored); its output goes to files under `logs` (a pipe nobody reads could block it)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    logs.mkdir(exist_ok=True)
    with open(logs / "stdout", "w") as stdout, open(logs / "stderr", "w") as stderr:
        proc = subprocess.Popen([sys.executable, "run_debate.py", *args], cwd=ROOT, env=env, stdout=stdout,
                                stderr=stderr, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    proc.stderr_file = logs / "stderr"
    return proc


def ended(proc, timeout=600):
    """Wait for `proc`; its stderr."""
    proc.wait(timeout=timeout)
    return proc.stderr_file.read_text()


def wait_for(condition, proc, what, timeout=300):
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: {ended(proc)[-3000:]}")
        if time.time() > deadline:
            proc.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.02)


# --- one writer ------------------------------------------------------------------------------------

HOLDER = """
import sys, time
from debate.pipeline import lock
with lock.hold(sys.argv[1]):
    print("held", flush=True)
    time.sleep(600)
"""


@contextlib.contextmanager
def held_elsewhere(directory):
    """Another process holding `directory`'s lock (no torch: it starts in a moment); SIGKILLed at the end."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()  # SIGKILL: no clean-up runs, the lock file stays with the dead holder's pid in it
        holder.wait()


def test_a_held_directory_is_refused_naming_the_holder_and_a_killed_holder_blocks_nothing(tmp_path):
    out = tmp_path / "run"
    with held_elsewhere(out) as holder:
        with pytest.raises(lock.Busy) as refused:
            with lock.hold(out):
                pytest.fail("two processes held one directory")
        message = str(refused.value)
        assert f"pid {holder.pid} on {socket.gethostname()}, started 20" in message and "\n" not in message
        assert "--output-dir" in message
    assert str(holder.pid) in (out / lock.LOCK).read_text()
    with lock.hold(out):
        assert str(os.getpid()) in (out / lock.LOCK).read_text()
    assert not (out / lock.LOCK).exists()


def test_the_lock_is_reentrant_for_its_thread_refused_to_others_and_leaves_nothing_it_made(tmp_path):
    out = tmp_path / "new" / "run"
    with lock.hold(out):
        with lock.hold(out / "."):  # the same directory, by another spelling: the holding thread goes on
            assert (out / lock.LOCK).exists()
        refusals = []

        def other():
            try:
                with lock.hold(out):
                    pass
            except lock.Busy as err:
                refusals.append(str(err))

        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert refusals and "another thread of this process" in refusals[0]
        assert (out / lock.LOCK).exists()  # the inner release did not let go
    assert not (tmp_path / "new").exists()  # made for the lock, empty again: removed
    (tmp_path / "file").write_text("")
    with pytest.raises(lock.LockError, match="is a file"):
        with lock.hold(tmp_path / "file"):
            pass


def test_a_second_run_on_a_directory_in_use_is_refused_before_loading_and_the_first_finishes_right(
        tiny, whole, tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    first = start(argv(tiny, out), tmp_path / "logs")
    holds = lambda: (out / lock.LOCK).exists() and f'"pid": {first.pid}' in (out / lock.LOCK).read_text()  # noqa: E731
    wait_for(holds, first, "the first run held its directory")
    os.kill(first.pid, signal.SIGSTOP)  # it keeps its lock, and cannot finish while the second one tries
    try:
        before = {p.name: p.read_bytes() for p in out.iterdir()}
        monkeypatch.setattr(models, "load_roles", lambda *a, **k: pytest.fail("the second run loaded weights"))
        with pytest.raises(SystemExit) as refused:
            run_debate.main(argv(tiny, out))
        assert refused.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {out} is being written by another process (pid {first.pid} on "
                              f"{socket.gethostname()}, started ") and "\n" not in err
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the second run changed nothing
    finally:
        os.kill(first.pid, signal.SIGCONT)
    stderr = ended(first)
    assert first.returncode == 0, stderr[-3000:]
    same_run(out, whole)


# --- clean stops -------------------------------------------------------------------------------------

@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_stops_a_run_in_one_line_and_the_same_command_resumes_it(tiny, whole, tmp_path, signum, code):
    out = tmp_path / "run"
    run = start(argv(tiny, out), tmp_path / "logs")
    wait_for(lambda: len(lines(out / records.PREDICTIONS)) >= 1, run, "a claim was written")
    os.kill(run.pid, signal.SIGSTOP)
    os.kill(run.pid, signum)  # delivered on SIGCONT, in the middle of the next claim
    os.kill(run.pid, signal.SIGCONT)
    stderr = ended(run)
    assert run.returncode == code, stderr[-3000:]
    assert "Traceback" not in stderr
    written = lines(out / records.PREDICTIONS)
    assert 1 <= len(written) < CLAIMS
    assert stderr.strip().splitlines()[-1] == \
        f"stopped: {len(written)} of {CLAIMS} claims written to {out}; the same command resumes: {restart(written)}"
    # No record cut: as many transcripts as predictions, each whole, each the uninterrupted run's.
    done = {p["claim_id"]: p for p in lines(whole / records.PREDICTIONS)}
    assert len(lines(out / records.TRANSCRIPTS)) == len(written)
    assert all(comparable(p) == comparable(done[p["claim_id"]]) for p in written)
    assert not (out / lock.LOCK).exists()
    run_debate.main(argv(tiny, out))
    same_run(out, whole)


@pytest.mark.parametrize("continuous", [True, False])
def test_ctrl_c_while_a_record_is_written_keeps_it_whole_and_leaves_no_thread(tiny, whole, tmp_path, monkeypatch,
                                                                             capsys, continuous, python_sigint):
    """In process: SIGINT arrives while the first record is being written. Continuously batched, a claim's own
    thread writes it and the main thread stops and joins it; in fixed batches the main thread writes it, and
    the stop waits for the write to end."""
    out = tmp_path / "run"
    write = records.Writer.write

    def interrupted(self, record):
        write(self, record)
        if len(lines(out / records.PREDICTIONS)) == 1:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)  # the main thread has its chance to act on it mid-write

    monkeypatch.setattr(records.Writer, "write", interrupted)
    # In fixed batches, also with --overwrite: the same command would start over, so the line says what resumes.
    flags = ["--continuous"] if continuous else ["--no-continuous", "--overwrite"]
    with pytest.raises(SystemExit) as stopped:
        run_debate.main(argv(tiny, out, *flags))
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"stopped: 1 of {CLAIMS} claims written to {out}; " + (
        "the same command resumes: " if continuous else "the same command without --overwrite resumes; ") + restart([1])
    assert len(lines(out / records.PREDICTIONS)) == len(lines(out / records.TRANSCRIPTS)) == 1
    assert not [t for t in threading.enumerate() if t.name.startswith("claim-")]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back as it was
    monkeypatch.undo()
    run_debate.main(argv(tiny, out))
    same_run(out, whole)


def test_the_api_takes_the_same_lock_and_a_stop_logs_the_line_and_raises(tiny, tmp_path, monkeypatch, python_sigint):
    from debate import build, run

    out = tmp_path / "api"
    config = build(split="demo", model=tiny, limit=CLAIMS, max_new_tokens=16, max_rounds=1, temperature=0,
                   batch_size=1, structured=False, output_dir=str(out))
    with held_elsewhere(out) as holder:
        with pytest.raises(lock.Busy, match=f"pid {holder.pid} "):
            run(config, log=lambda *a: None)
    write, said = records.Writer.write, []

    def interrupted(self, record):
        write(self, record)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)

    monkeypatch.setattr(records.Writer, "write", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run(config, log=said.append)
    assert said[-1] == f"stopped: 1 of {CLAIMS} claims written to {out}; the same command resumes: {restart([1])}"
    assert len(lines(out / records.PREDICTIONS)) == len(lines(out / records.TRANSCRIPTS)) == 1
    assert not (out / lock.LOCK).exists()


def test_a_deferred_section_holds_the_first_signal_and_not_the_second():
    with stops.handled(signal.SIGTERM):
        with pytest.raises(stops.Stopped) as stopped:
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
                held = stops.pending()
                finished = True
        assert held == signal.SIGTERM and finished and stopped.value.signum == signal.SIGTERM
        with pytest.raises(stops.Stopped):
            with stops.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.1)
                os.kill(os.getpid(), signal.SIGTERM)  # a second one: at once
                time.sleep(0.1)
                pytest.fail("a second signal did not stop the section")
        assert stops.pending() is None


# --- a full disk -------------------------------------------------------------------------------------

def pages(n):
    return -(-n // 4096)


def mount_small_disk(disk, size):
    """A tmpfs of `size` bytes at `disk`, where the test may mount one (root); False elsewhere."""
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(disk)],
                          capture_output=True).returncode == 0


def test_a_full_disk_is_one_line_and_loses_nothing(tiny, whole, tmp_path, capsys, monkeypatch):
    disk = tmp_path / "disk"
    disk.mkdir()
    out = disk / "run"
    # Room for the run's start and its first claim, not for all: tmpfs counts 4 KiB pages per file.
    transcripts = [len(json.dumps(t, ensure_ascii=False).encode()) + 1 for t in lines(whole / records.TRANSCRIPTS)]
    prediction = len(json.dumps(lines(whole / records.PREDICTIONS)[0], ensure_ascii=False).encode()) + 1
    config = len((whole / records.CONFIG).read_bytes()) - len(str(whole)) + len(str(out))  # its output_dir differs
    size = 4096 * (1 + pages(config) + pages(transcripts[0]) + pages(prediction))  # + 1: the lock file
    assert pages(sum(transcripts)) > pages(transcripts[0])  # the claims after the first do not fit
    mounted = mount_small_disk(disk, size)
    if not mounted:  # no tmpfs here: the second claim's transcript gets half written, then the disk is full
        append, calls = jsonl.append_durably, []

        def filling(f, rows):
            calls.append(f.name)
            if len(calls) == 3:
                text = json.dumps(rows[0])
                f.write(text[: len(text) // 2])
                f.flush()
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            append(f, rows)

        monkeypatch.setattr(jsonl, "append_durably", filling)
    try:
        with pytest.raises(SystemExit) as full:
            run_debate.main(argv(tiny, out))
        assert full.value.code == 1
        err = capsys.readouterr().err.strip().splitlines()[-1]
        kept = records.read_jsonl(out / records.PREDICTIONS, repair=False)
        assert 1 <= len(kept) < CLAIMS
        assert re.fullmatch(rf"error: No space left on device \({re.escape(str(out))}/\w+\.jsonl\); kept: "
                            rf"{len(kept)} of {CLAIMS} claims written to {re.escape(str(out))}; free some space, then "
                            f"the same command resumes: {restart(kept)}", err), err
        done = {p["claim_id"]: p for p in lines(whole / records.PREDICTIONS)}
        assert all(p == done[p["claim_id"]] for p in kept)
        assert not list(out.glob("*.tmp")) and not (out / lock.LOCK).exists()
        if mounted:
            subprocess.run(["mount", "-o", "remount,size=8m", str(disk)], check=True)
        else:
            monkeypatch.undo()
        run_debate.main(argv(tiny, out))
        same_run(out, whole)
    finally:
        if mounted:
            subprocess.run(["umount", str(disk)], check=True)


# --- train_moderator.py: the same rules --------------------------------------------------------------

def train_argv(tiny, out, syndec_file, *extra):
    return ["--stage", "sft", "--model", tiny, "--out", str(out), "--syndec", str(syndec_file), "--lora-r", "4",
            "--lora-alpha", "8", "--lr", "1e-3", "--epochs", "1", "--grad-accum", "1", "--save-every", "100",
            "--no-gradient-checkpointing", *extra]


def test_a_stopped_training_stage_checkpoints_its_step_and_resumes_to_the_same_weights(tiny, tmp_path, monkeypatch,
                                                                                      capsys):
    import torch
    from safetensors.torch import load_file

    import train_moderator
    from tests import syndec_task
    from train import losses, syndec

    source = tmp_path / "syndec.jsonl"
    syndec.write(source, syndec_task.records(4))  # 4 examples, one a step: 4 steps

    torch.manual_seed(0)
    train_moderator.main(train_argv(tiny, tmp_path / "whole", source))

    stopped_out = tmp_path / "stopped"
    with held_elsewhere(stopped_out) as holder:  # a second training command on the same OUT: one line
        with pytest.raises(SystemExit) as refused:
            train_moderator.main(train_argv(tiny, stopped_out, source))
    assert refused.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"error: {stopped_out} is being written by another process (pid {holder.pid} ")
    assert err.endswith("or choose another --out") and not (stopped_out / "sft").exists()

    sft_loss, calls = losses.sft_loss, []

    def terminated(model, batch):  # SIGTERM in the middle of step 2: the step ends, is saved, then the stop
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return sft_loss(model, batch)

    monkeypatch.setattr(losses, "sft_loss", terminated)
    torch.manual_seed(0)
    with pytest.raises(SystemExit) as stopped:
        train_moderator.main(train_argv(tiny, stopped_out, source))
    assert stopped.value.code == 143
    ckpt = stopped_out / "sft/checkpoints/step-000002"
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"stopped: D-SFT checkpoint of step 2 of 4 in {ckpt}; the same command with --resume continues from it"
    assert [json.loads(r)["step"] for r in (stopped_out / "sft/metrics.jsonl").read_text().splitlines()] == [1, 2]
    monkeypatch.undo()
    train_moderator.main(train_argv(tiny, stopped_out, source, "--resume"))
    expected = load_file(tmp_path / "whole/sft/adapter/adapter_model.safetensors")
    got = load_file(stopped_out / "sft/adapter/adapter_model.safetensors")
    assert expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
