"""Issue 48: transformers' own continuous batching (`transformers.generation.continuous_batching`) against our
engine, on the embedded demo model (Gemma 3 270M, float32) on CPU, and which of our features it serves.

    python bench/bench_hf_continuous.py                                  # 8 demo claims, 24 rows, 64 new tokens
    python bench/bench_hf_continuous.py --claims 8 --max-new-tokens 96 --repeats 2
    python bench/bench_hf_continuous.py --source averitec --evidence-items 3   # AVeriTeC dev, HerO's evidence
    python bench/bench_hf_continuous.py --skip-fixed --skip-chain --skip-probes  # the free run alone

What it runs, in this order (every timed pair interleaved, ours first, so both share the machine's load):

1. The workload: DebateCV's first turn of each role for every claim, rendered by our method and our chat
   template (debatecv.start_debate, the prompts' files, chat.context_ids): the Affirmative's opening, the
   Negative's opening on the Affirmative's reply, the Moderator's round-1 prompt on both replies. Those replies
   come from an untimed preparation pass with our engine. 3 rows a claim, each a conversation's first turn.
2. `free`: every row at once, greedy, float32, a row stops at end of turn / EOS or --max-new-tokens. Ours:
   engine.generate over all rows (structured=False: HF's batching has no schema rows). HF: a
   ContinuousBatchingManager (what model.generate_batch wraps) with the config of `hf_config` below, every
   request added at once. Reported: wall seconds (HF's includes creating its manager and paged cache), generated
   tokens, tokens/s, rows whose token ids are identical, and where the others first differ.
3. `fixed`: each row's reply length drawn from a seeded lognormal (--turn-mean, sigma 0.6, capped at --turn-cap),
   stop tokens off, as vLLM's serving benchmark fixes output lengths. HF stops each request at its own length
   (add_request's max_new_tokens). Ours batched by the turn (before issue 48) has no per-row length: a call feeds a
   row that stopped masked pads until its slowest row ends (generator.run), so its cost is the cost of every row
   decoding to the longest drawn length; it runs exactly that (stop tokens off, max_new_tokens = the longest), and
   only each row's drawn length counts as useful tokens. Ours batched by the step stops each row at its own length
   (decode_batch.reply_cap) and leaves the batch then. Identity: each row's first N tokens, N its drawn length.
4. `chain`: the same three turns as a claim's coroutine, each turn built from the reply before it. Ours: one
   batched call per role (Affirmative, then Negative, then Moderator), as debatecv.run_batch does. HF: one
   running manager; a claim's next request is added (add_request) the moment its previous reply comes back
   (get_result), while the other claims keep decoding.
5. `resume`: a conversation's second turn, and a second conversation with the same system prompt (the Negative
   shares the Debaters' meta prompt with the Affirmative), on a tiny random Llama (full attention only) and on
   the demo model: prompt tokens given against prompt tokens encoded, ours (the conversation's cache, kept
   between its turns) and HF's (prefix sharing: PagedAttentionCache.search_prefix_match, counted by wrapping it).
6. `probes`, on a tiny random Llama: NF4 (bitsandbytes, our loader's --4bit), a LoRA adapter per role (peft, our
   adapter_scope), sampling with a seed (run twice; a row alone against the same row in a batch), HF's memory
   (its paged cache and attention-mask tensors, against our plan of one call, engine.batch_bytes).

How to read it: `free`, `fixed` and `chain` each hold `ours` and `hf`, one entry per repeat: `seconds` is wall
time, `tokens_per_s` generated (for `fixed`, useful) tokens a second. A forward hook counts model calls: `decode`
ones feed one token a row (ours: every row of the call, stopped or not; HF's: only the requests still decoding),
so `decode_ms_per_row_fed` is what one row of a decode step cost; HF's forwards that mix a prefill piece with
decoding rows count as prefill. Ours may run a call's rows as several batches (engine.chunk_groups keeps rows of
very different prompt lengths apart), each decoding to its own end. `gathered_bytes_per_decode_forward`: the keys
and values HF's paged cache copied out (index_select over read_index) for one decode forward, all layers.
`same_rows` counts rows whose ids match exactly; `first_difference` gives, per differing row, the index of its
first differing token. Each timed run records the machine's 1-minute load average before and after: on a shared
2-core machine figures move with it, which is why the pairs are interleaved.

--threads (default 1): on this shared 2-core machine, under a load above 2, a small matmul of a decode step
([3, 640] x [640, 2048]) took 16 to 24 ms (once 1.7) on the main thread with two OpenMP threads, against 0.7 ms
on a fresh thread and 1 ms with one thread (the likely cause, not confirmed: the OpenMP team waiting for a
descheduled thread). Our engine decodes on the main thread and HF's manager on a thread of its own, so with two
threads the comparison would measure that, not the batching. One thread puts both on the same footing.
"""
import argparse
import datetime
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import ContinuousBatchingConfig, GenerationConfig  # noqa: E402

