"""The custom expression's bits form (attnbench/patterns/expr_bits.py): the 32-key word of a row
from key intervals, against the expression evaluated pair by pair, in the numpy emulation of what
the device computes (every bit of every word of every row, j0 at every offset, keys up to T + 63)."""
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attnbench.errors import BadInput
from attnbench.patterns.custom import Custom
from attnbench.patterns.expr import bind
from attnbench.patterns.expr_bits import LIM32, REF_T, atoms

from test_custom import BUILTINS
from test_expr import EXPRS, P


def words_of(b, T, rows=None, starts=None):
    """(the bits form's words, the expression's bits) over rows x word starts, [rows, starts, 32]."""
    i = np.arange(T) if rows is None else np.asarray(rows)
    j0 = np.arange(T + 33) if starts is None else np.asarray(starts)  # every offset, the last words past T
    got = b.bits(i[:, None], j0[None, :])
    bits = (got[..., None].astype(np.uint64) >> np.arange(32, dtype=np.uint64)) & 1
    want = b.allowed(i[:, None, None], j0[None, :, None] + np.arange(32)[None, None, :])
    return bits.astype(bool), np.broadcast_to(want, bits.shape)


def check(text, T, params=()):
    b = bind(text, T, tuple(params))
    got, want = words_of(b, T)
    bad = np.argwhere(got != want)
    assert not bad.size, f"{text} at T={T}: row {bad[0][0]}, j0 {bad[0][1]}, bit {bad[0][2]} ({b.c_bits})"
    return b


def kinds(text, T=1000, params=()):
    return [(a.kind, a.narrow) for a in atoms(bind(text, T, tuple(params)).words)]


# expressions beyond the examples: negatives, floor division of negatives, keys near T, rows that
# allow every key or none, abs / min / max of j, operators of every kind, divisors below and above 32
MORE = [
    ("j < 16", ()), ("i - j < 64", ()), ("j - i < W", (("W", 5),)), ("j >= max(T - 8, 0)", ()),
    ("j < min(P, T)", (("P", 3),)), ("abs(i - j) < W", (("W", 7),)), ("i // 128 == j // 128", ()),
    ("(i - j < W) | (j < S) | (j % 512 == 0)", (("S", 4), ("W", 1024))),
    ("(j < 16) | (i - j < 64)", ()), ("i - j < 256", ()),
    ("(j - i) // 5 >= -1", ()), ("(i - j + 3) // 7 != i // 7 - 2", ()), ("-j // 3 < -(i // 3)", ()),
    ("(j - 2 * i) // 4 == 0", ()), ("i // 3 == j // 5", ()), ("(j + 7) // 64 > i // 64", ()),
    ("(i - j) // 100000 == 0", ()), ("(i - j) // 1 < 3", ()), ("(j - 40) // 32 <= (i - 70) // 32", ()),
    ("(i - j) // 33 == 1", ()), ("(i - j) // 31 == -1", ()), ("(j + i) // 16 != 3", ()),
    ("3 - j < i", ()), ("j * -1 > -i", ()), ("-j > -i - 3", ()), ("i + j < T", ()), ("i + j >= T - 1", ()),
    ("j >= T - 8", ()), ("j > T + 40", ()), ("j <= T + 20", ()), ("j == i", ()), ("j != i", ()), ("j == i - 5", ()),
    ("j == 40", ()), ("j != 33", ()), ("abs(j - i) == 3", ()), ("abs(i - j) != 0", ()), ("abs(i - j) >= 30", ()),
    ("max(i, j) < 50", ()), ("min(i, j) >= 10", ()), ("max(j - 5, 2 * i) <= 60", ()),
    ("min(j, 20) == min(i, 20)", ()), ("~(i - j < W) | (j == 0)", (("W", 9),)), ("min(abs(i - j), 40) > 33", ()),
    ("abs(abs(j - 50) - 20) < 5", ()),
    ("j * 2 < i", ()), ("i * j < 100", ()), ("(i - j) % 3 == 0", ()), ("j % 8 == i % 8", ()),
    ("(i != 3) & (j <= i)", ()), ("(i % 2 == 0) | (j == 0)", ()), ("j - j + i > 10", ()), ("i < 0", ()),
    ("1 < 2", ()), ("(T > 5) | (i < j)", ()), ("(1 > 2) | (j < 0)", ()),
    # 64-bit atoms: values beyond 2^29
    ("j + W > W - 5", (("W", 2 ** 40),)), ("(i - j) // K == 0", (("K", 2 ** 40),)), ("i - j < W", (("W", 2 ** 35),)),
    ("j - W < i - W", (("W", 2 ** 45),)), ("(j + W) // 8 == (i + W) // 8", (("W", 2 ** 50),)),
    ("(i - j) * W < W * 3", (("W", 2 ** 30),)), ("abs(j - i) * 1 < W", (("W", 2 ** 40),)),
    ("(j - i) * W // W >= -4", (("W", 2 ** 40),)), ("j + W == i + W", (("W", -2 ** 40),)),
    ("(j - W) // 9 < (i - W) // 9 + 1", (("W", 2 ** 33),)), ("i - j > W", (("W", -2 ** 33),)),
]

