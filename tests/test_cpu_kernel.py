"""The decode rows' CPU kernel (debate/engine/decode_rows.c through debate.engine.cpu_kernel): each row's query heads
over exactly its own slot's columns, against sdpa written row by row, for the heads of the models we run (groups of
2 and 4, heads 32 to 256 wide), any strides, rows in any order and beside any others, threads or not; and the way it
is built: once, kept, and never required (no compiler, the switch off: sdpa, and a line that says why)."""
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from debate.engine import cpu_kernel
from tests.tiny_models import missing


@pytest.fixture(autouse=True)
def built():
    if not cpu_kernel.available()[0]:
        missing(f"the CPU kernel could not be built: {cpu_kernel.available()[1]}")


def by_row(query, key, value, rows, scaling):
    heads, dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
    out = torch.zeros(query.shape[2], heads, dim)
    for slot, place, low, high in rows.tolist():
        want = F.scaled_dot_product_attention(query[:, :, place:place + 1], key[slot:slot + 1, :, low:high],
                                              value[slot:slot + 1, :, low:high], scale=scaling,
                                              enable_gqa=heads > kv_heads)
        out[place] = want[0, :, 0]
    return out


def tensors(heads, kv_heads, dim, slots=5, columns=700, tokens=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(1, tokens, heads, dim, generator=gen).transpose(1, 2)  # transformers' layout
    # the cache as the engine keeps it: a view of a wider place (its columns' stride past the view's width)
    key = torch.randn(slots + 1, kv_heads, columns + 40, dim, generator=gen)[1:, :, :columns]
    value = torch.randn(slots + 1, kv_heads, columns + 40, dim, generator=gen)[1:, :, :columns] * 3
    return query, key, value


@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 4, 32), (4, 1, 256), (32, 8, 128), (4, 4, 64)])
def test_each_row_reads_its_own_columns_as_sdpa_does(heads, kv_heads, dim):
    query, key, value = tensors(heads, kv_heads, dim)
    check(query, key, value, 1e-5)


@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 4, 32), (4, 1, 256)])
def test_in_bfloat16_it_widens_what_it_reads_and_rounds_what_it_writes(heads, kv_heads, dim):
    """A bf16 run's tensors: float32's arithmetic over the same (bf16) numbers, rounded once at the end to nearest
    even, as torch rounds: sdpa's float32 result over the widened inputs, rounded, but for the rare number whose two
    float32 results fall either side of a rounding boundary (one bf16 step apart, 2^-7 relative at most)."""
    query, key, value = (t.bfloat16() for t in tensors(heads, kv_heads, dim))
    out = check(query, key, value, 2 ** -7)
    rows = torch.tensor(ROWS)
    want = by_row(query.float(), key.float(), value.float(), rows, 0.3)[rows[:, 1]].bfloat16()
    same = (out[rows[:, 1]] == want).float().mean().item()
    assert same > 0.98, f"only {same:.1%} rounded as torch rounds"


# rows out of order, two in one slot (a row not live reads column 0 alone), a sliding window's low column
ROWS = [[3, 0, 0, 700], [0, 5, 0, 1], [1, 2, 0, 37], [4, 7, 650, 700], [2, 3, 100, 555], [0, 8, 0, 16]]


def check(query, key, value, tolerance):
    heads, dim = query.shape[1], query.shape[3]
    rows = torch.tensor(ROWS, dtype=torch.int64)
    out = torch.full((9, heads, dim), float("nan"), dtype=query.dtype)
    cpu_kernel.decode_rows(query, key, value, out, rows, 0.3, 700)
    want = by_row(query.float(), key.float(), value.float(), rows, 0.3)
    places = rows[:, 1]
    got = out[places].float()
    assert torch.allclose(got, want[places], rtol=tolerance, atol=tolerance), (got - want[places]).abs().max()
    # places with no row are left as they were: the kernel writes its rows' places alone
    untouched = [p for p in range(9) if p not in places.tolist()]
    assert torch.isnan(out[untouched]).all()
    return out


def test_a_rows_result_is_the_same_beside_any_rows_and_under_any_threads():
    query, key, value = tensors(8, 4, 32, seed=1)
    alone = torch.zeros(9, 8, 32)
    cpu_kernel.decode_rows(query, key, value, alone, torch.tensor([[2, 4, 0, 611]]), 0.2, 611)
    rows = torch.tensor([[0, 0, 0, 700], [2, 4, 0, 611], [3, 1, 5, 9]])
    threads = torch.get_num_threads()
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            beside = torch.zeros(9, 8, 32)
            cpu_kernel.decode_rows(query, key, value, beside, rows, 0.2, 700)
            assert torch.equal(beside[4], alone[4])  # bit for bit: the same records at any batch size
    finally:
        torch.set_num_threads(threads)


def test_rows_it_cannot_read_are_refused_in_one_line():
    query, key, value = tensors(8, 4, 32)
    out = torch.zeros(9, 8, 32)
    with pytest.raises(ValueError, match="wider than 100"):
        cpu_kernel.decode_rows(query, key, value, out, torch.tensor([[0, 0, 0, 101]]), 0.2, 100)
    with pytest.raises(ValueError, match="empty columns"):
        cpu_kernel.decode_rows(query, key, value, out, torch.tensor([[0, 0, 5, 5]]), 0.2, 100)


def test_what_it_takes():
    query, key, value = tensors(8, 4, 32)
    assert cpu_kernel.usable(query, key, value)
    assert cpu_kernel.usable(query.bfloat16(), key.bfloat16(), value.bfloat16())
    assert not cpu_kernel.usable(query.half(), key.half(), value.half())
    assert not cpu_kernel.usable(query, key.bfloat16(), value.bfloat16())
    assert not cpu_kernel.usable(query, key.transpose(2, 3), value)  # a head's vector not contiguous


def run_fresh(code, **env):
    """`code` in a new process (the kernel's state is the process's), with `env` over this one's."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_it_is_built_once_and_kept(tmp_path):
    code = ("from debate.engine import cpu_kernel, attention; import time; t = time.perf_counter(); "
            "print(cpu_kernel.available()[0], round(time.perf_counter() - t, 3))")
    first = run_fresh(code, DEBATECV_CACHE=str(tmp_path)).split()
    built = list((tmp_path / "kernels").iterdir())
    assert first[0] == "True" and len(built) == 1 and built[0].suffix == ".so"
    stamp = built[0].stat().st_mtime_ns
    again = run_fresh(code, DEBATECV_CACHE=str(tmp_path)).split()
    assert again[0] == "True" and built[0].stat().st_mtime_ns == stamp  # loaded, not built again
    assert list((tmp_path / "kernels").iterdir()) == built  # no temporary left behind


def test_without_a_compiler_or_switched_off_the_rows_go_to_sdpa(tmp_path):
    code = "from debate.engine import cpu_kernel; print(*cpu_kernel.available(), sep='|')"
    none = run_fresh(code, DEBATECV_CACHE=str(tmp_path), PATH=str(tmp_path), CC="")
    assert none == "False|no C compiler (cc, gcc or clang) on the PATH"
    off = run_fresh(code, DEBATECV_CACHE=str(tmp_path), DEBATECV_CPU_KERNEL="0")
    assert off == f"False|{cpu_kernel.SWITCH}=0"
    assert not (tmp_path / "kernels").exists()  # nothing built in either case