from debate.data import averitec, claims as data  # noqa: E402
from debate.data.labels import AVERITEC  # noqa: E402
from debate.data.prompts import render  # noqa: E402
from debate.engine import chat, engine, gguf, kv_pool, models  # noqa: E402

try:  # the persistent decode batch (issue 48); a tree from before batches by the turn
    from debate.engine import decode_batch  # noqa: E402
except ImportError:
    decode_batch = None
from debate.methods import debatecv  # noqa: E402
from tests.tiny_models import bench_claims, build_random_lora, build_tiny_llama  # noqa: E402


def load():
    return round(os.getloadavg()[0], 2)


# ----------------------------------------------------------------------------------------------- the workload


def pick_claims(source, n, evidence_items):
    """The claims: the demo set (shipped, 8 claims) or AVeriTeC dev with HerO's retrieved evidence, cut to its
    first `evidence_items` items (its full evidence makes ~1,500-token prompts, too slow for this CPU)."""
    if source == "demo":
        claims = data.attach_evidence(averitec.load_split("demo"), "golden")
        return [dict(claims[k % len(claims)], claim_id=k) for k in range(n)], "the demo claims"
    claims, said = bench_claims(n, "retrieved")
    if evidence_items is not None:
        claims = [dict(c, evidence=c["evidence"][:evidence_items]) for c in claims]
    return claims, f"{said}, first {evidence_items} evidence items" if evidence_items is not None else said


def first_turns(lm, claims, max_new_tokens):
    """[(role, system, prompt)] for every claim: the first turn of each role, replies from our engine (untimed)."""
    settings = engine.Settings(max_new_tokens=max_new_tokens, structured=False)
    debates = [debatecv.start_debate(c) for c in claims]
    aff = [render("affirmative_opening", claim=d.claim["claim"]) for d in debates]
    aff_replies = engine.generate(lm.model, lm.tokenizer, [d.convs["affirmative"] for d in debates], aff, settings)
    neg = [render("negative_opening", opponent_argument=r) for r in aff_replies]
    neg_replies = engine.generate(lm.model, lm.tokenizer, [d.convs["negative"] for d in debates], neg, settings)
    mod = [moderator_prompt(a, n) for a, n in zip(aff_replies, neg_replies)]
    rows = []
    for d, a, n, m in zip(debates, aff, neg, mod):
        rows += [("affirmative", d.convs["affirmative"].system, a), ("negative", d.convs["negative"].system, n),
                 ("moderator", d.convs["moderator"].system, m)]
    return rows


def moderator_prompt(affirmative, negative):
    return render("moderator_round", round=1, affirmative_argument=affirmative, negative_argument=negative,
                  label_choices=AVERITEC.choices(), label_answer=AVERITEC.answer_format())


def prompt_ids(tokenizer, system, prompt):
    """The ids our engine feeds for this first turn (chat.context_ids), given to HF as its request."""
    conv = engine.Conversation(system=system)
    conv.messages.append({"role": "user", "content": prompt})
    return chat.context_ids(tokenizer, conv)


def lognormal_lengths(n, mean, cap, seed, sigma=0.6):
    """n reply lengths from a lognormal of that mean (before the cap) and sigma, seeded, each in [1, cap]."""
    draw = random.Random(seed)
    mu = math.log(mean) - sigma ** 2 / 2
    return [max(1, min(cap, round(draw.lognormvariate(mu, sigma)))) for _ in range(n)]


# ------------------------------------------------------------------------------------------ counting forwards


