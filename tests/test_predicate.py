"""The row-at-a-time predicate (ab_allowed_bits, the partial tiles of fast-tc) against the
pattern's own definition, bit for bit: a wrong key in one row would hide under the gate's norm."""
import numpy as np
import pytest

from attnbench.compile import compile_only
from attnbench.patterns import make_mask

CASES = [
    ("dense", True, {}), ("dense", False, {}),
    ("window", True, dict(window=64)), ("window", False, dict(window=33)), ("window", True, dict(window=1)),
    ("streaming", True, dict(sink=16, window=64)), ("streaming", False, dict(sink=5, window=20)),
    ("streaming", True, dict(sink=100, window=7)),
    ("block_diagonal", False, dict(block=16)), ("block_diagonal", True, dict(block=20)),
    ("block_diagonal", False, dict(block=1)),
    ("dilated", True, dict(window=8, dilation=3)), ("dilated", False, dict(window=40, dilation=1)),
    ("bigbird", True, dict(block=20, window_blocks=3, global_blocks=1, random_blocks=2)),
    ("bigbird", False, dict(block=8, window_blocks=1, global_blocks=2, random_blocks=3)),
    ("bigbird", True, dict(block=64, window_blocks=3, global_blocks=1, random_blocks=3)),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_predicate_kernel_compiles(arch):
    assert [r.kernel for r in compile_only("predicate", {}, arch)] == ["predicate_bits"]


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,causal,params", CASES, ids=[f"{c[0]}-{'c' if c[1] else 'nc'}-{i}" for i, c in enumerate(CASES)])
def test_bits_match_the_pattern(pattern, causal, params):
    import cupy

    from attnbench.compile import get_module

    T = 320
    mask = make_mask(pattern, T, causal, **params)
    nw = -(-T // 16) + 1  # one word starting at or past T
    fast = cupy.zeros((T, nw), dtype=cupy.uint32)
    ref = cupy.zeros((T, nw), dtype=cupy.uint32)
    table = cupy.asarray(mask.table if mask.table is not None else np.zeros(1, np.int32), dtype=cupy.int32)
    kern = get_module("predicate", {}).get_function("predicate_bits")
    kern((T,), (64,), (*(np.int32(x) for x in mask.device_params()), table, np.int32(T), np.int32(nw), fast, ref))
    fast, ref = fast.get(), ref.get()
    # the truth: the pattern's numpy mask, packed the same way
    dense = np.zeros((T, 16 * nw + 32), dtype=bool)
    dense[:, :T] = mask.dense()
    bits = np.zeros((T, nw), dtype=np.uint64)
    for b in range(32):
        bits |= dense[:, 16 * np.arange(nw) + b].astype(np.uint64) << np.uint64(b)
    assert (ref == bits).all()
    in_seq = np.array([sum(1 << b for b in range(32) if 16 * w + b < T) for w in range(nw)], dtype=np.uint64)
    assert (fast & in_seq == bits).all()
    if causal:  # keys past the row, hence past T, are never set
        assert (fast == bits).all()
