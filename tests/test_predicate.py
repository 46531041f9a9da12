"""The row-at-a-time predicate (ab_allowed_bits, the partial tiles of fast-tc) against the
pattern's own definition, bit for bit: a wrong key in one row would hide under the gate's norm."""
import numpy as np
import pytest

from attnbench.compile import compile_only
from attnbench.patterns import examples, make_mask

T = 320
CASES = list(examples(T))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_predicate_kernel_compiles(arch):
    defines = make_mask("streaming", T).device_defines(runtime=True)
    assert [r.kernel for r in compile_only("predicate", defines, arch)] == ["predicate_bits"]


def check_bits(mask, truth=None):
    """The device predicate of ``mask`` (both forms) against ``truth`` (its numpy mask by default),
    bit for bit, on a GPU."""
    import cupy

    from attnbench.compile import get_module

    T, causal = mask.T, mask.causal
    nw = -(-T // 16) + 1  # one word starting at or past T
    fast = cupy.zeros((T, nw), dtype=cupy.uint32)
    ref = cupy.zeros((T, nw), dtype=cupy.uint32)
    table = cupy.asarray(mask.table if mask.table is not None else np.zeros(1, np.int32), dtype=cupy.int32)
    kern = get_module("predicate", mask.device_defines(runtime=True)).get_function("predicate_bits")
    pargs = cupy.asarray(mask.device_args())
    kern((T,), (64,), (np.int32(causal), pargs, table, np.int32(T), np.int32(nw), fast, ref))
    fast, ref = fast.get(), ref.get()
    # the truth: the pattern's numpy mask, packed the same way
    dense = np.zeros((T, 16 * nw + 32), dtype=bool)
    dense[:, :T] = mask.dense() if truth is None else truth
    bits = np.zeros((T, nw), dtype=np.uint64)
    for b in range(32):
        bits |= dense[:, 16 * np.arange(nw) + b].astype(np.uint64) << np.uint64(b)
    assert (ref == bits).all()
    in_seq = np.array([sum(1 << b for b in range(32) if 16 * w + b < T) for w in range(nw)], dtype=np.uint64)
    assert (fast & in_seq == bits).all()
    if causal:  # keys past the row, hence past T, are never set
        assert (fast == bits).all()


@pytest.mark.gpu
@pytest.mark.parametrize("pattern,causal,params", CASES, ids=[f"{c[0]}-{'c' if c[1] else 'nc'}-{i}" for i, c in enumerate(CASES)])
def test_bits_match_the_pattern(pattern, causal, params):
    check_bits(make_mask(pattern, T, causal, **params))
