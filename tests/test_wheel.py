"""The built wheel works outside the checkout: prompts, demo claims and console scripts come with it.

Builds the wheel from a copy of the source, installs it with no index into a fresh venv that sees this
environment's packages (torch, transformers, ...) but not its editable debatecv, and runs from an empty
directory. About a minute (marker `wheel`: `-m "not wheel"` skips it).
"""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from debate.data.labels import LABELS
from tests.tiny_models import build_tiny_llama

ROOT = Path(__file__).resolve().parents[1]
# What a source distribution would not carry either: VCS data, environments, build outputs, runs.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "venv", "build", "dist", "runs", "*.egg-info", "__pycache__",
                                    ".pytest_cache", "out")

pytestmark = pytest.mark.wheel


def _run(cmd, cwd, env, timeout=600):
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd[0]} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin directory, environment for its commands) with only the built wheel's debatecv."""
    tmp = tmp_path_factory.mktemp("wheel")
    # Build from a copy: an in-tree build would leave build/ behind, and a stale build/lib in the
    # checkout could put files into the wheel that the source no longer has.
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=NOT_SOURCE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp / "dist", src],
         cwd=tmp, env=env)
    (wheel,) = (tmp / "dist").glob("debatecv-*.whl")
    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp, env=env)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp, env).strip())
    # `venv --system-site-packages` from inside a venv would see the system Python's packages, not this
    # environment's. A plain path line in a .pth adds this environment's site-packages without running
    # the .pth files in it, so the editable install of the checkout is not activated there.
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps", wheel],
         cwd=tmp, env=env)
    return venv / "bin", env


def test_the_installed_package_finds_its_prompts_and_demo_claims_from_any_directory(installed, tmp_path):
    bin_dir, env = installed
    out = _run([bin_dir / "python", "-c",
                "import json, debate, prompts, run_debate; "
                "from debate.data import averitec, prompts as p, answer_schemas; "
                "print(json.dumps({'debate': debate.__file__, 'prompts': str(p.PROMPT_DIR), "
                "'scripts': run_debate.__file__, 'meta': p.raw_prompt('moderator_meta'), "
                "'none': p.load_prompt('no_evidence'), 'schema': len(answer_schemas.load('moderator_round').fields), "
                "'claims': len(averitec.load_split('demo', None))}))"], cwd=tmp_path, env=env)
    found = json.loads(out.splitlines()[-1])
    venv = bin_dir.parent
    for key in ("debate", "prompts", "scripts"):
        assert Path(found[key]).is_relative_to(venv), f"{key} imported from {found[key]}, not the wheel"
    shipped = ROOT / "prompts"
    assert found["meta"] == (shipped / "moderator_meta.txt").read_text().rstrip("\n")
    assert found["none"] == (shipped / "no_evidence.txt").read_text().rstrip("\n")
    assert found["schema"] == len(json.loads((shipped / "moderator_round.schema.json").read_text())["fields"])
    assert found["claims"] == len(json.loads((ROOT / "debate" / "data" / "demo" / "claims.json").read_text()))


def test_the_console_scripts_run_a_one_claim_demo_from_an_empty_directory(installed, tmp_path):
    bin_dir, env = installed
    for script in ("debatecv-run", "debatecv-train", "debatecv-view"):
        assert "--help" in _run([bin_dir / script, "--help"], cwd=tmp_path, env=env)
    tiny = build_tiny_llama(tmp_path / "tiny")
    work = tmp_path / "work"
    work.mkdir()
    # Structured decoding (the default) gives even a random model one of the four labels.
    _run([bin_dir / "debatecv-run", "--split", "demo", "--limit", "1", "--model", tiny, "--max-rounds", "1",
          "--max-new-tokens", "120", "--batch-size", "1", "--temperature", "0"], cwd=work, env=env)
    run_dir = work / "runs" / "demo-golden-debatecv"  # the default output directory, under the current one
    lines = (run_dir / "predictions.jsonl").read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["label"] in LABELS
    assert json.loads((run_dir / "metrics.json").read_text())["n"] == 1
    # The report's script and styles are package data: a report built from the wheel alone carries them.
    _run([bin_dir / "debatecv-view", run_dir, "-o", work / "report.html"], cwd=work, env=env)
    page = (work / "report.html").read_text(encoding="utf-8")
    assert 'id="runs-data"' in page and "function buildTable" in page and ".claim-table" in page
