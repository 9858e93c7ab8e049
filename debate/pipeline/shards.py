"""One run over many processes (`torchrun`, `accelerate launch`): the claims split by rank, merged by rank 0.

    torchrun --nproc_per_node 4 run_debate.py --split dev ...

Each process verifies every N-th claim starting at its rank into its own resumable run directory,
OUTPUT_DIR/shards/rank-<r>-of-<N>/ (records.RunDir, as a one-process run), on the GPU of its local rank.
Once every rank is done (a torch.distributed barrier), rank 0 merges the shards' predictions and
transcripts into OUTPUT_DIR's own files, which are then scored as a one-process run's are.

Round-robin, not contiguous blocks: claim i goes to rank i mod N whatever --limit is (--limit keeps a
prefix), so a shard resumed with another --limit still holds its own claims. A directory keeps the
number of processes it was started with: another count (one process included) is refused, as the
claims done would sit in shards the new split does not read; --overwrite starts over.
"""
import os
import shutil
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from debate.data import jsonl
from debate.pipeline import records
from debate.pipeline.config import ConfigError

SHARDS = "shards"
# Ranks wait at the barrier for the slowest shard: hours on a large split, far past torch's default timeout.
BARRIER_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0


def world(environ=None):
    """This process's place in a multi-process launch, from the variables torchrun and accelerate set."""
    environ = os.environ if environ is None else environ
    try:
        size = int(environ.get("WORLD_SIZE", "1"))
        rank = int(environ.get("RANK", "0"))
        local_rank = int(environ.get("LOCAL_RANK", str(rank)))
    except ValueError as err:
        raise ConfigError(f"WORLD_SIZE, RANK and LOCAL_RANK must be integers ({err})") from None
    if size < 1 or not 0 <= rank < size or local_rank < 0:
        raise ConfigError(f"RANK {rank} of WORLD_SIZE {size} names no process")
    return World(rank, size, local_rank)


def split(claims, w):
    """The claims rank `w.rank` of `w.size` verifies: every size-th, starting at its rank."""
    return claims[w.rank::w.size]


def shard_dir(output_dir, w):
    return Path(output_dir) / SHARDS / f"rank-{w.rank}-of-{w.size}"


def counts(output_dir):
    """The process counts of the shard directories under `output_dir`."""
    top = Path(output_dir) / SHARDS
    if not top.is_dir():
        return set()
    return {int(d.name.rsplit("-of-", 1)[1]) for d in top.iterdir()
            if d.is_dir() and d.name.startswith("rank-") and d.name.rsplit("-of-", 1)[-1].isdigit()}


def check(output_dir, size, overwrite=False):
    """Refuse (RunConflict) resuming `output_dir` with another number of processes than it was started with.

    Read only, so every rank can run it and all refuse alike. A one-process run is size 1: it has no
    shards, and a directory whose predictions are its own (no shards) is one it started.
    """
    if overwrite:
        return
    out = Path(output_dir)
    found = counts(out)
    if found - {size}:
        raise records.RunConflict(
            f"{out / SHARDS} holds a run over {' and '.join(map(str, sorted(found)))} processes, not {size}; "
            "resume it with that many (torchrun --nproc_per_node), or start over with --overwrite")
    if size > 1 and not found and records.read_jsonl(out / records.PREDICTIONS, repair=False):
        raise records.RunConflict(f"{out} holds a one-process run; resume it with one process, or start over "
                                  "with --overwrite")


def clear(output_dir, keep=None):
    """Remove the shard directories of `output_dir` (--overwrite), but those of `keep` processes."""
    top = Path(output_dir) / SHARDS
    if not top.is_dir():
        return
    for d in top.iterdir():
        if keep is None or not d.name.endswith(f"-of-{keep}"):
            shutil.rmtree(d)
    if keep is None:
        shutil.rmtree(top)


def merge(output_dir, size):
    """Write the predictions and transcripts of the `size` shards into `output_dir`'s own files (rank by
    rank, each file atomically). Returns the merged predictions."""
    out = Path(output_dir)
    predictions, transcripts, seen = [], [], set()
    for rank in range(size):
        shard = shard_dir(out, World(rank, size))
        done = records.read_jsonl(shard / records.PREDICTIONS, repair=False)
        ids = {p["claim_id"] for p in done} - seen
        predictions += [p for p in done if p["claim_id"] in ids]
        # A finished shard has one transcript per prediction (RunDir drops orphans when it resumes).
        transcripts += [t for t in records.read_jsonl(shard / records.TRANSCRIPTS, repair=False)
                        if t["claim_id"] in ids]
        seen |= ids
    out.mkdir(parents=True, exist_ok=True)
    jsonl.write(out / records.TRANSCRIPTS, transcripts)
    jsonl.write(out / records.PREDICTIONS, predictions)
    return predictions


def start(w):
    """Join the process group of a multi-process launch (once): NCCL on CUDA, each process on the GPU of its
    local rank (models.load_model takes the current device); gloo on CPU. Ranks but 0 show no progress bar."""
    import torch
    import torch.distributed as dist

    if w.size == 1 or dist.is_initialized():
        return
    if w.rank:
        os.environ.setdefault("TQDM_DISABLE", "1")  # tqdm reads TQDM_<arg> for its defaults
    if torch.cuda.is_available():
        torch.cuda.set_device(w.local_rank)
        dist.init_process_group("nccl", timeout=BARRIER_TIMEOUT, device_id=torch.device("cuda", w.local_rank))
    else:
        dist.init_process_group("gloo", timeout=BARRIER_TIMEOUT)


def barrier(w):
    if w.size > 1:
        import torch.distributed as dist

        dist.barrier()


def stop(w):
    if w.size > 1:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
