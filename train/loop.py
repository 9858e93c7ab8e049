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

import torch
from tqdm import tqdm

from debate.data import jsonl
from debate.pipeline import stops
from train import lora

CHECKPOINTS = "checkpoints"
DISK_NEARLY_FULL = 1 << 20  # bytes free below which a failed checkpoint write is taken for a full disk
STATE = "trainer_state.pt"
METRICS = "metrics.jsonl"
SUMMARY = "summary.json"


class TrainError(ValueError):
    pass


@dataclass
class TrainConfig:
    lr: float = 2e-5
    epochs: int = 2
    micro_batch: int = 1
    grad_accum: int = 8
    warmup_ratio: float = 0.03
    schedule: str = "cosine"  # or "linear", "constant" (after warm-up)
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    save_every: int = 50  # optimizer steps between checkpoints
    keep_checkpoints: int = 2
    seed: int = 0


def micro_batches(n, epoch, cfg, rank=0, world=1):
    """This process's micro-batches (lists of example indices) of `epoch`."""
    generator = torch.Generator().manual_seed(cfg.seed * 1000 + epoch)
    order = torch.randperm(n, generator=generator).tolist()
    order = order[: n // world * world][rank::world]
    return [order[i:i + cfg.micro_batch] for i in range(0, len(order), cfg.micro_batch)]


def steps_per_epoch(n, cfg, world=1):
    return math.ceil(len(micro_batches(n, 0, cfg, 0, world)) / cfg.grad_accum)


def lr_factor(step, total, warmup, schedule):
    """Multiplier of the peak learning rate at optimizer step `step` (0-based)."""
    if step < warmup:
        return (step + 1) / warmup
    if schedule == "constant":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def autocast(device, model=None):
    """Mixed precision for a forward pass on `device`: bf16 (fp16 where the card lacks bf16) on CUDA, where the
    4-bit base computes in it. On a CPU: bf16 where `model` computes in it (an NF4 base loaded with bf16
    compute, the GPU's setting, which tests/test_4bit.py runs through this very function), else nothing:
    training on a CPU runs in fp32 by default."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16)
    if model is not None and _compute_dtype(model) == torch.bfloat16:
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _compute_dtype(model):
    # The unquantised weights (embeddings, norms) are held in the compute dtype (debate.engine.models.load_model).
    return getattr(model, "module", model).get_input_embeddings().weight.dtype


def latest_checkpoint(out_dir):
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


def train(model, examples, step_loss, make_batch, cfg, out_dir, loaded, accelerator, *, resume=False,
          stop_after=None, desc="train", fingerprint=None):
    """Train `model`'s adapter on `examples`; returns the summary dict (also written to summary.json).

    step_loss(model, batch) -> (loss, metrics dict, target tokens); make_batch(list of examples) -> batch.
    `stop_after` ends the run after that many optimizer steps (tests use it to simulate a crash).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = accelerator.process_index, accelerator.num_processes
    per_epoch = steps_per_epoch(len(examples), cfg, world)
    total = per_epoch * cfg.epochs
    if total == 0:
        raise TrainError(f"{len(examples)} examples make no training step on {world} process(es)")
    warmup = math.ceil(cfg.warmup_ratio * total)
    fingerprint = fingerprint or {"examples": len(examples)}

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, total, warmup, cfg.schedule))
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)

    start = 0
    metrics_path = out / METRICS
    ckpt = latest_checkpoint(out)
    if ckpt is not None and not resume:
        raise TrainError(f"{out} already holds checkpoints (last: {ckpt.name}); "
                         "add --resume to continue from it, or --overwrite to start over")
    if resume and ckpt is not None:
        start = _resume(inner, optimizer, scheduler, ckpt, cfg, fingerprint)
        if accelerator.is_main_process:
            _keep_metrics_until(metrics_path, start)
    elif accelerator.is_main_process:
        metrics_path.unlink(missing_ok=True)

    model.train()
    bar = tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True,
               disable=not accelerator.is_main_process)
    log_file = open(metrics_path, "a", encoding="utf-8", newline="\n") if accelerator.is_main_process else None
    log = jsonl.writer(log_file) if log_file else None
    t0, seen_tokens, last = time.time(), 0, {}
    end = total if stop_after is None else min(total, start + stop_after)
    order_epoch, order = None, []
    # Ctrl-C or SIGTERM while a step runs ends the run once that step is done and checkpointed (a second signal
    # stops at once; the last checkpoint is then where --resume starts).
    with bar, _stops_after_a_step(desc, out, total):  # the bar closes first: a stop's line starts a line of its own
        for step in range(start, end):
            epoch, k = divmod(step, per_epoch)
            if epoch != order_epoch:
                order_epoch, order = epoch, micro_batches(len(examples), epoch, cfg, rank, world)
            group = order[k * cfg.grad_accum:(k + 1) * cfg.grad_accum]
            sums, tokens, targets, t_step = {}, 0, 0, time.time()
            for i, indices in enumerate(group):
                batch = make_batch([examples[j] for j in indices])
                sync = i == len(group) - 1
                no_sync = contextlib.nullcontext() if sync else accelerator.no_sync(model)
                with no_sync, autocast(accelerator.device, model):
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

            # Whether any process was asked to stop rides along with the step's sums: all stop after the same step.
            reduced = accelerator.reduce(
                torch.tensor([*sums.values(), float(tokens), float(targets), float(stops.pending() is not None)],
                             device=accelerator.device), reduction="sum")
            values = (reduced / world).tolist()
            tokens, targets = int(reduced[-3].item()), int(reduced[-2].item())
            stopping = bool(reduced[-1].item())
            seen_tokens += tokens
            last = {"step": step + 1, "epoch": round(epoch + (k + 1) / per_epoch, 4), "lr": lr,
                    **{key: round(v, 6) for key, v in zip(sums, values)}, "grad_norm": round(float(grad_norm), 4),
                    "tokens": tokens, "target_tokens": targets,
                    "tokens_per_s": round(tokens / max(time.time() - t_step, 1e-9), 1)}
            if log:
                log.write(last)
                log_file.flush()
            bar.set_postfix(loss=f"{last['loss']:.4f}", tok_s=f"{last['tokens_per_s']:.0f}")
            bar.update(1)
            if (step + 1) % cfg.save_every == 0 or step + 1 == total or stopping:
                if accelerator.is_main_process:
                    _save_checkpoint(inner, optimizer, scheduler, step + 1, out, loaded, cfg, fingerprint)
                accelerator.wait_for_everyone()
            if stopping:  # the step is done and saved: a resume from it is the uninterrupted run's next step
                stops.stop_now()
    if log_file:
        log_file.close()
    elapsed = time.time() - t0
    summary = {"steps": end, "total_steps": total, "epochs": cfg.epochs, "examples": len(examples),
               "processes": world, "seconds": round(elapsed, 1), "tokens": seen_tokens,
               "tokens_per_s": round(seen_tokens / max(elapsed, 1e-9), 1), "last": last,
               "finished": end == total}
    if accelerator.device.type == "cuda":
        summary["peak_memory_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    model.eval()
    return summary