class Forwards:
    """Every model call while it is on: its query shape and seconds. A decode call feeds one token a row: ours
    as (rows, 1); HF's packs every request into one row, (1, total tokens), and is a decode call when that total
    equals its number of requests (cumulative_seqlens_q)."""

    def __init__(self, model):
        self.calls, self.on, self._start = [], False, None
        self._hooks = [model.register_forward_pre_hook(self._pre, with_kwargs=True),
                       model.register_forward_hook(self._post, with_kwargs=True)]

    def _pre(self, module, args, kwargs):
        if self.on:
            self._start = time.perf_counter()

    def _post(self, module, args, kwargs, output):
        if not self.on:
            return
        ids = kwargs.get("input_ids", args[0] if args else None)
        rows, cols = ids.shape
        seqlens = kwargs.get("cu_seq_lens_q")
        if seqlens is not None:  # HF's packed batch: its requests are the sequences
            requests = int(seqlens.numel()) - 1
            decode, fed = cols == requests, cols
            # Cache slots every layer of a group copies out (index_select) for this call, a group per allocator.
            reads = [int(r.numel()) for r in kwargs.get("read_index") or []]
        else:
            decode, fed, reads = cols == 1, rows * cols, []
        self.calls.append((decode, fed, time.perf_counter() - self._start, reads))

    def gathered(self, layers, token_bytes):
        """Mean bytes HF's decode calls copied out of the paged cache (keys and values, every layer)."""
        reads = [sum(n * k for n, k in zip(c[3], layers)) * token_bytes for c in self.calls if c[0] and c[3]]
        return round(sum(reads) / len(reads)) if reads else 0

    def summary(self):
        decode = [c for c in self.calls if c[0]]
        return {"forwards": len(self.calls), "decode_forwards": len(decode),
                "decode_rows_fed": sum(c[1] for c in decode), "decode_seconds": round(sum(c[2] for c in decode), 2),
                "prefill_tokens_fed": sum(c[1] for c in self.calls if not c[0]),
                "prefill_seconds": round(sum(c[2] for c in self.calls if not c[0]), 2)}

    def remove(self):
        for hook in self._hooks:
            hook.remove()


def timed(forwards, run):
    forwards.calls, forwards.on = [], True
    before, start = load(), time.perf_counter()
    try:
        out = run()
    finally:
        forwards.on = False
    return out, {"seconds": round(time.perf_counter() - start, 2), "load_before": before, "load_after": load(),
                 **forwards.summary()}


# -------------------------------------------------------------------------------------------------- the runs


def hf_config(prompt_lens, max_new_tokens, page_size, max_batch_tokens, sharing=True):
    """HF's continuous batching set up for a CPU: a paged cache sized to hold every request at once (as if every
    layer were full attention; Gemma 3's sliding layers need less), prefill packed to max_batch_tokens a forward,
    no CUDA graphs, no async double buffering, no switch to flash (none on a CPU), FIFO (decoding first)."""
    blocks = sum(-(-(p + max_new_tokens) // page_size) for p in prompt_lens) + 4
    return ContinuousBatchingConfig(page_size=page_size, num_blocks=blocks, max_batch_tokens=max_batch_tokens,
                                    max_requests_per_batch=len(prompt_lens), use_cuda_graph=False,
                                    use_async_batching=False, allow_block_sharing=sharing, scheduler_type="fifo",
                                    auto_switch_to_flash=False)


class HF:
    """One ContinuousBatchingManager kept running: requests added, results read as they finish (what
    generate_batch does, less its fixed max_new_tokens per call). `matches` records every prefix match."""

    def __init__(self, model, config, stop_ids, max_new_tokens, pad_id, gen=None):
        gen = gen or GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(stop_ids),
                                      pad_token_id=pad_id)
        self.manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=config)
        # Built here rather than on the manager's thread, so the cache can be read and its matches counted
        # (a CPU has no graphs to warm up: this only creates the batch processor).
        self.manager.warmup()
        self.cache = self.manager.batch_processor.cache
        self.matches = []
        search = self.cache.search_prefix_match

        def counted(request_id, ids):
            matched = search(request_id, ids)
            self.matches.append((len(ids), matched))
            return matched

        self.cache.search_prefix_match = counted
        self.manager.start()
        self.count = 0

    def add(self, ids, max_new_tokens=None, eos=None):
        self.count += 1
        return self.manager.add_request(list(ids), request_id=f"r{self.count}", max_new_tokens=max_new_tokens,
                                        eos_token_id=eos)

    def results(self, wanted):
        """Yield (request id, generated ids) as requests finish, until `wanted` have (more may be added meanwhile:
        the caller raises `wanted` through the list it passes)."""
        done = 0
        while done < len(wanted):
            result = self.manager.get_result(timeout=1)
            if result is None:
                if not self.manager.is_running():
                    raise RuntimeError("HF's generation thread stopped")
                continue
            if result.is_finished():
                if result.error:
                    raise RuntimeError(f"HF request {result.request_id}: {result.error}")
                done += 1
                yield result.request_id, list(result.generated_tokens)

    def run(self, prompts, limits=None, eos=None):
        ids = [self.add(p, n, eos) for p, n in zip(prompts, limits or [None] * len(prompts))]
        out = dict(self.results(ids))
        return [out[i] for i in ids]

    def memory(self):
        io = self.manager.batch_processor.inputs_and_outputs
        masks = sum(m.numel() * m.element_size() for m in (io.attention_mask or {}).values())
        allocators = list(self.cache.cache_allocators.values())
        one = allocators[0]
        return {"paged_cache_bytes": self.cache.cache_tensor.numel(), "attention_mask_bytes": masks,
                "layers_per_group": [len(a.layer_indices) for a in allocators],
                "kv_bytes_per_token_layer": 2 * one.num_key_value_heads * one.head_dim * one.cache_dtype.itemsize,
                "read_index_bytes": io.read_index_storage.numel() * io.read_index_storage.element_size(),
                "num_blocks": self.cache.num_blocks, "max_batch_tokens": self.cache.max_batch_tokens,
                "prefix_sharing": self.cache.use_prefix_sharing,
                "decode_fast_path": self.cache.max_decode_fast_path_length > 0}

    def close(self):
        self.manager.stop(block=True)
        self.manager.destroy()