EXAMPLES = [(e["expr"], e.get("param", ())) for T in (7, 100) for e in Custom().examples(T)]
ALL = MORE + EXAMPLES + [(t, P) for t, _ in EXPRS] + \
      [(text, tuple((named(100) if callable(named) else named).items())) for _, _, text, named in BUILTINS]


@pytest.mark.parametrize("T", [1, 2, 31, 32, 33, 100, 257])
@pytest.mark.parametrize("text,params", ALL, ids=[f"{n}:{t}" for n, (t, _) in enumerate(ALL)])
def test_the_bits_form_is_the_expression_bit_for_bit(text, params, T):
    check(text, T, params)


def test_every_offset_near_large_T_and_rows_across_it():
    for text, params in MORE + EXAMPLES:
        T = 40000
        b = bind(text, T, tuple(params))
        rows = [0, 1, 31, 127, 128, 129, 20000, T - 65, T - 33, T - 2, T - 1]
        starts = list(range(0, 70)) + list(range(19900, 20100)) + list(range(T - 100, T + 33))
        got, want = words_of(b, T, rows, starts)
        assert (got == want).all(), text


# ---- random expressions ---------------------------------------------------------------------------
LEAVES = st.sampled_from(["i", "j", "i", "j", "T", "W", "S"]) | st.integers(-40, 40).map(str)


def _ints(sub):
    return st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.integers(-3, 3)).map(lambda t: f"({t[0]} * {t[1]})"),
        st.tuples(sub, st.sampled_from(["//", "%"]), st.integers(1, 70)).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["min", "max"]), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        sub.map(lambda a: f"abs({a})"), sub.map(lambda a: f"(-{a})"))


