"""The decode rows' attention kernel for a CPU (decode_rows.c): built once per machine with the system's C compiler,
loaded with ctypes, called once a layer for every decode row of a step (debate.engine.attention.per_slot; issue 59).

Built where it can be, never required: with no C compiler, a build that fails, a tensor that is not float32 or
bfloat16 on a CPU, or `DEBATECV_CPU_KERNEL=0`, the decode rows attend with sdpa as before (`available()` says which,
and why not). The build takes about a second, once: the library is kept under `~/.cache/debatecv/kernels` (or
`$DEBATECV_CACHE`), named by a hash of the source, the compiler's version and this CPU's flags, so a new CPU or an
edited source builds anew and a cluster's nodes sharing a home directory each find their own. It is written to a
temporary name and renamed: processes starting together never load half a file.

-march=native: the loop runs at the CPU's own vector width (AVX-512 here, AVX2 elsewhere). -ffast-math lets the
compiler reorder the dot products' sums and vectorize `expf` (glibc's vector math); a row's result still depends on
its own columns alone.
"""
import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Tuple

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("decode_rows.c")
FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-shared"]
THREADS = "-fopenmp"  # the rows over torch's threads; a compiler without OpenMP (Apple's clang) builds it on one
ENTRY = {torch.float32: "decode_rows_f32", torch.bfloat16: "decode_rows_bf16"}  # the library's, by dtype
SWITCH = "DEBATECV_CPU_KERNEL"  # "0": never build or use the kernel (sdpa for every decode row)

_library: Optional[ctypes.CDLL] = None
_why_not: Optional[str] = None
_tried = False


def _cache_dir() -> Path:
    root = os.environ.get("DEBATECV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "debatecv")
    return Path(root) / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _compiler() -> Optional[Tuple[str, str]]:
    """The C compiler (the CC variable's, else cc, gcc or clang) and its version line, or None."""
    for name in filter(None, (os.environ.get("CC"), "cc", "gcc", "clang")):
        path = shutil.which(name)
        if path:
            done = subprocess.run([path, "--version"], capture_output=True, text=True)
            if done.returncode == 0:
                return path, done.stdout.splitlines()[0] if done.stdout else ""
    return None


def _build() -> ctypes.CDLL:
    compiler = _compiler()
    if compiler is None:
        raise OSError("no C compiler (cc, gcc or clang) on the PATH")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler[1].encode(), " ".join([*FLAGS, THREADS]).encode(),
                                     _cpu_flags().encode()])).hexdigest()[:16]
    target = _cache_dir() / f"decode_rows-{key}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(handle)
        try:
            for flags in ([*FLAGS, THREADS], FLAGS):
                done = subprocess.run([compiler[0], *flags, "-o", temporary, str(SOURCE), "-lm"],
                                      capture_output=True, text=True)
                if done.returncode == 0:
                    break
            else:
                raise OSError(f"{compiler[0]} failed on {SOURCE.name}: {done.stderr.strip()[:300]}")
            os.replace(temporary, target)
        finally:
            if os.path.exists(temporary):
                os.unlink(temporary)
    library = ctypes.CDLL(str(target))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    for name in ENTRY.values():
        function = getattr(library, name)
        function.restype = ctypes.c_int
        function.argtypes = [ptr, i64, i64, ptr, i64, i64, i64, ptr, i64, i64, i64, ptr, i64, i64,
                             ptr, i64, i64, i64, i64, ctypes.c_float, ptr, i64, ctypes.c_int]
    return library


def available() -> Tuple[bool, Optional[str]]:
    """Whether the kernel is built and loaded (building it on the first call), and if not, why."""
    global _library, _why_not, _tried
    if os.environ.get(SWITCH, "1") == "0":
        return False, f"{SWITCH}=0"
    if not _tried:
        _tried = True
        try:
            _library = _build()
        except OSError as error:
            _why_not = str(error)
            log.info("decode rows attend with sdpa: the CPU kernel could not be built (%s)", error)
    return _library is not None, _why_not


def usable(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    """Whether the kernel can take these tensors: float32 or bfloat16 alike on a CPU, each head's vector contiguous."""
    return (query.device.type == "cpu" and key.device.type == "cpu"
            and query.dtype == key.dtype == value.dtype and query.dtype in ENTRY
            and query.stride(-1) == key.stride(-1) == value.stride(-1) == 1
            and query.shape[0] == 1 and available()[0])


def decode_rows(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor, rows: torch.Tensor,
                scaling: float, widest: int) -> None:
    """Write into `out` (tokens, heads, dim) the attention of the decode rows listed in `rows` ((n, 4) int64: a row's
    slot, its token's place, the first column it reads and the one past its last). `query` is (1, heads, tokens,
    dim); `key` and `value` (slots, kv_heads, columns, dim), any strides with each head's vector contiguous; all four
    of one dtype (`usable`)."""
    assert _library is not None and rows.dtype == torch.int64 and rows.is_contiguous() and out.dtype == query.dtype
    heads, dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
    threads = torch.get_num_threads()
    scratch = torch.empty(threads * (heads // kv_heads) * widest, dtype=torch.float32)
    failed = getattr(_library, ENTRY[query.dtype])(
        query.data_ptr(), query.stride(2), query.stride(1),
        key.data_ptr(), key.stride(0), key.stride(1), key.stride(2),
        value.data_ptr(), value.stride(0), value.stride(1), value.stride(2),
        out.data_ptr(), out.stride(0), out.stride(1),
        rows.data_ptr(), rows.shape[0], heads, kv_heads, dim, scaling, scratch.data_ptr(), widest, threads)
    if failed:
        raise ValueError(f"decode rows with empty columns or wider than {widest}: {rows.tolist()}")
