"""Training the moderator (SynDeC, D-SFT, D-DPO). Imports debate first: its package sets the offline switches and
blocks the `kernels` package (debate/engine/offline.py) before train.lora's peft import reaches transformers and
bitsandbytes."""
import debate  # noqa: F401
