"""Every pattern against its own mask: causality, coverage, pair counts, key bounds, strides."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.patterns import PATTERNS, BadInput, make_mask


@st.composite
def masks(draw, max_T=160):
    name = draw(st.sampled_from(sorted(PATTERNS)))
    causal = draw(st.booleans())
    if name in ("block_diagonal", "bigbird"):
        block = draw(st.integers(1, 12))
        T = block * draw(st.integers(1, max_T // block))
        ps = {"block": block}
        if name == "bigbird":
            ps.update(window_blocks=draw(st.integers(1, 5)), global_blocks=draw(st.integers(0, 2)),
                      random_blocks=draw(st.integers(0, min(3, T // block))), seed=draw(st.integers(0, 99)))
        return make_mask(name, T, causal, **ps)
    T = draw(st.integers(1, max_T))
    ps = {}
    if name in ("window", "streaming", "dilated"):
        ps["window"] = draw(st.integers(1, 40))
    if name == "streaming":
        ps["sink"] = draw(st.integers(0, min(T, 20)))
    if name == "dilated":
        ps["dilation"] = draw(st.integers(1, 5))
    if name == "prefix_lm":
        ps["prefix"] = draw(st.integers(0, T + 3))
    if name not in ("dense", "window", "streaming", "dilated", "prefix_lm"):  # a pattern this strategy does not know
        ps = draw(st.sampled_from(PATTERNS[name].examples(T)))
    return make_mask(name, T, causal, **ps)


@settings(max_examples=150, deadline=None)
@given(masks())
def test_mask_properties(m):
    d = m.dense()
    i = np.arange(m.T)
    if m.causal:
        assert not np.triu(d, 1).any(), "a causal pattern looked ahead"
    assert d.any(axis=1).all(), "a row has no key"
    assert (d.sum(axis=1) == m.row_counts()).all()
    assert m.pairs == int(d.sum())
    assert m.max_keys == int(d.sum(axis=1).max())
    # the mask of a block of rows equals those rows of the whole mask
    rows = i[m.T // 3: m.T // 3 + 5]
    assert (m.dense(rows) == d[rows]).all()


@settings(max_examples=120, deadline=None)
@given(masks())
def test_strided_view_is_the_mask(m):
    """Each residue class of a strided pattern, as a sequence of its own, is the inner mask cut
    to the class's length; no pair crosses classes."""
    r, inner = m.strided()
    d = m.dense()
    if r == 1:
        assert inner is m
        return
    assert inner.T == -(-m.T // r) and inner.causal == m.causal
    i = np.arange(m.T)
    assert not (d & ((i[:, None] % r) != (i[None, :] % r))).any(), "a pair crosses residue classes"
    inner_d = inner.dense()
    for c in range(min(r, m.T)):
        pos = i[c::r]
        n = pos.size
        assert n == -(-(m.T - c) // r)
        assert (d[np.ix_(pos, pos)] == inner_d[:n, :n]).all()


def test_only_dilated_is_strided():
    assert make_mask("dilated", 1000, True, window=512, dilation=3).strided()[0] == 3
    assert make_mask("dilated", 1000, True, window=512, dilation=1).strided()[0] == 1
    for name in ("dense", "window", "streaming", "block_diagonal", "bigbird"):
        assert make_mask(name, 1024, True).strided()[0] == 1


def test_device_defines_name_the_struct_and_its_fields_in_order():
    m = make_mask("streaming", 128, True, sink=4, window=8)
    assert m.device_defines() == {"AB_PATTERN_T": "ab_streaming", "AB_PATTERN_ARGS": "1,4,8"}
    assert m.device_defines(runtime=True)["AB_PATTERN_ARGS"] == "causal,pargs[0],pargs[1]"
    assert m.device_args().tolist() == [4, 8]
    m = make_mask("dilated", 128, False, window=8, dilation=3)
    assert m.device_defines()["AB_PATTERN_ARGS"] == "0,8,3"
    m = make_mask("bigbird", 128, True, block=16)  # the seed made the table, which comes last
    assert m.device_defines()["AB_PATTERN_ARGS"] == "1,16,3,1,3,table"
    assert make_mask("dense", 8, False).device_args().tolist() == [0]  # never an empty array


@pytest.mark.parametrize("T", [1, 7, 100, 4096])
def test_every_pattern_gives_examples_valid_at_T(T):
    for name, pat in PATTERNS.items():
        ex = pat.examples(T)
        assert ex, f"{name} gives no example at T={T}"
        for ps in ex:
            make_mask(name, T, pat.default_causal, **ps)


def test_prefix_lm_attends_both_ways_inside_the_prefix_and_causally_after():
    d = make_mask("prefix_lm", 8, False, prefix=3).dense()
    assert d[0].tolist() == [1, 1, 1, 0, 0, 0, 0, 0]
    assert d[5].tolist() == [1, 1, 1, 1, 1, 1, 0, 0]
    assert (make_mask("prefix_lm", 8, True, prefix=3).dense() == np.tril(np.ones((8, 8), bool))).all()


def test_bigbird_table_is_seeded_and_distinct():
    a = make_mask("bigbird", 1024, True, block=64, seed=7).table
    b = make_mask("bigbird", 1024, True, block=64, seed=7).table
    c = make_mask("bigbird", 1024, True, block=64, seed=8).table
    assert (a == b).all() and not (a == c).all()
    assert all(len(set(row)) == 3 for row in a.tolist())


@pytest.mark.parametrize("name, T, params, words", [
    ("block_diagonal", 100, {"block": 16}, ["T=100", "block=16"]),
    ("bigbird", 1000, {}, ["T=1000", "block=64"]),
    ("window", 64, {"window": 0}, ["window=0", "minimum 1"]),
    ("streaming", 32, {"sink": 40}, ["sink=40", "T=32"]),
    ("dilated", 64, {"dilation": 0}, ["dilation=0", "minimum 1"]),
    ("window", 64, {"sink": 3}, ["sink"]),
    ("nope", 64, {}, ["pattern='nope'", "dense"]),
    ("dense", 0, {}, ["T=0"]),
])
def test_bad_sizes_are_refused_with_the_parameter_and_the_limit(name, T, params, words):
    with pytest.raises(BadInput) as e:
        make_mask(name, T, True, **params)
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("scale", [0.0, -0.125, float("nan"), float("inf"), "0.1"])
def test_a_scale_that_is_not_positive_and_finite_is_refused(scale):
    from attnbench.impls import Problem

    with pytest.raises(BadInput, match="scale="):
        Problem(make_mask("window", 64, True), 1, 1, 64, "bfloat16", scale)
    assert Problem(make_mask("window", 64, True), 1, 1, 64, "bfloat16", 0.5).softmax_scale == 0.5


def test_document_lengths_drawn_sum_to_T_around_their_mean():
    m = make_mask("document", 1 << 20, True, doc_mean=2048, doc_seed=3)
    starts = np.unique(m.table[:, 0])
    lens = np.diff(np.append(starts, m.T))
    assert lens.sum() == m.T and lens.min() >= 1
    assert 0.7 * 2048 < lens[:-1].mean() < 1.3 * 2048  # the last one is cut at T
    again = make_mask("document", 1 << 20, True, doc_mean=2048, doc_seed=3)
    assert (again.table == m.table).all()


def test_document_attends_inside_its_own_document_only():
    d = make_mask("document", 6, False, doc_lens=(1, 2, 3)).dense().astype(int)
    assert d.tolist() == [[1, 0, 0, 0, 0, 0], [0, 1, 1, 0, 0, 0], [0, 1, 1, 0, 0, 0],
                          [0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 1]]
    w = make_mask("document", 6, True, doc_lens=(1, 5), window=2).dense().astype(int)
    assert w[5].tolist() == [0, 0, 0, 0, 1, 1] and w[1].tolist() == [0, 1, 0, 0, 0, 0]


@pytest.mark.parametrize("params, words", [
    ({"doc_lens": (3, 4)}, ["doc_lens sum to 7, not T=8"]),
    ({"doc_lens": (8, 0)}, ["doc_lens holds 0, below its minimum 1"]),
    ({"doc_lens": "4,x"}, ["doc_lens='4,x' must be integers separated by commas"]),
    ({"doc_mean": 0}, ["doc_mean=0 is below its minimum 1"]),
])
def test_document_bad_lengths_are_refused_by_name(params, words):
    with pytest.raises(BadInput) as e:
        make_mask("document", 8, True, **params)
    for w in words:
        assert w in str(e.value)


def test_document_labels_stand_a_count_for_a_long_list():
    assert make_mask("document", 10, True, doc_lens=(3, 7)).label() == "document(docs=2)"
    assert make_mask("document", 4096, True, doc_mean=512, window=64).label() == "document(doc_mean=512,window=64)"


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 200), st.booleans(),
       st.lists(st.tuples(st.integers(1, 30), st.integers(1, 7)), min_size=1, max_size=5))
