"""The memory plan's arithmetic: the bytes a model call or a training step holds at its peak, from a model's
shape alone (no torch). The engine's memory authority (debate.engine.kv_pool: kv_plan, reserve_bytes) and
bench/memory_plan.py both call these; the plan lives here only.

A model's decode batch (debate.engine.decode_batch) holds, besides the weights, its keys and values (the place's
slots and the pages where caches wait: kv_pool's store, allocated once from the budget) and a reserve for what a
step or a join makes and frees (reserve_bytes):
- a join's prefill, in pieces of at most PREFILL_CHUNK new tokens of one row (prefill_bytes): hidden states and the
  MLP's intermediates of one piece, its attention (attention_bytes: the mask transformers builds, one byte a cell per
  layer type, and the copy in the compute dtype the kernel makes of it; the scores only where the kernel
  materialises them; the keys and values repeated to every head, which grouped-query attention under a mask does
  for more than one query), float32 logits of the last position; the piece attends to every column before it, so
  the transient grows with the context only through the mask, a few bytes a column, never quadratically;
- the decode step of every slot over the place's columns (decode_step_bytes, decode_masks_bytes), and the picks'
  extras (structured_step_bytes: the schema rows' masks and held logits, the sampler's softmax and draws);
- the kernels' scratch (kernel_scratch_bytes): one projection's weight copied in the compute dtype (NF4
  dequantised per matmul) and KERNEL_WORKSPACE, once a call;
- a choice field's scoring (choice_pass_bytes): ONE row's candidates as a token trie of T distinct tokens
  fed once over that row's slot in place: T tokens' activations and MLP, T x (L + T) attention scores per
  head, the row's keys and values repeated to every head over L + T columns, the T new keys and values, and
  T x vocab logits in the model's dtype, in float32 and their log-softmax. Rows are scored one at a time, so
  T is the largest trie of the batch's schemas (schema_program.Compiled.scratch_columns), not a sum.
The prefill's and the step's transients are added, not maxed: an upper bound (on CUDA the step's stay in the
captured graphs' pool). `batch_bytes` is the older plan of one call batching by the turn, which bench/memory_plan.py
still prints beside the reserve.

A training step (train_step_bytes): the LoRA adapter in float32 with its gradient and AdamW's two moments;
with gradient checkpointing one saved hidden state per layer and one layer recomputed in the backward with
its gradients; LoRA dropout (peft applies it to each adapted layer's input separately, so p > 0 keeps a
copy of that input and a one-byte mask per adapted layer; p = 0 keeps none); the dequantised weight of the
largest NF4 projection (bitsandbytes dequantises per matmul, forward and backward); the attention scores,
their softmax and its gradient where the kernel materialises them (`fused_attention=False`: the CPU, eager
attention); the logits of the kept target positions in the model's dtype and float32, their log-softmax
and its gradient.
"""

# New tokens a row feeds in one prefill call: a long context is encoded in pieces of this many (vLLM's chunked
# prefill), so a call's activations and mask stay bounded whatever the context.
PREFILL_CHUNK = 512
NF4_BYTES = 0.5 + 1 / 64 + 4 / (64 * 256)  # 4-bit code + 8-bit absmax per 64 + fp32 scale per 256 absmax blocks
GIB = 2 ** 30
# The kernels' own buffers beyond a weight's copy (kernel_scratch_bytes): sdpa's per-thread blocks on a CPU, cuBLAS's
# workspace on CUDA; a bound, not a measurement (the CPU's measured a few hundred KiB).
KERNEL_WORKSPACE = 4 * 2 ** 20


def shape(config):
    """The numbers the formulas need, from a config.json's dict or a transformers config object (its text
    config for multimodal models)."""
    if hasattr(config, "get_text_config"):
        config = config.get_text_config(decoder=True).to_dict()
    config = config.get("text_config", config)
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    types = set(config.get("layer_types") or ()) or {"full_attention"}
    return dict(vocab=config["vocab_size"], hidden=config["hidden_size"],
                inter=config.get("intermediate_size") or 4 * config["hidden_size"],
                layers=config["num_hidden_layers"], heads=heads,
                kv_heads=config.get("num_key_value_heads") or heads, head_dim=head_dim,
                tied=config.get("tie_word_embeddings", False), mask_types=len(types))


def linear_shapes(s):
    """(in, out) of every linear layer of one decoder layer: q, k, v, o, gate, up, down."""
    q, kv = s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
    h, i = s["hidden"], s["inter"]
    return [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]