def ours(model, tokenizer, rows, settings, stop_ids=None):
    """One engine.generate call over `rows` (fresh conversations): each row's reply ids without its stop token,
    and the tokens generated (a stop token included, as HF counts it)."""
    convs = [engine.Conversation(system=system) for _, system, _ in rows]
    engine.generate(model, tokenizer, convs, [p for _, _, p in rows], settings, stop_ids=stop_ids)
    return [c.generated[-1] for c in convs], sum(c.completion_tokens for c in convs)


def content(ids, stops):
    return ids[:-1] if ids and ids[-1] in stops else ids


def compare(a_rows, b_rows, stops, lengths=None):
    """Rows with identical ids (a row's first `lengths[i]` when given) and where the others first differ."""
    diffs = {}
    for i, (a, b) in enumerate(zip(a_rows, b_rows)):
        a, b = content(a, stops), content(b, stops)
        if lengths is not None:
            a, b = a[:lengths[i]], b[:lengths[i]]
        if a != b:
            diffs[i] = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return {"rows": len(a_rows), "same_rows": len(a_rows) - len(diffs), "first_difference": diffs}


def rates(entry, tokens):
    entry["generated_tokens"] = tokens
    entry["tokens_per_s"] = round(tokens / entry["seconds"], 2)
    if entry.get("decode_seconds"):
        # Per row fed: what one row of a decode step costs. HF's forwards that mix prefill with decoding rows
        # count as prefill here (their tokens are in neither decode figure).
        entry["decode_ms_per_row_fed"] = round(1000 * entry["decode_seconds"] / entry["decode_rows_fed"], 1)
    return entry


