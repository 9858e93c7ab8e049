"""The offline block (debate/engine/offline.py) holds whatever module of the project a process imports first.

Each import order runs in a fresh process with none of the switches in its environment (tests/conftest.py sets them
in this one), then loads a tiny model in NF4 on the CPU: the load that imports bitsandbytes, whose CPU backend asks
the `kernels` package for a hub kernel. The orders are started together, as a process each.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SWITCHES = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1", "USE_HUB_KERNELS": "NO"}

# The first import of each order; then the loader (debate.engine.models) loads the model in NF4. run_debate: the
# script's main path, a DebateCV run with --4bit, whose own load is the NF4 load.
FIRST = {
    "engine": "import debate.engine.engine",
    "models": "import debate.engine.models",
    "package": "from debate import Verifier",
    "train": "import train.lora",  # its first line imports peft (transformers, bitsandbytes)
    "transformers": "import transformers",  # a user's script: the hub read its switches before we set them
    "run_debate": "import runpy; sys.argv = ['run_debate.py', *sys.argv[3:]]; "
                  "runpy.run_path('run_debate.py', run_name='__main__')",
}

# What the process reports once its model is loaded: the switches, hub's own offline flag, whether the real
# `kernels` package was ever imported, and the level of the bitsandbytes logger the block quiets.
SCRIPT = """\
import json, logging, os, sys
order, model = sys.argv[1:3]
{first}
from debate.engine import models
if order != 'run_debate':
    assert models.load_model(model, use_4bit=True).quantized
import huggingface_hub.constants
print('REPORT ' + json.dumps({{
    'env': {{name: os.environ.get(name) for name in {names!r}}},
    'hub_offline': huggingface_hub.constants.HF_HUB_OFFLINE,
    'kernels_blocked': sys.modules.get('kernels', 'absent') is None,
    'kernels_modules': sorted(m for m in sys.modules if m.startswith('kernels.')),
    'bitsandbytes': 'bitsandbytes' in sys.modules,
    'bitsandbytes_log': logging.getLogger('bitsandbytes.backends.cpu.ops').getEffectiveLevel(),
}}))
"""


def test_the_offline_block_holds_whatever_is_imported_first(tiny, tmp_path):
    # No switch from this process: each one must be set by the code the order imports.
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env["DEBATECV_CACHE"] = str(tmp_path / "cache")
    run = ["--split", "demo", "--evidence", "golden", "--model", tiny, "--4bit", "--limit", "1", "--max-rounds", "1",
           "--max-new-tokens", "2", "--no-structured", "--output-dir", str(tmp_path / "run")]
    started = {order: subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(first=first, names=tuple(SWITCHES)), order, tiny, *run],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for order, first in FIRST.items()}
    wrong = {}
    for order, process in started.items():
        output = process.communicate(timeout=600)[0]
        reports = [line for line in output.splitlines() if line.startswith("REPORT ")]
        if process.returncode or not reports:
            wrong[order] = f"exit {process.returncode}: {output[-2000:]}"
            continue
        report = json.loads(reports[-1][len("REPORT "):])
        expected = {"env": SWITCHES, "hub_offline": True, "kernels_blocked": True, "kernels_modules": [],
                    "bitsandbytes": True, "bitsandbytes_log": 40}  # logging.ERROR
        # No line of the `kernels` package ("Skipping publisher trust check for 'kernels-community/...'") nor of
        # bitsandbytes' fallback ("Failed to load CPU gemm_4bit_forward from kernels-community ...").
        lines = [line for line in output.splitlines() if "publisher trust" in line or "kernels-community" in line]
        if report != expected or lines:
            wrong[order] = {"report": report, "lines": lines}
    assert not wrong, json.dumps(wrong, indent=1)
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["precision"] == "nf4"  # run_debate's run loaded its model in NF4