def weights_bytes(s, nf4=True, dtype_bytes=2):
    """(quantised part, the rest) in bytes: decoder projections, then embeddings, LM head and norms."""
    linear = s["layers"] * sum(a * b for a, b in linear_shapes(s))
    rest = s["vocab"] * s["hidden"] * (1 if s["tied"] else 2) + (2 * s["layers"] + 1) * s["hidden"]
    return linear * (NF4_BYTES if nf4 else dtype_bytes), rest * dtype_bytes


def kv_bytes_per_token(s, dtype_bytes=2):
    """Keys and values of one token over all layers."""
    return 2 * s["layers"] * s["kv_heads"] * s["head_dim"] * dtype_bytes


def mask_types(s):
    """The distinct masks a forward builds: one per attention type (Gemma 3: sliding-window and full)."""
    return s.get("mask_types", 1)


def attention_bytes(s, rows, queries, columns, size, fused, mask_cell=None):
    """One layer's attention of `queries` new tokens a row over `columns` keys, as the kernels in use allocate it:
    the masks transformers builds (bool, one per layer type) and the kernel's copy of one in the compute dtype
    (sdpa turns a boolean mask into an additive one, on CUDA and on a CPU); the float32 scores where the kernel
    materialises them (not `fused`: eager attention); the keys and values repeated to every head, which
    transformers does for grouped-query attention under a mask when more than one token is fed (one token's
    queries are regrouped by key head instead). `mask_cell`: the masks' bytes per (row, query, column) where the
    caller builds them itself."""
    mask = rows * queries * columns * (mask_types(s) + size if mask_cell is None else mask_cell)
    scores = 0 if fused else rows * s["heads"] * queries * columns * 4
    grouped = s["kv_heads"] < s["heads"]
    repeated = rows * columns * 2 * s["heads"] * s["head_dim"] * size if queries > 1 and grouped else 0
    return mask + scores + repeated


def _layer_bytes(s, tokens, size):
    """One layer's hidden states and MLP intermediates for `tokens` tokens: the residual stream, its norm, the
    queries before and after the rotary embedding, the attention's output and its transposed copy live together
    at the attention's peak (six hidden-wide tensors, measured on a 1-layer model whose MLP is narrow), then the
    MLP's two intermediate-wide ones."""
    return tokens * (6 * s["hidden"] + 2 * s["inter"]) * size


def kernel_scratch_bytes(s, size):
    """What the kernels take beside the tensors a forward names, one matmul at a time: a copy of the largest
    projection's weight in the compute dtype (bitsandbytes dequantises an NF4 weight for every matmul over more
    than one token; the CI's CPU allocated 1.3 MiB more than this one in tests/test_memory_plan.py's prefill
    piece, about one 1 MiB projection there, likely oneDNN reordering a weight, not confirmed on that machine) and
    KERNEL_WORKSPACE for the rest (sdpa's blockwise buffers, a few hundred KiB a thread on a CPU; cuBLAS's
    workspace)."""
    return max(a * b for a, b in linear_shapes(s)) * size + KERNEL_WORKSPACE


def prefill_bytes(s, rows, chunk, width, size, fused=False, piece=PREFILL_CHUNK):
    """A prefill of `chunk` new tokens per row after `width` cached columns, fed `piece` tokens a call (the
    transient, not the cache): the largest call is the last piece, which attends to all width + chunk columns.
    The kernels' scratch is counted here once for the whole model call (its matmuls run one at a time)."""
    queries = min(chunk, piece)
    return (_layer_bytes(s, rows * queries, size) + attention_bytes(s, rows, queries, width + chunk, size, fused)
            + rows * s["vocab"] * 4 * 2 + kernel_scratch_bytes(s, size))


def decode_step_bytes(s, rows, columns, size, fused=False):
    """One decode step of every row over `columns` cache columns: one token's layer, its attention (over the
    turn's own additive masks, counted with the turn: decode_masks_bytes), logits."""
    return (_layer_bytes(s, rows, size) + attention_bytes(s, rows, 1, columns, size, fused, mask_cell=0)
            + rows * s["vocab"] * (size + 8))


def decode_masks_bytes(s, rows, columns, size, new_tokens):
    """What a turn's decode steps keep on the device for the whole turn (debate.engine.decode_batch.Batch): one
    additive mask a layer type over every column, and the history of picked ids."""
    return rows * columns * mask_types(s) * size + rows * max(1, new_tokens) * 8