def free_run(lm, rows, args, stops, forwards, config_of):
    tok = lm.tokenizer
    ids = [prompt_ids(tok, s, p) for _, s, p in rows]
    settings = engine.Settings(max_new_tokens=args.max_new_tokens, structured=False)
    out = {"ours": [], "hf": []}
    for _ in range(args.repeats):
        (got_ours, tokens), entry = timed(forwards, lambda: ours(lm.model, lm.tokenizer, rows, settings))
        out["ours"].append(rates(entry, tokens))

        def hf_run():
            hf = HF(lm.model, config_of(ids, args.max_new_tokens), stops, args.max_new_tokens, tok.pad_token_id)
            try:
                return hf.run(ids), hf.memory()
            finally:
                hf.close()
        (got_hf, memory), entry = timed(forwards, hf_run)
        entry["gathered_bytes_per_decode_forward"] = forwards.gathered(memory["layers_per_group"],
                                                                       memory["kv_bytes_per_token_layer"])
        out["hf"].append(rates(entry, sum(len(r) for r in got_hf)))
    out["hf_memory"] = memory
    out["identity"] = compare(got_ours, got_hf, stops)
    out["reply_lengths"] = {"ours": [len(r) for r in got_ours], "hf": [len(content(r, stops)) for r in got_hf]}
    out["prompt_tokens"] = [len(i) for i in ids]
    if hasattr(engine, "batch_bytes"):  # by the turn: our plan of this one call (debate.engine.memory)
        out["ours_planned_call_bytes"] = engine.batch_bytes(lm.model, ids, [0] * len(ids), settings)
    else:  # by the step (issue 48): the model's memory, allocated once (keys and values, reserve)
        mem = kv_pool.pool_for(next(lm.model.parameters()).device).memories[lm.model]
        out["ours_memory_bytes"] = mem.nbytes() + mem.plan["reserve"]
    return out


def fixed_run(lm, rows, args, stops, forwards, config_of):
    ids = [prompt_ids(lm.tokenizer, s, p) for _, s, p in rows]
    lengths = lognormal_lengths(len(rows), args.turn_mean, args.turn_cap, args.seed)
    longest, useful = max(lengths), sum(lengths)
    out = {"lengths": lengths, "useful_tokens": useful, "ours": [], "hf": []}
    by_step = decode_batch is not None  # issue 48 on: each row stops at its own length (decode_batch.reply_cap)
    drawn = {tuple(i): n for i, n in zip(ids, lengths)}
    for _ in range(args.repeats):
        settings = engine.Settings(max_new_tokens=longest, structured=False)
        if by_step:
            decode_batch.reply_cap = lambda context: drawn[tuple(context)]
        try:
            (got_ours, _), entry = timed(forwards, lambda: ours(lm.model, lm.tokenizer, rows, settings, stop_ids=[]))
        finally:
            if by_step:
                decode_batch.reply_cap = None
        entry = rates(entry, useful)
        # By the turn every row runs to the longest; by the step, the rows the steps ran (counted by the hook).
        entry["decode_slots"] = entry.get("decode_rows_fed") if by_step else len(rows) * longest
        out["ours"].append(entry)

        def hf_run():
            hf = HF(lm.model, config_of(ids, longest), stops, longest, lm.tokenizer.pad_token_id)
            try:
                return hf.run(ids, lengths, eos=[])
            finally:
                hf.close()
        got_hf, entry = timed(forwards, hf_run)
        entry = rates(entry, useful)
        entry["decode_slots"] = useful
        out["hf"].append(entry)
    out["identity"] = compare(got_ours, got_hf, set(), lengths)
    out["hf_lengths_as_drawn"] = [len(r) for r in got_hf] == lengths
    return out


def chain_run(lm, claims, args, stops, forwards, config_of):
    """Each claim's Affirmative, Negative and Moderator turns in order, every turn built from the reply before."""
    tok = lm.tokenizer
    settings = engine.Settings(max_new_tokens=args.max_new_tokens, structured=False)
    out = {}

    def ours_chain():
        debates = [debatecv.start_debate(c) for c in claims]

        def call(role, prompts):
            return engine.generate(lm.model, tok, [d.convs[role] for d in debates], prompts, settings)
        aff = call("affirmative", [render("affirmative_opening", claim=d.claim["claim"]) for d in debates])
        neg = call("negative", [render("negative_opening", opponent_argument=a) for a in aff])
        mod = call("moderator", [moderator_prompt(a, n) for a, n in zip(aff, neg)])
        tokens = sum(c.completion_tokens for d in debates for c in d.convs.values())
        return {"affirmative": aff, "negative": neg, "moderator": mod}, tokens
    (got_ours, tokens), entry = timed(forwards, ours_chain)
    out["ours"] = rates(entry, tokens)

    def hf_chain():
        debates = [debatecv.start_debate(c) for c in claims]
        first = [prompt_ids(tok, d.convs["affirmative"].system, render("affirmative_opening", claim=d.claim["claim"]))
                 for d in debates]
        hf = HF(lm.model, config_of(first * 3, args.max_new_tokens), stops, args.max_new_tokens, tok.pad_token_id)
        replies = {role: [None] * len(debates) for role in debatecv.ROLES}
        owner, generated = {}, 0
        try:
            wanted = []
            for k, ids in enumerate(first):
                rid = hf.add(ids)
                owner[rid] = (k, "affirmative")
                wanted.append(rid)
            # The coroutine protocol: a finished turn queues its claim's next one while the others decode on.
            for rid, ids in hf.results(wanted):
                k, role = owner[rid]
                generated += len(ids)
                replies[role][k] = tok.decode(content(ids, stops), skip_special_tokens=True)
                if role == "moderator":
                    continue
                d = debates[k]
                if role == "affirmative":
                    nxt, prompt = "negative", render("negative_opening", opponent_argument=replies[role][k])
                else:
                    nxt, prompt = "moderator", moderator_prompt(replies["affirmative"][k], replies[role][k])
                rid = hf.add(prompt_ids(tok, d.convs[nxt].system, prompt))
                owner[rid] = (k, nxt)
                wanted.append(rid)
        finally:
            hf.close()
        return replies, generated
    (got_hf, generated), entry = timed(forwards, hf_chain)
    out["hf"] = rates(entry, generated)
    out["same_replies"] = {role: sum(a == b for a, b in zip(got_ours[role], got_hf[role])) for role in got_ours}
    out["claims"] = len(claims)
    return out


