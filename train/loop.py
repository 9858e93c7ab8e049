"""The training loop shared by D-SFT and D-DPO, written out in plain PyTorch.

One optimizer step = `grad_accum` micro-batches of `micro_batch` examples on every process. The data
order of epoch e is a permutation seeded by (seed, e), so the step number alone says which examples
come next: a run resumed from the checkpoint of step s replays steps s+1... exactly as an uninterrupted
run would (same batches, same optimizer and scheduler state, same dropout random state).

Under `accelerate launch` each process takes every world_size-th example of the permutation (trimmed
so all processes take the same number of steps) and the gradients are averaged by DDP at the last
micro-batch of each step; with one process nothing changes.
"""
import contextlib
import errno
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, List, Optional, Union

import torch
from tqdm import tqdm

from debate.data import jsonl
from debate.pipeline import stops
from train import lora
from train.settings import DEFAULTS, TrainSettings

CHECKPOINTS = "checkpoints"
DISK_NEARLY_FULL = 1 << 20  # bytes free below which a failed checkpoint write is taken for a full disk
STATE = "trainer_state.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


class TrainError(ValueError):
    pass


@dataclass(frozen=True)
class TrainConfig:
    """What the loop needs of the training settings (train/settings.py, whose defaults these are) and the few
    settings no flag sets."""
    lr: float = DEFAULTS.lr
    epochs: int = DEFAULTS.epochs
    micro_batch: int = DEFAULTS.micro_batch
    grad_accum: int = DEFAULTS.grad_accum
    warmup_ratio: float = DEFAULTS.warmup_ratio
    schedule: str = DEFAULTS.schedule  # or "linear", "constant" (after warm-up)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    save_every: int = DEFAULTS.save_every  # optimizer steps between checkpoints
    keep_checkpoints: int = 2
    seed: int = DEFAULTS.seed

    @classmethod
    def of(cls, settings: TrainSettings) -> "TrainConfig":
        """The loop's part of the training settings."""
        return cls(lr=settings.lr, epochs=settings.epochs, micro_batch=settings.micro_batch,
                   grad_accum=settings.grad_accum, warmup_ratio=settings.warmup_ratio, schedule=settings.schedule,
                   save_every=settings.save_every, seed=settings.seed)