INTS = st.recursive(LEAVES, _ints, max_leaves=5)
CMPS = st.tuples(INTS, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), INTS).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
BOOLS = st.recursive(CMPS, lambda sub: st.one_of(
    st.tuples(sub, st.sampled_from(["&", "|"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    sub.map(lambda a: f"~{a}")), max_leaves=4)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BOOLS, st.integers(1, 90), st.integers(-50, 50), st.integers(-50, 50))
def test_random_expressions(text, T, W, S):
    check_random(text, T, W, S)


def check_random(text, T, W, S):
    try:
        b = bind(text, T, (("S", S), ("W", W)))
    except BadInput:
        assume(False)  # beyond 2^62 somewhere
    got, want = words_of(b, T)
    assert (got == want).all(), f"{text} T={T} W={W} S={S}: {b.c_bits}"


# comparisons that the spans cover, of i-only terms with j once (or j's floor division), either side
IONLY = st.recursive(st.sampled_from(["i", "T", "W", "S"]) | st.integers(-40, 40).map(str), _ints, max_leaves=3)
JLIN = st.tuples(st.sampled_from(["j", "-j", "(0 - j)", "j * 1", "(-1) * j", "(2 * j - j)"]), IONLY) \
    .map(lambda t: f"({t[0]} + {t[1]})")
JDIV = st.tuples(JLIN, st.integers(1, 70)).map(lambda t: f"({t[0]} // {t[1]})")
JTERM = st.one_of(JLIN, JDIV, st.tuples(JDIV, IONLY).map(lambda t: f"({t[1]} - {t[0]})"),
                  JLIN.map(lambda a: f"abs({a})"),
                  st.tuples(st.sampled_from(["min", "max"]), JLIN, IONLY | JLIN).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"))
SPANS = st.tuples(JTERM, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), IONLY, st.booleans()) \
    .map(lambda t: f"({t[0]} {t[1]} {t[2]})" if t[3] else f"({t[2]} {t[1]} {t[0]})")
SPAN_TREES = st.recursive(SPANS, lambda sub: st.one_of(
    st.tuples(sub, st.sampled_from(["&", "|"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    sub.map(lambda a: f"~{a}")), max_leaves=3)
VALUES = st.integers(-50, 50) | st.integers(-2 ** 45, 2 ** 45)  # large ones: 64-bit atoms


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPAN_TREES, st.integers(1, 90), VALUES, VALUES)
def test_random_span_expressions(text, T, W, S):
    check_random(text, T, W, S)


# ---- what the form covers, in which width ------------------------------------------------------------
def test_the_llm_custom_instances_are_spans_in_32_bits():
    from attnbench.configs import LLM

    exprs = [i.param_dict["expr"] for i in LLM.instances if i.pattern == "custom"]
    assert exprs == ["(j < 16) | (i - j < 64)", "i - j < 256", "i // 128 == j // 128"]
    for T in LLM.Ts:
        assert [kinds(e, T) for e in exprs] == [[("lin", True)] * 2, [("lin", True)], [("div", True)]]
    assert bind("(j < 16) | (i - j < 64)", 32768).c_bits == \
        "(ab_cmp_word<AB_LT>(ab_clamp_word((-(ab_j0-16))))|ab_cmp_word<AB_GT>(ab_clamp_word(((ab_i-ab_j0)-64))))"


@pytest.mark.parametrize("text,params,want", [
    ("abs(i - j) < W", (("W", 3),), ["lin", "lin"]),
    ("(j < S) | (abs(i - j) < W)", (("S", 3), ("W", 4)), ["lin", "lin", "lin"]),
    ("(abs(i - j) < W * R) & (abs(i - j) % R == 0)", (("R", 3), ("W", 4)), ["lin", "lin", "each"]),
    ("((i - j) // 4 == 0) | (i // B == j // B) | (j >= max(T - 8, 0)) | (j < min(P, T))",
     (("B", 33), ("P", 3)), ["div", "div", "lin", "lin"]),
    ("min(i // A, 1) == min(j // A, 1)", (("A", 50),), ["div", "rows", "div", "rows"]),
    ("(i != 3) & (j <= i)", (), ["rows", "lin"]),
    ("j % 8 == 0", (), ["each"]),
    ("j * 2 < i", (), ["each"]),
    ("min(i, j) % 3 == max(-j, 1 - T)", (), ["each"]),  # split, it would be four words key by key: one
    ("max(i * j, j) < 9", (), ["each"]),
    ("1 < 2", (), []),
])
def test_atoms_by_kind(text, params, want):
    assert [k for k, _ in kinds(text, 1000, params)] == want


def test_widths_and_one_text_for_every_T():
    assert kinds("j + W > W - 5", params=(("W", 2 ** 40),)) == [("lin", False)]
    assert kinds("j + W > W - 5", params=(("W", LIM32 - REF_T - 100),)) == [("lin", True)]
    assert kinds("(i - j) // K == 0", params=(("K", 2 ** 40),)) == [("div", False)]
    # judged over positions up to REF_T whatever T is: an expression without T gives one text
    texts = {bind("(j < 16) | (i - j < 64) | (j // 7 == i // 3)", T).c_bits for T in (1, 100, 32768, REF_T)}
    assert len(texts) == 1 and "long long" not in texts.pop()
    assert kinds("i * 300 - j < 5", REF_T) == [("lin", False)]  # 300 REF_T > 2^29
    assert kinds("i * 200 - j < 5", REF_T) == [("lin", True)]