def resume_run(lm, claims, args, label, page_size):
    """Turn 1 of each claim's Affirmative, then the Negative's first turn (same system prompt), then the
    Affirmative's second turn: prompt tokens given and encoded, ours and HF's (prefix sharing on)."""
    tok, n = lm.tokenizer, args.resume_tokens
    stops = chat.stop_token_ids(lm.model, tok)
    settings = engine.Settings(max_new_tokens=n, structured=False)
    rebuttal = render("debater_rebuttal", opponent_argument="The evidence does not show what the claim says.")
    debates = [debatecv.start_debate(c) for c in claims]
    aff_prompts = [render("affirmative_opening", claim=d.claim["claim"]) for d in debates]
    neg_prompts = [render("negative_opening", opponent_argument="The claim is supported.")] * len(debates)
    out = {"model": label, "conversations": len(debates)}

    # Ours: each conversation keeps its cache between its turns; conversations share nothing.
    aff = [d.convs["affirmative"] for d in debates]
    neg = [d.convs["negative"] for d in debates]
    engine.generate(lm.model, tok, aff, aff_prompts, settings)
    steps = {}
    for name, convs, prompts in (("negative_first_turn", neg, neg_prompts), ("affirmative_second_turn", aff,
                                                                            [rebuttal] * len(aff))):
        given, encoded = sum(c.prompt_tokens for c in convs), sum(c.encoded_tokens for c in convs)
        engine.generate(lm.model, tok, convs, prompts, settings)
        steps[name] = {"given": sum(c.prompt_tokens for c in convs) - given,
                       "encoded": sum(c.encoded_tokens for c in convs) - encoded}
    out["ours"] = steps

    # HF: one running manager; the second turn's prompt is the first's context, its reply and the new message.
    convs = [engine.Conversation(system=d.convs["affirmative"].system) for d in debates]
    firsts = []
    for c, p in zip(convs, aff_prompts):
        c.messages.append({"role": "user", "content": p})
        firsts.append(chat.context_ids(tok, c))
    neg_ids = [prompt_ids(tok, d.convs["negative"].system, p) for d, p in zip(debates, neg_prompts)]
    config = hf_config([len(i) for i in firsts] * 3, 2 * n + len(tok(rebuttal)["input_ids"]) + 16, page_size,
                       args.max_batch_tokens)
    hf = HF(lm.model, config, stops, n, tok.pad_token_id)

    def counted(prompts):
        # Without prefix sharing the scheduler never searches (every prompt token is encoded): count from the prompts.
        hf.matches = []
        got = hf.run(prompts)
        given = sum(len(p) for p in prompts)
        return got, {"given": given, "encoded": given - sum(m for _, m in hf.matches)}
    try:
        replies, _ = counted(firsts)
        _, first_turn = counted(neg_ids)
        steps = {"negative_first_turn": first_turn}
        seconds = []
        for c, ids in zip(convs, replies):
            c.generated.append(content(ids, stops))
            c.messages += [{"role": "assistant", "content": tok.decode(c.generated[-1], skip_special_tokens=True)},
                           {"role": "user", "content": rebuttal}]
            seconds.append(chat.context_ids(tok, c))
        with_sharing, steps["affirmative_second_turn"] = counted(seconds)
        out["hf"] = steps
        out["hf_prefix_sharing"] = hf.cache.use_prefix_sharing
        out["page_size"] = page_size
    finally:
        hf.close()
    # The same second turns on a fresh manager without sharing: a reused prefix must not change the tokens.
    hf = HF(lm.model, hf_config([len(i) for i in seconds], n, page_size, args.max_batch_tokens, sharing=False),
            stops, n, tok.pad_token_id)
    try:
        out["hf_same_tokens_without_sharing"] = compare(with_sharing, hf.run(seconds), set(stops))["same_rows"]
    finally:
        hf.close()
    return out


