"""What many test files share: the tiny random-weight model (tests/tiny_models.py) as the `tiny` fixture, and
`own_cache`, the embeddings' cache in a folder of the tests' own; torch.compile's disk cache apart for each of torch's
CPU kernel sets."""
import getpass
import os
import tempfile

import pytest
import torch

from debate.engine import offline

# The switches a run sets before any model loads (runner.run), set for every test, whatever order the test imports
# torch, transformers and the engine in: the offline ones, transformers' hub kernels off among them.
offline.set_offline()

from tests.tiny_models import build_tiny_llama  # noqa: E402


def _inductor_cache_by_kernel_set():
    """Code torch.compile cached under one of torch's CPU kernel sets aborts the process that loads it under another
    (torch 2.13: compiled under ATEN_CPU_CAPABILITY=avx2, then run under AVX-512, tests/test_compiled_decode.py dies
    with "Fatal Python error: Aborted"; each alone passes). docs/install.md has the tests tried under both, so each
    kernel set gets its own cache folder beside inductor's default; a TORCHINDUCTOR_CACHE_DIR set by the user stands."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        return
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    capability = torch.backends.cpu.get_cpu_capability().lower()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(), f"torchinductor_{user}_{capability}")


_inductor_cache_by_kernel_set()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The path of a tiny random-weight Llama (seed 0), built once per test module."""
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


@pytest.fixture(scope="module")
def own_cache(tmp_path_factory):
    """The store and corpus embeddings' cache in a folder of the module's own, not the user's (use it with
    `pytestmark = pytest.mark.usefixtures("own_cache")`)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DEBATECV_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def run_argv(model, out, *extra, max_new_tokens=4, max_rounds=1, batch_size=None, limit=None, temperature=None):
    """run_debate.py's flags for a small run of `model` on the demo split's golden evidence into `out`, free
    decoding (a random model writes no JSON); `extra` flags last."""
    flags = ["--split", "demo", "--evidence", "golden", "--model", model, "--max-new-tokens", str(max_new_tokens),
             "--max-rounds", str(max_rounds), "--no-structured", "--output-dir", str(out)]
    for flag, value in (("--batch-size", batch_size), ("--limit", limit), ("--temperature", temperature)):
        if value is not None:
            flags += [flag, str(value)]
    return flags + list(extra)
