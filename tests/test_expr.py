"""The custom pattern's expression language (attnbench/patterns/expr.py): what it accepts, what it
refuses and where, and its three forms (numpy, C, intervals) against plain Python."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.errors import BadInput
from attnbench.patterns.expr import LIMIT, bind, parse

P = (("B", 7), ("S", 4), ("W", 10))  # the parameters the expressions below may name

# (expression, the same in plain Python over ints) over i, j, T=100 and P
EXPRS = [
    ("i - j < W", lambda i, j: i - j < 10),
    ("(i - j < W) | (j < S) | (j % 512 == 0)", lambda i, j: (i - j < 10) or (j < 4) or (j % 512 == 0)),
    ("i // B == j // B", lambda i, j: i // 7 == j // 7),
    ("(i - j) // 3 == (j - i) % 5 - 2", lambda i, j: (i - j) // 3 == (j - i) % 5 - 2),
    ("((i - j) % B == 0) & (abs(i - j) < W * B)", lambda i, j: ((i - j) % 7 == 0) and (abs(i - j) < 70)),
    ("~(i < j) & ~~(j >= -S)", lambda i, j: not (i < j) and (j >= -4)),
    ("min(i, j) * 2 - max(i, -j) != abs(-i + 3 * j) // 4", lambda i, j: min(i, j) * 2 - max(i, -j) != abs(-i + 3 * j) // 4),
    ("-i - -j <= T - 101 | i * j > T * T // 3 & j > 0", lambda i, j: (-i + j <= -1) or (i * j > 3333 and j > 0)),
    ("i > j | i == j", lambda i, j: i >= j),
    ("(1 < 2) & (j < S)", lambda i, j: j < 4),
    ("(T > 5) | (i < j)", lambda i, j: True),
    ("0 == 1 | j % (W - 3) == i % 7", lambda i, j: j % 7 == i % 7),
]


@pytest.mark.parametrize("text,py", EXPRS, ids=[e for e, _ in EXPRS])
def test_numpy_evaluation_is_plain_python_on_random_pairs(text, py):
    rng = np.random.default_rng(len(text))
    i = rng.integers(-300, 300, 2000)
    j = rng.integers(-300, 300, 2000)
    got = bind(text, 100, P).allowed(i, j)
    assert got.dtype == bool and got.shape == i.shape
    assert got.tolist() == [bool(py(int(a), int(b))) for a, b in zip(i, j)]
    # broadcasting as Mask.dense does, int32 indices widened first
    grid = bind(text, 100, P).allowed(np.arange(-5, 5, dtype=np.int32)[:, None], np.arange(-5, 5)[None, :])
    assert grid.tolist() == [[bool(py(a, b)) for b in range(-5, 5)] for a in range(-5, 5)]


@pytest.mark.parametrize("text,col,words", [
    ("i ^ j", 3, ["unexpected character '^'"]),
    ("i / 2 < 1", 3, ["'/'", "floor division is //"]),
    ("i = j", 3, ["'='", "=="]),
    ("(i < j", 1, ["this '(' is never closed"]),
    ("(i < j))", 8, ["unexpected token ')'"]),
    ("i < j <", 7, ["comparisons do not chain"]),
    ("i < j < 3", 7, ["comparisons do not chain"]),
    ("i + 1", 1, ["'i + 1' is an integer", "must be a boolean"]),
    ("(i < j) + 1 < 3", 1, ["'+' takes integers", "'(i < j)' is a boolean"]),
    ("i | j < 2", 1, ["'|' takes booleans", "'i' is an integer"]),
    ("~i", 2, ["'~' takes booleans"]),
    ("j < X", 5, ["undeclared name 'X'", "--param X=VALUE"]),
    ("i // 0 < 1", 6, ["divisor '0' of '//' is 0", "above 0"]),
    ("i % (W - 10) < 1", 5, ["divisor '(W - 10)' of '%' is 0 (W=10)"]),
    ("i // j < 1", 6, ["divisor of '//' must be constant", "'j'"]),
    ("i % (i + 1) < 1", 5, ["divisor of '%' must be constant"]),
    ("min(i) < 2", 1, ["min() takes 2 arguments, got 1"]),
    ("abs < 2", 1, ["'abs' is a function"]),
    ("foo(i) < 2", 1, ["undeclared name 'foo'"]),
    ("", 1, ["empty"]),
    ("i < ", 5, ["unexpected end"]),
    ("i * i * i * W * W * W * W < 1", 1, ["reaches", "2^62"]),
    ("j < 9999999999999999999", 5, ["reaches", "2^62"]),
])
def test_refused_with_the_column_of_the_offending_token(text, col, words):
    with pytest.raises(BadInput) as e:
        bind(text, 100000, P)
    msg = str(e.value)
    first, shown, caret = msg.split("\n")
    assert first.startswith("expr: ") and first.endswith(f"at column {col}")
    assert shown == f"  {text}" and caret == "  " + " " * (col - 1) + "^"
    for w in words:
        assert w in first


def test_names_are_checked_when_parsed_and_values_when_bound():
    assert parse("i - j < W", ("W",)).typ == "bool"
    with pytest.raises(BadInput, match="undeclared name 'W'"):
        parse("i - j < W")
    with pytest.raises(BadInput, match="divisor 'B' of '//' is -2 .B=-2."):
        bind("i // B < 1", 10, (("B", -2),))
    assert bind("i // B < 1", 10, (("B", 2),)).c == "(ab_floordiv(ab_i,2LL)<1LL)"


def test_overflow_is_judged_at_T_plus_a_margin():
    bind("i * j * j * j < 5", 40000)  # 40064^4 < 2^62
    with pytest.raises(BadInput, match="reaches"):
        bind("i * j * j * j < 5", 50000)
    with pytest.raises(BadInput, match="reaches"):
        bind("j < W * W * W", 10, (("W", 2 ** 21),))  # the folded constant too
    bind("j + W > 0", 10, (("W", LIMIT - 10 ** 6),))


def test_constants_fold_and_the_c_form_is_64_bit():
    assert bind("(1 > 2) | (i < j)", 10).c == "(ab_i<ab_j)"
    assert bind("(T > 5) & (j - i >= -W)", 10, (("W", 3),)).c == "((ab_j-ab_i)>=(-3LL))"
    assert bind("(T > 5) | (i < j)", 10).c == "true" and bind("(T > 5) | (i < j)", 10).constant is True
    b = bind("i - j < 3 * W", 10, (("W", 4),))
    assert b.c == "((ab_i-ab_j)<12LL)" and b.constant is None
    assert bind("min(i, -j) > max(abs(j), 2) % 3", 10).c == "(ab_min64(ab_i,(-ab_j))>ab_floormod(ab_max64(ab_abs64(ab_j),2LL),3LL))"
    full = bind("1 < 2", 10).allowed(np.arange(3)[:, None], np.arange(4)[None, :])
    assert full.shape == (3, 4) and full.all()


@st.composite
def boxes(draw):
    ilo, jlo = draw(st.integers(0, 90)), draw(st.integers(0, 90))
    return ilo, ilo + draw(st.integers(0, 9)), jlo, jlo + draw(st.integers(0, 9))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([e for e, _ in EXPRS]), boxes())
def test_intervals_never_decide_wrongly(text, box):
    """may-be-true False: no pair of the box holds; may-be-false False: every pair holds."""
    b = bind(text, 100, P)
    ilo, ihi, jlo, jhi = box
    t, f = b.boxes(np.array([ilo]), np.array([ihi]), np.array([jlo]), np.array([jhi]))
    vals = b.allowed(np.arange(ilo, ihi + 1)[:, None], np.arange(jlo, jhi + 1)[None, :])
    if not t[0]:
        assert not vals.any()
    if not f[0]:
        assert vals.all()


def test_intervals_decide_what_they_should():
    b = bind("(i - j < 64) | (j < 16)", 4096)
    # rows 1000..1063 against the sinks (all hold), across the window's edge, far behind it (none hold)
    t, f = b.boxes(np.full(3, 1000), np.full(3, 1063), np.array([0, 930, 512]), np.array([15, 993, 575]))
    assert t.tolist() == [True, True, False] and f.tolist() == [False, True, True]
    t, f = bind("i // 128 == j // 128", 4096).boxes(np.array([128]), np.array([191]), np.array([192]), np.array([255]))
    assert (t[0], f[0]) == (True, False)