# ------------------------------------------------------------------------------------------------- the probes


def probes(claims, args):
    """What HF's manager does with seeded sampling, NF4 and per-role LoRA, on a tiny random Llama."""
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_llama(Path(tmp) / "tiny", seed=0, hidden_size=128, intermediate_size=256,
                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        lm = models.load_model(path, use_4bit=False)
        tok = lm.tokenizer
        rows = first_turns(lm, claims[:2], 16)
        ids = [prompt_ids(tok, s, p) for _, s, p in rows]
        stops = chat.stop_token_ids(lm.model, tok)
        n = 24
        greedy = engine.Settings(max_new_tokens=n, structured=False)

        def hf_tokens(model, prompts, gen=None, seed=None):
            config = hf_config([len(i) for i in prompts], n, args.page_size, args.max_batch_tokens)
            config.seed = seed
            hf = HF(model, config, stops, n, tok.pad_token_id, gen)
            try:
                return [content(r, stops) for r in hf.run(prompts)]
            finally:
                hf.close()

        def same(a, b):
            return compare(a, b, set(stops))["same_rows"]

        # Sampling: HF draws with torch.multinomial from the process's global generator, seeded once from
        # ContinuousBatchingConfig.seed when its batch processor is made (distributed.set_tp_seed); ours from
        # the run's own torch.Generator (Settings.seed).
        sampled = GenerationConfig(max_new_tokens=n, do_sample=True, temperature=0.8, eos_token_id=list(stops),
                                   pad_token_id=tok.pad_token_id)
        a, b = hf_tokens(lm.model, ids, sampled, 0), hf_tokens(lm.model, ids, sampled, 0)
        out["hf_sampling"] = {"rows": len(ids), "same_seed_twice_same_rows": same(a, b),
                              "row0_alone_equals_row0_in_batch": hf_tokens(lm.model, ids[:1], sampled, 0)[0] == a[0]}
        warm = engine.Settings(max_new_tokens=n, structured=False, temperature=0.8, seed=0)
        a, b = ours(lm.model, tok, rows, warm)[0], ours(lm.model, tok, rows, warm)[0]
        out["ours_sampling"] = {"rows": len(ids), "same_seed_twice_same_rows": same(a, b),
                                "row0_alone_equals_row0_in_batch": ours(lm.model, tok, rows[:1], warm)[0][0] == a[0]}

        # NF4 (bitsandbytes; float32 compute on a CPU, as our --4bit loads it): greedy, ours against HF's.
        try:
            nf4 = models.load_model(path, use_4bit=True)
            out["nf4"] = compare(ours(nf4.model, tok, rows, greedy)[0], hf_tokens(nf4.model, ids), set(stops))
        except Exception as e:  # a refusal is a finding too
            out["nf4"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"

        # LoRA per role: the Moderator with an adapter, the Affirmative on the plain base, one shared PeftModel.
        # HF's manager runs whatever the PeftModel has active when it runs, for every request it holds.
        adapter = build_random_lora(path, Path(tmp) / "adapter")
        agents = models.load_roles({"affirmative": path, "moderator": path}, {"moderator": str(adapter)},
                                   use_4bit=False)
        lora, mine = {}, {}
        for role in ("moderator", "affirmative"):
            with models.adapter_scope(agents[role]) as model:
                mine[role] = ours(model, tok, rows, greedy)[0]
                try:
                    lora[role] = compare(mine[role], hf_tokens(model, ids), set(stops))
                except Exception as e:
                    lora[role] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        lora["adapter_changes_rows"] = len(rows) - same(mine["moderator"], mine["affirmative"])
        out["lora_one_role_per_manager"] = lora
    return out


# --------------------------------------------------------------------------------------------------- the main


def build_parser():
    """The flags (tests/test_docs.py checks the documented commands against them)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", choices=("demo", "averitec"), default="demo")
    p.add_argument("--claims", type=int, default=8)
    p.add_argument("--evidence-items", type=int, default=3, help="--source averitec: evidence items kept a claim")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--turn-mean", type=int, default=96, help="fixed run: mean reply length (lognormal, sigma 0.6)")
    p.add_argument("--turn-cap", type=int, default=192, help="fixed run: longest reply")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="interleaved pairs of each timed run")
    p.add_argument("--page-size", type=int, default=256, help="HF: tokens a page (its default)")
    p.add_argument("--max-batch-tokens", type=int, default=512, help="HF: tokens a forward (ours prefills 512 a row)")
    p.add_argument("--resume-tokens", type=int, default=32, help="resume part: new tokens a turn")
    p.add_argument("--threads", type=int, default=1, help="torch threads (see the top of this file)")
    for part in ("fixed", "chain", "resume", "probes"):
        p.add_argument(f"--skip-{part}", action="store_true")
    p.add_argument("--out", default=str(ROOT / "bench/out/hf_continuous.json"))
    return p


def main():
    args = build_parser().parse_args()
    torch.set_num_threads(args.threads)
    claims, source = pick_claims(args.source, args.claims, args.evidence_items)
    lm = models.load_model(gguf.default_model_path())
    tok, stops = lm.tokenizer, chat.stop_token_ids(lm.model, lm.tokenizer)
    result = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} CPU "
              f"cores, torch {torch.__version__} ({torch.get_num_threads()} threads), transformers "
              f"{transformers.__version__}", "model": "Gemma 3 270M (embedded GGUF, dequantised), float32, "
              f"attention {lm.model.config._attn_implementation}", "claims_source": source, "args": vars(args),
              "load_at_start": load()}
    forwards = Forwards(lm.model)

    def config_of(ids, new):
        return hf_config([len(i) for i in ids], new, args.page_size, args.max_batch_tokens)

    rows = first_turns(lm, claims, args.max_new_tokens)
    result["rows"] = len(rows)
    # Warm-up, untimed: both paths once on two short rows (first-call costs: kernels' set-up, allocations).
    warm = rows[:2]
    ours(lm.model, tok, warm, engine.Settings(max_new_tokens=4, structured=False))
    hf = HF(lm.model, config_of([prompt_ids(tok, s, p) for _, s, p in warm], 4), stops, 4, tok.pad_token_id)
    hf.run([prompt_ids(tok, s, p) for _, s, p in warm])
    hf.close()

    result["free"] = free_run(lm, rows, args, stops, forwards, config_of)
    print(json.dumps({"free": result["free"]}, indent=1), flush=True)
    if not args.skip_fixed:
        result["fixed"] = fixed_run(lm, rows, args, stops, forwards, config_of)
        print(json.dumps({"fixed": result["fixed"]}, indent=1), flush=True)
    if not args.skip_chain:
        result["chain"] = chain_run(lm, claims, args, stops, forwards, config_of)
        print(json.dumps({"chain": result["chain"]}, indent=1), flush=True)
    forwards.remove()
    if not args.skip_resume:
        result["resume"] = [resume_run(lm, claims[:4], args, "demo Gemma 3 270M (sliding + full layers)",
                                       args.page_size)]
        with tempfile.TemporaryDirectory() as tmp:
            tiny = models.load_model(build_tiny_llama(Path(tmp) / "tiny", seed=0), use_4bit=False)
            # Its prefix is matched in whole pages: HF's default page and a small one.
            for page in dict.fromkeys((args.page_size, 32)):
                result["resume"].append(resume_run(tiny, claims[:4], args, "tiny random Llama (full attention)",
                                                   page))
        print(json.dumps({"resume": result["resume"]}, indent=1), flush=True)
    if not args.skip_probes:
        result["probes"] = probes(claims, args)
        print(json.dumps({"probes": result["probes"]}, indent=1), flush=True)
    result["load_at_end"] = load()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
