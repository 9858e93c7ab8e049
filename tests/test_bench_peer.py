"""bench/bench_peer.py without vLLM: what its recorder keeps of our rows, the order its replay adds them in (against a
stand-in engine), and how it starts each side."""
import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from bench import bench_peer
from debate.engine import chat, decode_batch, engine
from tests.tiny_models import build_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
# bench/peer_replay.py runs in the peer's venv; here it is loaded by its path, and vLLM is never imported.
_spec = importlib.util.spec_from_file_location("_peer_replay", ROOT / "bench" / "peer_replay.py")
peer_replay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_replay)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0)
    return AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def two_turns(model, tok):
    settings = engine.Settings(max_new_tokens=8)
    convs = [engine.Conversation(system=f"Claim {i}. " + "Evidence. " * (3 * i)) for i in range(3)]
    for turn in range(2):
        engine.generate(model, tok, convs, [f"Turn {turn} of claim {i}." for i in range(3)], settings)
    return convs


def test_the_recorder_keeps_each_rows_context_count_and_times_and_changes_no_token(tiny):
    model, tok = tiny
    plain = two_turns(model, tok)
    with bench_peer.Recorder() as recorder:
        convs = two_turns(model, tok)
    assert (decode_batch.Batch.submit, decode_batch.Batch.advance) == recorder._saved  # the engine's own again
    assert [c.generated for c in convs] == [c.generated for c in plain]
    rows = recorder.rows
    assert len(rows) == 6 and {r["model"] for r in rows} == {0}
    assert sum(len(r["context"]) for r in rows) == sum(c.prompt_tokens for c in convs)
    assert sum(len(r["context"]) - r["reused"] for r in rows) == sum(c.encoded_tokens for c in convs)
    assert sum(r["generated"] for r in rows) == sum(c.completion_tokens for c in convs)
    by_time = sorted(rows, key=lambda r: r["submitted"])
    first, second = by_time[:3], by_time[3:]
    assert max(r["finished"] for r in first) < min(r["submitted"] for r in second)
    assert all(r["submitted"] < r["finished"] for r in rows)
    # Each row's context is the one the engine fed: the conversation's chat up to that turn's user message.
    for turn, recorded in ((0, first), (1, second)):
        want = [chat.context_ids(tok, engine.Conversation(system=c.system, messages=c.messages[:2 * turn + 1],
                                                          generated=c.generated[:turn])) for c in convs]
        assert sorted(r["context"] for r in recorded) == sorted(want)


class FakeEngine:
    """vLLM's LLMEngine as the replay uses it: a request runs for as many steps as its max_tokens, one token a step,
    and its prompt had `cached` tokens from the prefix cache."""

    def __init__(self, cached=0):
        self.running, self.clock, self.added, self.cached = {}, 0, [], cached

    def add_request(self, request_id, prompt, params):
        self.added.append((request_id, self.clock, params))
        self.running[request_id] = [params["max_tokens"], []]

    def has_unfinished_requests(self):
        return bool(self.running)

    def step(self):
        self.clock += 1
        out = []
        for rid, (left, ids) in list(self.running.items()):
            ids.append(0)
            if len(ids) == left:
                del self.running[rid]
                out.append(SimpleNamespace(request_id=rid, finished=True, num_cached_tokens=self.cached,
                                           outputs=[SimpleNamespace(token_ids=ids)]))
        return out


def test_the_replay_starts_a_row_once_the_rows_that_finished_before_it_have():
    rows = [{"context": [1] * 10, "generated": 5, "submitted": 0.0, "finished": 5.0},  # 0
            {"context": [1] * 20, "generated": 2, "submitted": 0.0, "finished": 3.0},  # 1
            {"context": [1] * 30, "generated": 1, "submitted": 4.0, "finished": 8.0},  # 2: after 1 (not 0)
            {"context": [1] * 40, "generated": 3, "submitted": 6.0, "finished": 9.0}]  # 3: after 0 and 1
    fake = FakeEngine(cached=4)
    wall, encoded, generated = peer_replay.replay(fake, rows, peer_replay.request_settings, clock=lambda: fake.clock)
    start = {int(rid): at for rid, at, _ in fake.added}
    assert start == {0: 0, 1: 0, 2: 2, 3: 5}  # 1 ends at step 2, 0 at step 5
    assert [p for _, _, p in sorted(fake.added)] == [
        dict(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True) for n in (5, 2, 1, 3)]
    assert (wall, encoded, generated) == (8, 100 - 4 * 4, 11)
    assert peer_replay.schedule(rows) == [0, 0, 1, 2]


def test_each_side_is_pinned_and_the_peer_gets_vllms_cpu_settings(tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    argv = ["--peer-venv", str(tmp_path), "--cores", "0", "1", "--", "--compile"]
    args = bench_peer.parse(argv)
    assert args.ours == ["--compile"]
    ours = bench_peer.ours_command(args, argv, tmp_path / "rows.json")
    assert ours[:3] == ["taskset", "-c", "0"] and ours[-2:] == ["--", "--compile"]
    assert ours[ours.index("--record") + 1] == str(tmp_path / "rows.json")
    env = bench_peer.peer_env(args)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert str(tmp_path / "lib" / "libiomp5.so") in env["LD_PRELOAD"].split(":")
    peer = bench_peer.peer_command(args, "rows.json", "model", "eager", "out.json", "go")
    assert peer[:3] == ["taskset", "-c", "1"] and "--eager" in peer
    run = bench_peer.run_argv(args, "M", "OUT")
    assert run[-1] == "--compile" and run[run.index("--threads") + 1] == "1" and run[run.index("--limit") + 1] == "16"
    demo = bench_peer.run_argv(bench_peer.parse(["--model", "demo"]), "M", "OUT")
    assert demo[:4] == ["--split", "demo", "--limit", "3"] and "--model" not in demo
