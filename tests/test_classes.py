"""The class-major layout (attnbench/classes.py, the pattern class_bands, fast-tc-classes): its mask is
the pattern's own with positions taken class by class, its lists visit fewer and fuller tiles, and
on a GPU the runner passes the gate in every pass."""
import numpy as np
import pytest

from attnbench.classes import prefers
from attnbench.fast_tc import CLASSES_IMPL, IMPL, SYNC_IMPL
from attnbench.impls import Problem
from attnbench.patterns import BadInput, make_mask
from attnbench.patterns.class_bands import bands_of
from attnbench.tiles import build

LEVELS = {"window": 2048, "dilation": 1, "levels": ((2048, 2), (2048, 4))}  # the llm configuration's
SMALL = {"window": 8, "dilation": 1, "levels": ((6, 2), (4, 4))}           # dilated's own example
ODD = {"window": 5, "dilation": 2, "levels": ((3, 4),)}                     # no level of dilation 1
WIDE = {"window": 256, "dilation": 1, "levels": ((256, 2), (256, 4))}       # fast-tc's layout from T=2048


def _perm(T, r):
    """Original position of each position of the layout: c * n + a stands for a * r + c."""
    n = T // r
    p = np.arange(T)
    return (p % n) * r + p // n


@pytest.mark.parametrize("params", [LEVELS, SMALL, ODD], ids=["llm", "small", "odd"])
@pytest.mark.parametrize("T", [4, 60, 256, 1000])
@pytest.mark.parametrize("causal", [True, False], ids=["c", "nc"])
def test_the_banded_mask_is_the_pattern_taken_class_by_class(params, T, causal):
    mask = make_mask("dilated", T, causal, **params)
    r, banded = mask.class_major()
    assert r == 4 and banded.T == T and not banded.causal
    perm = _perm(T, r)
    want = mask.dense()[np.ix_(perm, perm)]
    got = banded.dense()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(banded.row_counts(), want.sum(axis=1))
    assert banded.pairs == mask.pairs
    # every family exact: the intervals cover the live keys and nothing else
    lo, hi, exact = banded.intervals(np.arange(T))
    assert exact.all()
    cover = np.zeros((T, T), bool)
    for f in range(lo.shape[0]):
        for i in range(T):
            cover[i, lo[f, i]:hi[f, i]] = True
    np.testing.assert_array_equal(cover, want)