def micro_batches(n: int, epoch: int, cfg: TrainConfig, rank: int = 0, world: int = 1) -> List[List[int]]:
    """This process's micro-batches (lists of example indices) of `epoch`."""
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
    order = torch.randperm(n, generator=generator).tolist()
    order = order[: n // world * world][rank::world]
    return [order[i:i + cfg.micro_batch] for i in range(0, len(order), cfg.micro_batch)]


def steps_per_epoch(n: int, cfg: TrainConfig, world: int = 1) -> int:
    return math.ceil(len(micro_batches(n, 0, cfg, 0, world)) / cfg.grad_accum)


def lr_factor(step: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def autocast(device: torch.device, model: Any = None) -> Any:
    """Mixed precision for a forward pass on `device`: bf16 (fp16 where the card lacks bf16) on CUDA, where the
    4-bit base computes in it. On a CPU: bf16 where `model` computes in it (an NF4 base loaded with bf16
    compute, the GPU's setting, which tests/test_4bit.py runs through this very function), else nothing:
    training on a CPU runs in fp32 by default."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    if model is not None and _compute_dtype(model) == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _compute_dtype(model: Any) -> torch.dtype:
    # The unquantised weights (embeddings, norms) are held in the compute dtype (debate.engine.models.load_model).
    return getattr(model, "module", model).get_input_embeddings().weight.dtype


def latest_checkpoint(out_dir: Union[str, Path]) -> Optional[Path]:
    """The newest complete checkpoint directory under `out_dir`, or None."""
    root = Path(out_dir) / CHECKPOINTS
    done = sorted(p for p in root.glob("step-*") if (p / STATE).exists()) if root.exists() else []
    return done[-1] if done else None


def _save_checkpoint(model, optimizer, scheduler, step, out_dir, loaded, cfg, fingerprint):
    root = Path(out_dir) / CHECKPOINTS
    final = root / f"step-{step:06d}"
    tmp = root / f"tmp-step-{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        lora.save_adapter(model, tmp, loaded)
        torch.save({"step": step, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                    "rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                    "config": asdict(cfg), "data": fingerprint}, tmp / STATE)
    except Exception as err:
        # torch.save and safetensors report a full disk as their own errors, without errno: a disk with
        # (almost) nothing free when the save failed is one, said as such (debate/pipeline/stops.py).
        full = not isinstance(err, OSError) and shutil.disk_usage(root).free < DISK_NEARLY_FULL
        shutil.rmtree(tmp, ignore_errors=True)  # the checkpoints before stay; the half-written one frees its room
        if full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp)) from err
        raise
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)  # a checkpoint exists complete or not at all
    for old in sorted(p for p in root.glob("step-*") if (p / STATE).exists())[:-cfg.keep_checkpoints]:
        shutil.rmtree(old)


def _resume(model, optimizer, scheduler, ckpt, cfg, fingerprint):
    state = torch.load(ckpt / STATE, map_location="cpu", weights_only=False)
    changed = [k for k, v in asdict(cfg).items() if k not in ("save_every", "keep_checkpoints")
               and state["config"].get(k) != v]
    if changed:
        raise TrainError(f"{ckpt}: saved with other training settings ({', '.join(changed)}); "
                         "resume with the same settings, or start over with --overwrite")
    if state["data"] != fingerprint:
        raise TrainError(f"{ckpt}: saved for other training data ({state['data']} vs {fingerprint}); "
                         "start over with --overwrite")
    lora.load_adapter_weights(model, ckpt)
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"])
    if state["cuda_rng"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return state["step"]


def _keep_metrics_until(path, step):
    """Drop log lines of steps after `step`: they belong to the run that died and will be redone."""
    if path.exists():
        jsonl.write(path, [row for row in jsonl.read(path) if row["step"] <= step])


@contextlib.contextmanager
def _stops_after_a_step(desc, out, total):
    """The training loop's frame: a first signal waits for the step's end (train() then checkpoints and stops),
    and whatever ends the loop early says which checkpoint is kept (debate/pipeline/stops.py)."""
    try:
        with stops.deferred(f"{desc}: stopping once the step in progress is done and checkpointed"):
            yield
    except BaseException as err:
        ckpt = latest_checkpoint(out)
        if ckpt is None:
            stops.note(err, f"{desc}: no checkpoint yet in {out}", resume="the same command starts it again")
        else:
            stops.note(err, f"{desc} checkpoint of step {int(ckpt.name.split('-')[1])} of {total} in {ckpt}",
                       resume="the same command with --resume continues from it")
        raise


def train(model: Any, examples: List[dict], step_loss: Callable, make_batch: Callable[[List[dict]], dict],
          cfg: TrainConfig, out_dir: Union[str, Path], loaded: Any, accelerator: Any, *, resume: bool = False,
          stop_after: Optional[int] = None, desc: str = "train", fingerprint: Optional[dict] = None) -> dict:
    """Train `model`'s adapter on `examples`; returns the summary dict (also written to summary.json).

    step_loss(model, batch) -> (loss, metrics dict, target tokens); make_batch(list of examples) -> batch.
    `stop_after` ends the run after that many optimizer steps (tests use it to simulate a crash).
    """
    # -- setup: the step count, the optimizer and its schedule, the model wrapped for the processes
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    per_epoch = steps_per_epoch(len(examples), cfg, world)
    total = per_epoch * cfg.epochs
    if total == 0:
        raise TrainError(f"{len(examples)} examples make no training step on {world} process(es)")
    fingerprint = fingerprint or {"examples": len(examples)}
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer, scheduler = _optimizer(params, cfg, total)
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)

    # -- resume: the last checkpoint's step, or 0
    start = _start_step(out, inner, optimizer, scheduler, cfg, fingerprint, resume, accelerator)
    end = total if stop_after is None else min(total, start + stop_after)

    # -- the steps: each one logged; saved every --save-every steps, at the end, and when asked to stop
    model.train()
    t0, seen_tokens, last = time.time(), 0, {}
    order_epoch, order = None, []
    bar = tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True,
               disable=not accelerator.is_main_process)
    # Ctrl-C or SIGTERM while a step runs ends the run once that step is done and checkpointed (a second signal
    # stops at once; the last checkpoint is then where --resume starts). The bar closes first: a stop's line
    # starts a line of its own.
    with _metrics_log(out / METRICS, accelerator.is_main_process) as metrics_log, bar, \
            _stops_after_a_step(desc, out, total):
        for step in range(start, end):
            epoch, k = divmod(step, per_epoch)
            if epoch != order_epoch:
                order_epoch, order = epoch, micro_batches(len(examples), epoch, cfg, rank, world)
            group = order[k * cfg.grad_accum:(k + 1) * cfg.grad_accum]
            t_step = time.time()
            done = _step(model, params, optimizer, scheduler, [[examples[j] for j in indices] for indices in group],
                         step_loss, make_batch, cfg, accelerator)
            last = _step_row(done, step, epoch + (k + 1) / per_epoch, time.time() - t_step, accelerator)
            seen_tokens += last["tokens"]
            if metrics_log is not None:
                metrics_log(last)
            bar.set_postfix(loss=f"{last['loss']:.4f}", tok_s=f"{last['tokens_per_s']:.0f}")
            bar.update(1)
            stopping = _any_process_stopping(accelerator)
            if (step + 1) % cfg.save_every == 0 or step + 1 == total or stopping:
                if accelerator.is_main_process:
                    _save_checkpoint(inner, optimizer, scheduler, step + 1, out, loaded, cfg, fingerprint)
                accelerator.wait_for_everyone()
            if stopping:  # the step is done and saved: a resume from it is the uninterrupted run's next step
                stops.stop_now()

    # -- the summary
    elapsed = time.time() - t0
    summary = {"steps": end, "total_steps": total, "epochs": cfg.epochs, "examples": len(examples),
               "processes": world, "seconds": round(elapsed, 1), "tokens": seen_tokens,
               "tokens_per_s": round(seen_tokens / max(elapsed, 1e-9), 1), "last": last,
               "finished": end == total}
    if accelerator.device.type == "cuda":
        summary["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    model.eval()
    return summary


def _optimizer(params, cfg, total):
    """AdamW over the trainable weights and its learning-rate schedule: warm-up, then --schedule."""
    warmup = math.ceil(cfg.warmup_ratio * total)
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, total, warmup, cfg.schedule))
    return optimizer, scheduler


def _start_step(out, model, optimizer, scheduler, cfg, fingerprint, resume, accelerator):
    """The step to start from: the last checkpoint's with --resume (its state loaded, the metrics of later
    steps dropped), else 0 (a fresh metrics file); leftover checkpoints without --resume are refused."""
    metrics_path = out / METRICS
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not resume:
        raise TrainError(f"{out} already holds checkpoints (last: {ckpt.name}); "
                         "add --resume to continue from it, or --overwrite to start over")
    if ckpt is None:
        if accelerator.is_main_process:
            metrics_path.unlink(missing_ok=True)
        return 0
    start = _resume(model, optimizer, scheduler, ckpt, cfg, fingerprint)
    if accelerator.is_main_process:
        _keep_metrics_until(metrics_path, start)
    return start


def _step(model, params, optimizer, scheduler, group, step_loss, make_batch, cfg, accelerator):
    """One optimizer step over `group` (micro-batches of examples): gradients accumulated, synchronised across
    processes at the last micro-batch only, clipped, applied. This process's sums, token counts, norm, lr."""
    sums, tokens, targets = {}, 0, 0
    for i, micro_batch in enumerate(group):
        batch = make_batch(micro_batch)
        sync = i == len(group) - 1
        with (contextlib.nullcontext() if sync else accelerator.no_sync(model)), autocast(accelerator.device, model):
            loss, metrics, n = step_loss(model, batch)
        accelerator.backward(loss / len(group))
        tokens += int(batch["attention_mask"].sum())  # every token through the model
        targets += n
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value / len(group)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {"sums": sums, "tokens": tokens, "targets": targets, "grad_norm": float(grad_norm), "lr": lr}


def _step_row(done, step, epoch, seconds, accelerator):
    """The metrics line of a step: its metrics averaged over the processes, its tokens summed."""
    sums = done["sums"]
    reduced = accelerator.reduce(torch.tensor([*sums.values(), float(done["tokens"]), float(done["targets"])],
                                              device=accelerator.device), reduction="sum")
    values = (reduced / accelerator.num_processes).tolist()
    tokens, targets = int(reduced[-2].item()), int(reduced[-1].item())
    return {"step": step + 1, "epoch": round(epoch, 4), "lr": done["lr"],
            **{key: round(v, 6) for key, v in zip(sums, values)}, "grad_norm": round(done["grad_norm"], 4),
            "tokens": tokens, "target_tokens": targets, "tokens_per_s": round(tokens / max(seconds, 1e-9), 1)}


def _any_process_stopping(accelerator):
    """Whether any process was asked to stop (Ctrl-C, SIGTERM): all then stop after the same step."""
    asked = torch.tensor([float(stops.pending() is not None)], device=accelerator.device)
    return bool(accelerator.reduce(asked, reduction="sum").item())


@contextlib.contextmanager
def _metrics_log(path, main_process):
    """Append one line per step to metrics.jsonl, flushed as written (the main process only; others get None)."""
    if not main_process:
        yield None
        return
    with open(path, "a", encoding="utf-8", newline="\n") as file:
        writer = jsonl.writer(file)

        def write(row):
            writer.write(row)
            file.flush()

        yield write