def structured_step_bytes(s, rows, size):
    """Structured decoding's and sampling's extras in a decode step (debate.engine.decode_batch._pick): the masks over
    the vocabulary (two modes, banned and closing, one byte a token, kept for the run), and for each row the logits a
    waiting schema row holds for the host (float32, kept), the masked copy of its logits and the bytes of the mask
    gathered for it, and the sampler's float32 scaled logits and nucleus weights with the counter-based draws: an
    int64 hash a token, two at once, and their float32 Gumbel noise (debate.engine.sampling's dense race, a GPU's;
    a CPU's pruned race hashes only the tokens that can win)."""
    return 4 * s["vocab"] + rows * s["vocab"] * (4 + size + 1 + 4 + 4 + 2 * 8 + 4)


def choice_pass_bytes(s, trie, context, size, fused=False):
    """One choice field scored for ONE row: its candidates' token trie (`trie` distinct tokens) fed once over
    the row's `context` cached tokens in place, with a tree-shaped mask (trie x (context + trie))."""
    if trie <= 0:
        return 0
    columns = context + trie
    # The tree's masks are given additive, in the compute dtype (no boolean one to convert): at most float32 a type.
    return (_layer_bytes(s, trie, size) + attention_bytes(s, 1, trie, columns, size, fused, 4 * mask_types(s))
            + trie * kv_bytes_per_token(s, size)  # the trie's own keys and values
            + trie * s["vocab"] * (size + 4 + 4))  # logits, their float32 copy, log_softmax's copy


def batch_bytes(s, size, rows, width, chunk, new_tokens, structured_rows=0, trie=0, fused=False, kept_tokens=0,
                buffer=None):
    """A model call's turn of `rows` rows: KV buffer + prefill + the decode step's transients (with
    structured decoding's extras and one choice pass where `structured_rows` > 0) + what the rows' caches copied out
    at its end add to their older copies (`kept_tokens` tokens in all). `fused`: the attention kernel never
    materialises the scores (attention_is_fused). `buffer`: (rows, columns) of the turn's buffer where a compiled
    turn rounds them up to its buckets (debate.engine.decode_step's buckets)."""
    columns = width + chunk + new_tokens
    rows_b, columns_b = buffer or (rows, columns)
    kv = rows_b * columns_b * kv_bytes_per_token(s, size) + decode_masks_bytes(s, rows_b, columns_b, size, new_tokens)
    decode = decode_step_bytes(s, rows_b, columns_b, size, fused)
    if structured_rows:
        decode += structured_step_bytes(s, structured_rows, size) + choice_pass_bytes(s, trie, columns, size, fused)
    return kv + prefill_bytes(s, rows, chunk, width, size, fused) + decode + kept_tokens * kv_bytes_per_token(s, size)


# The most of a model's keys and values (its budget less the reserve) the decode place takes while more than one row
# runs (debate.engine.kv_pool.place_geometry); the rest holds the waiting caches' pages. A debate keeps two or three
# conversations a claim, one decoding at a time, and a slot is as wide as the widest row: 0.3 re-encoded 6,581 tokens
# where 0.5 re-encoded 29,001 (32 claims under 0.25 GiB, docs/BENCHMARKS.md). A lone row may take nearly all of it.
PLACE_SHARE = 0.3
# A page of a model's arena (debate.engine.kv_store): a waiting conversation wastes half of one on average.
PAGE = 64
# A slot's width is a multiple of this (debate.engine.kv_pool), and so are a compiled step's columns
# (debate.engine.decode_step): a handful of widths serve a run.
COLUMN_BUCKET = 256


def reserve_bytes(s, size, rows, columns, new_tokens, fused=False, trie=0, piece=PREFILL_CHUNK):
    """What a model's persistent decode batch needs besides its KV memory, at most: the prompt tokens a step carries
    (`piece`, --prefill-tokens: counted as one row's piece attending to `columns`, the most any piece of them can
    attend to), the decode step of `rows` rows over `columns` columns with its masks, structured decoding's extras for
    every row and one choice's tree pass, the rows' pick history. On CUDA the step's transients stay in the captured
    graphs' pool, so the prefill's and the step's are added, not maxed (a mixed forward carries both)."""
    prefill = prefill_bytes(s, 1, min(columns, piece), max(0, columns - piece), size, fused, piece)
    step = (decode_step_bytes(s, rows, columns, size, fused) + decode_masks_bytes(s, rows, columns, size, new_tokens)
            + structured_step_bytes(s, rows, size) + choice_pass_bytes(s, trie, columns, size, fused))
    return prefill + step