def test_multi_scale_dilation_is_the_union_of_its_levels(T, causal, levels):
    (W, r), extra = levels[0], tuple(levels[1:])
    m = make_mask("dilated", T, causal, window=W, dilation=r, levels=extra)
    d = m.dense()
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    want = np.zeros((T, T), bool)
    for w, s in levels:
        want |= (np.abs(i - j) < w * s) & (np.abs(i - j) % s == 0)
    if causal:
        want &= j <= i
    assert (d == want).all()
    assert (d.sum(axis=1) == m.row_counts()).all()  # inclusion-exclusion over the levels
    assert m.strided()[0] == (r if set(levels) == {(W, r)} else 1)  # one level (repeats dropped) only


@pytest.mark.parametrize("levels, words", [
    ("4096:x", ["levels='4096:x' must be pairs a:b"]),
    ("0:2", ["levels holds 0, below its minimum 1"]),
    (",".join(["4:1"] * 9), ["levels holds 9 levels, above the 8"]),
    ("4:1:2", ["must be a list of integer pairs"]),
])
def test_bad_levels_are_refused_by_name(levels, words):
    with pytest.raises(BadInput) as e:
        make_mask("dilated", 64, True, levels=levels)
    for w in words:
        assert w in str(e.value)


def test_levels_label_and_device_args():
    m = make_mask("dilated", 4096, True, window=2048, dilation=1, levels="4096:2,8192:4")
    assert m.label() == "dilated(levels=2048:1+4096:2+8192:4)"
    assert m.device_args().tolist() == [2048, 1, 2, 4096, 2, 8192, 4]
    assert make_mask("dilated", 4096, True).device_args().tolist() == [64, 2]  # one level: as before