@pytest.mark.parametrize("params", [LEVELS, SMALL, ODD], ids=["llm", "small", "odd"])
@pytest.mark.parametrize("T", [4, 60, 100, 1000, 4096])
@pytest.mark.parametrize("tile", [(64, 64), (128, 64), (64, 32), (16, 16)], ids=str)
def test_the_banded_lists_visit_exactly_the_tiles_with_pairs(params, T, tile):
    """Classes of n = T / 4 positions that share a query tile (n no multiple of BM) keep their hulls
    apart: every live pair in a visited tile, every full tile full, no tile visited without a pair."""
    from test_tiles import _visited

    BM, BN = tile
    _, banded = make_mask("dilated", T, True, **params).class_major()
    nq, nk = -(-T // BM), -(-T // BN)
    vis = _visited(build(banded, BM, BN, fresh=True), nq, nk)
    pad = np.zeros((nq * BM, nk * BN), dtype=bool)
    pad[:T, :T] = banded.dense()
    blocks = pad.reshape(nq, BM, nk, BN)
    has = blocks.any(axis=(1, 3))
    assert not (has & (vis == 0)).any(), "an allowed pair lies in a skipped tile"
    assert not ((vis > 0) & ~has).any(), "a visited tile has no allowed pair"
    real = np.zeros_like(pad)  # rows past T count as live: a last query tile may be full over its rows
    real[T:] = True
    full = (pad | real).reshape(blocks.shape).all(axis=(1, 3))
    assert not ((vis == 2) & ~full).any(), "a full tile holds a masked pair"


def test_patterns_without_bands_keep_their_order():
    for mask in (make_mask("dense", 64), make_mask("window", 64, window=8),
                 make_mask("dilated", 64, window=8, dilation=2),  # one level: strided instead
                 make_mask("dilated", 66, **SMALL)):              # T no multiple of the 4 classes
        r, same = mask.class_major()
        assert r == 1 and same is mask
        prob = Problem(mask, 1, 1, 64, "bfloat16")
        assert "has no class-major layout" in CLASSES_IMPL.unsupported(prob)
    assert CLASSES_IMPL.unsupported(Problem(make_mask("dilated", 64, **SMALL), 1, 1, 64, "bfloat16")) is None


def test_a_class_pair_that_is_no_band_is_refused():
    # distances 0 and 8 but not 4: class pair (0, 0) holds a - b = 0 and 2, not 1
    with pytest.raises(BadInput, match=r"class pair \(0, 0\) of classes=4 is no band"):
        bands_of(lambda d: (d == 0) | (d == 8), 4, True, 8)


def test_the_layout_visits_fewer_and_fuller_tiles():
    """At T=32768 the three-level dilation's 64 x 64 list visits 1.93 times its live pairs in order
    and 1.06 class by class, with 73% of its tiles partial against 12%."""
    mask = make_mask("dilated", 32768, True, **LEVELS)
    _, banded = mask.class_major()
    before, after = build(mask, 64, 64), build(banded, 64, 64)
    visited = [t.n_visited * 64 * 64 / mask.pairs for t in (before, after)]
    assert visited[0] > 1.9 and visited[1] < 1.07
    partial = [int((t.entries & 1).sum()) / t.n_visited for t in (before, after)]
    assert partial[0] > 0.7 and partial[1] < 0.13


@pytest.mark.parametrize("params,T,takes", [
    (LEVELS, 4096, False),   # 1.07x fewer tiles: not worth the copies
    (LEVELS, 8192, True),    # 1.43x
    (LEVELS, 32768, True),   # 1.81x
    (LEVELS, 9001, False),   # T no multiple of the 4 classes: no layout
    (SMALL, 4096, False),    # narrow bands: the layout would visit 3.8x the tiles
    (WIDE, 1024, False),
    (WIDE, 2048, True),
], ids=lambda x: str(x) if not isinstance(x, dict) else f"W{x['window']}")
def test_fast_tc_takes_the_layout_where_its_lists_visit_fewer_tiles(params, T, takes):
    mask = make_mask("dilated", T, True, **params)
    assert prefers(mask) is takes
    assert IMPL.takes_classes(mask) is takes
    assert SYNC_IMPL.takes_classes(mask) is False  # its mma.sync main loop keeps positions
    if mask.class_major()[0] > 1:
        assert CLASSES_IMPL.takes_classes(mask) is True
    plain = make_mask("window", T, True, window=256)
    assert not IMPL.takes_classes(plain)


@pytest.mark.parametrize("T,reads", [(32768, True), (4096, True), (512, True), (1000, False), (2000, False),
                                     (256, False)])
def test_the_layout_is_read_in_place_where_its_classes_hold_whole_tiles(T, reads):
    """128 positions a class or a multiple of them (T a multiple of 512 at r = 4): the kernels take the layout where
    it lies, their rows by LAYOUT_R and LAYOUT_N; elsewhere none, and the runner copies."""
    _, banded = make_mask("dilated", T, True, **LEVELS).class_major()
    placed = banded.in_place()
    assert (placed is not None) == reads
    assert banded.rows_in_place() == 1 and "LAYOUT_R" not in banded.device_defines()
    if reads:
        assert placed.rows_in_place() == 4
        d = placed.device_defines()
        assert (d["LAYOUT_R"], d["LAYOUT_N"]) == (4, T // 4)
        # the same pairs: only where the rows lie changes
        if T <= 4096:
            np.testing.assert_array_equal(placed.dense(), banded.dense())
        assert build(placed, 64, 64).n_visited == build(banded, 64, 64).n_visited


def test_in_place_is_refused_where_a_class_holds_no_whole_tiles():
    from attnbench.patterns.class_bands import ClassBands

    _, banded = make_mask("dilated", 1000, True, **LEVELS).class_major()
    with pytest.raises(BadInput, match="in_place=1 needs length=250"):
        ClassBands().validate(1000, dict(banded.params, in_place=1))
    with pytest.raises(BadInput, match="in_place=2 must be 0 or 1"):
        ClassBands().validate(1000, dict(banded.params, in_place=2))
    assert make_mask("dilated", 4096, True).in_place() is None  # not a class_bands mask


def test_the_label_of_a_mask_outside_the_registry():
    _, banded = make_mask("dilated", 16, True, **SMALL).class_major()
    assert banded.label().startswith("class_bands(classes=4,length=4,bands=")


# ---- on a GPU ------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("inverse", [False, True], ids=["into", "back"])
@pytest.mark.parametrize("D", [64, 128])
def test_the_copy_is_the_permutation(inverse, D):
    import cupy

    from attnbench.classes import copy_launch

    B, H, T, r = 2, 3, 1000, 4
    src = cupy.asarray(np.random.default_rng(1).integers(0, 1 << 16, (B, H, T, D)), dtype=cupy.uint16)
    dst = cupy.full_like(src, 0x7FC0)
    copy_launch(src, dst, r, inverse)()
    perm = _perm(T, r)
    want = cupy.asnumpy(src)[:, :, np.argsort(perm) if inverse else perm]
    np.testing.assert_array_equal(cupy.asnumpy(dst), want)


def _gate_cases():
    for n, (params, T) in enumerate(((SMALL, 4), (SMALL, 100), (ODD, 1000), (LEVELS, 1000), (LEVELS, 4096))):
        for pass_name in ("fwd", "bwd", "fwd+bwd"):
            D = (64, 128)[n % 2]
            dtype = ("bfloat16", "float16")[(n // 2) % 2]
            causal = pass_name != "bwd" or n % 2 == 0
            yield pytest.param(params, T, pass_name, D, dtype, causal,
                               id=f"T{T}-{pass_name}-D{D}-{dtype}-{'c' if causal else 'nc'}")


@pytest.mark.gpu
@pytest.mark.parametrize("params,T,pass_name,D,dtype,causal", list(_gate_cases()))
def test_gate(params, T, pass_name, D, dtype, causal):
    from attnbench.check import gate

    prob = Problem(make_mask("dilated", T, causal, **params), 2, 3, D, dtype, pass_name=pass_name)
    res = gate(CLASSES_IMPL, prob)
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("params,T", [(SMALL, 320), (LEVELS, 320), (ODD, 4096)], ids=["small", "llm", "odd"])
@pytest.mark.parametrize("causal", [True, False], ids=["c", "nc"])
def test_the_device_predicate_is_the_band(params, T, causal):
    """Bit for bit against the numpy mask (words at every 16 keys: some cross a class, T = 320 holding
    80 positions a class, no multiple of 32)."""
    from test_predicate import check_bits

    _, banded = make_mask("dilated", T, causal, **params).class_major()
    check_bits(banded)


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [True, False], ids=["in_place", "copies"])
@pytest.mark.parametrize("pass_name,D", [("fwd", 64), ("fwd+bwd", 64), ("fwd", 128), ("bwd", 128)])
def test_fast_tc_on_its_own_layout_passes_the_gate(pass_name, D, in_place, monkeypatch):
    """T=2048: 512 positions a class, so the kernels read the layout in place, or (IN_PLACE off) copy it."""
    from attnbench import classes
    from attnbench.arrays import random_inputs
    from attnbench.check import gate

    monkeypatch.setattr(classes, "IN_PLACE", in_place)
    prob = Problem(make_mask("dilated", 2048, True, **WIDE), 1, 3, D, "bfloat16", pass_name=pass_name)
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=4)
    fwd = Problem(prob.mask, 1, 3, D, "bfloat16")  # a backward's runner takes do= as well
    want = "class-major r=4" + (" in place" if in_place else "")
    assert IMPL.prepare(fwd, q, k, v).setup["layout"] == want
    res = gate(IMPL, prob)
    assert res.ok, res


def _in_place_cases():
    for T in (512, 4096):  # 128 and 1024 positions a class
        for n, pass_name in enumerate(("fwd", "bwd", "fwd+bwd")):
            for D in (64, 128):
                dtype = ("bfloat16", "float16")[(n + D // 64) % 2]
                yield pytest.param(T, pass_name, D, dtype, id=f"T{T}-{pass_name}-D{D}-{dtype}")


@pytest.mark.gpu
@pytest.mark.parametrize("T,pass_name,D,dtype", list(_in_place_cases()))
def test_the_layout_read_in_place_passes_the_gate(T, pass_name, D, dtype):
    """fast-tc-classes with no copies (kernels/tc/rows.cuh): the gate on the pattern in its own order, every pass,
    both D and dtypes, the llm configuration's levels; B=2 and three heads, so a row's head and class both move."""
    from attnbench.check import gate

    prob = Problem(make_mask("dilated", T, True, **LEVELS), 2, 3, D, dtype, pass_name=pass_name)
    assert prob.mask.class_major()[1].in_place() is not None
    res = gate(CLASSES_IMPL, prob)
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
def test_fast_tc_on_its_own_layout_with_grouped_heads(D):
    """Prefill with H_kv < H (the llm configuration's --H-kv 4): K and V copied at their own head count."""
    from attnbench.check import gate

    prob = Problem(make_mask("dilated", 2048, True, **WIDE), 1, 4, D, "bfloat16", H_kv=2)
    assert IMPL.takes_classes(prob.mask) and IMPL.unsupported(prob) is None
    res = gate(IMPL, prob)
    assert res.ok, res


@pytest.mark.gpu
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("T", [2048, 2304], ids=["in_place", "permuted"])
def test_attention_with_grad_goes_through_the_layout_and_back(D, T):
    """attnbench.attention on tensors that need a gradient: the layout read in place (T=2048: 512 positions a
    class) or the permutation by torch (T=2304: 576, no whole number of 128-row tiles), the gradients against
    float32 SDPA with the pattern as a boolean mask."""
    torch = pytest.importorskip("torch")
    import attnbench

    mask = make_mask("dilated", T, True, **WIDE)
    assert prefers(mask) and (mask.class_major()[1].in_place() is not None) == (T == 2048)
    gen = torch.Generator(device="cuda").manual_seed(D)
    q, k, v = (torch.randn(1, 2, T, D, device="cuda", generator=gen).bfloat16().requires_grad_()
               for _ in range(3))
    out = attnbench.attention(q, k, v, pattern="dilated", **WIDE)
    do = torch.randn(out.shape, device="cuda", generator=gen).bfloat16()
    out.backward(do)
    ref_in = [t.detach().float().requires_grad_() for t in (q, k, v)]
    allowed = torch.from_numpy(mask.dense()).cuda()
    ref = torch.nn.functional.scaled_dot_product_attention(*ref_in, attn_mask=allowed)
    ref.backward(do.float())
    for name, a, b in zip(("out", "dq", "dk", "dv"), (out, q.grad, k.grad, v.grad), (ref, *(t.grad for t in ref_in))):
        err = float((a.float() - b).norm() / b.norm())
        assert err < 2e-2, (name, err)


@pytest.mark.gpu
def test_the_runner_reports_its_layout():
    from attnbench.arrays import random_inputs

    prob = Problem(make_mask("dilated", 1000, True, **LEVELS), 1, 2, 64, "bfloat16")
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=3)
    runner = CLASSES_IMPL.prepare(prob, q, k, v)
    assert runner.setup["layout"] == "class-major r=4"  # 250 positions a class: copied


@pytest.mark.gpu
def test_the_runner_reports_its_layout_read_in_place():
    from attnbench.arrays import random_inputs

    prob = Problem(make_mask("dilated", 1024, True, **LEVELS), 1, 2, 64, "bfloat16")
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=3)
    assert CLASSES_IMPL.prepare(prob, q, k, v).setup["layout"] == "class-major r=4 in place"


def test_the_maps_of_the_layout_read_in_place_take_one_class_s_rows_a_box(monkeypatch):
    """head_maps with classes r: a 4-d view [B*H][T/r][r][D] of the array as it lies (row a r + c is class c's row
    a), boxes of 64 columns by the tile's rows of one class; with r = 1 the 3-d map of before."""
    from types import SimpleNamespace

    from attnbench import tma

    seen = []
    monkeypatch.setattr(tma, "encode_tiled", lambda *a, **k: seen.append(a) or object())
    arr = SimpleNamespace(shape=(2, 3, 4096, 128), data=SimpleNamespace(ptr=1 << 20))
    tma.head_maps([arr, arr], (64, 128), classes=4)
    tma.head_maps([arr], (64,))
    (p0, dims, strides, box), (_, _, _, box1), (_, dims3, strides3, box3) = seen
    assert p0 == 1 << 20
    assert dims == (128, 4, 1024, 6) and strides == (256, 4 * 256, 4096 * 256) and box == (64, 1, 64, 1)
    assert box1 == (64, 1, 128, 1)
    assert dims3 == (128, 4096, 6) and strides3 == (256, 4096 * 256) and box3 == (64, 64, 1)