def kv_plan(s, size, budget, rows, widest, new_tokens, fused=False, trie=0, piece=PREFILL_CHUNK):
    """How a model's `budget` bytes split (debate.engine.kv_pool): {"reserve", "tokens"}: the reserve for `rows` rows
    of at most `widest` columns and steps carrying `piece` prompt tokens, and the tokens of keys and values the rest
    holds (the place's and the pages')."""
    per_token = kv_bytes_per_token(s, size)
    columns = max(1, min(widest, budget // max(per_token, 1)))
    reserve = reserve_bytes(s, size, rows, columns, new_tokens, fused, trie, piece)
    return {"reserve": reserve, "tokens": max(0, budget - reserve) // per_token}


def reserve_columns(widest, longest=None):
    """The columns the engine's reserve is planned for (debate.engine.kv_pool.Memory): the widest slot the place may
    give rows of `widest` columns, twice that rounded up to COLUMN_BUCKET, within `longest` (the longest context the
    run's settings allow: --max-context, else the model's window, with a turn's new tokens)."""
    roomy = 2 * (-(-widest // COLUMN_BUCKET) * COLUMN_BUCKET)
    return max(widest, min(roomy, longest or roomy))


def claims_in_flight(s, size, budget, conversations, context, new_tokens, chunk=PREFILL_CHUNK, trie=0, fused=True,
                     rows=32, reserve_width=None):
    """How many claims fit `budget` bytes with every cache kept, as the engine's memory authority uses it (kv_plan
    for reserve_columns, and kv_pool.place_geometry's slots of `rows` rows at most): each claim decodes one row of
    `context` + `new_tokens` columns (rounded up to COLUMN_BUCKET) in the place, which takes PLACE_SHARE of the memory
    at most, and keeps its other `conversations` - 1 caches of `context` tokens in pages. `reserve_width`: the
    reserve's columns instead (the engine before issue 53 planned it for the model's whole window). `chunk` is unused
    (every prefill piece is PREFILL_CHUNK tokens). 0: not even one claim."""
    del chunk
    widest = context + new_tokens + trie
    plan = kv_plan(s, size, budget, rows, reserve_width or reserve_columns(widest), new_tokens, fused, trie)
    tokens = plan["tokens"]
    width = -(-(context + new_tokens + trie) // COLUMN_BUCKET) * COLUMN_BUCKET
    waiting = -(-context // PAGE) * PAGE * max(0, conversations - 1)
    n = min(rows, int(tokens * PLACE_SHARE) // width)
    while n > 0 and n * (width + waiting) > tokens:
        n -= 1
    return n


def attention_is_fused(implementation):
    """Whether a transformers attention implementation computes scores blockwise: sdpa (its CUDA kernels and
    its CPU flash kernel take a mask) and flash attention; eager materialises them."""
    return implementation in ("sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")


def lora_params(s, r):
    return s["layers"] * sum((a + b) * r for a, b in linear_shapes(s))


def train_step_bytes(s, r, length, micro_batch=1, target=256, checkpointing=True, nf4=True, act_bytes=2,
                     dropout=0.05, fused_attention=True):
    """{part: bytes} of one D-DPO optimizer step above the weights; chosen and rejected rows of `length`
    tokens each (see the module doc)."""
    rows = 2 * micro_batch
    tokens = rows * length
    kv = s["kv_heads"] * s["head_dim"]
    per_layer = tokens * (4 * s["hidden"] + 2 * kv + 3 * s["inter"]) * act_bytes
    lora_inputs = sum(a for a, _ in linear_shapes(s))  # each adapted layer's input width
    lora_dropout = tokens * lora_inputs * (act_bytes + 1) if dropout > 0 else 0
    lora_acts = tokens * 7 * r * 4  # lora_A's outputs (float32), kept for the backward
    attention = 0 if fused_attention else rows * s["heads"] * length * length * 4 * 3 + rows * length * length
    attention += tokens * 2 * s["heads"] * s["head_dim"] * act_bytes  # keys and values repeated to every head
    layer = per_layer + lora_acts + attention
    if checkpointing:
        # one hidden state per layer saved; one layer recomputed, with its gradients beside it
        activations = tokens * s["hidden"] * act_bytes * s["layers"] + 2 * layer
    else:
        activations = layer * s["layers"] + per_layer
    dequantised = 2 * max(a * b for a, b in linear_shapes(s)) * act_bytes if nf4 else 0
    logits = rows * (target + 1) * s["vocab"] * (act_bytes + 4 * 3)
    return {"lora + grads + AdamW": lora_params(s, r) * 16, "activations": activations,
            "lora dropout": (2 if checkpointing else s["layers"]) * lora_dropout, "dequantised": dequantised,
            "logits": logits}
