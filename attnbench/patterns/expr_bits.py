"""The bits form of a bound custom expression (``Bound.c_bits``, ``Bound.bits``): for a row ``i`` and
the 32 keys ``j0 .. j0 + 31``, the word whose bit ``b`` is the expression at ``(i, j0 + b)``, as
``ab_custom::bits`` computes it on fast-tc's partial tiles (kernels/patterns/custom.cuh).

Evaluating the whole expression 32 times a word (64-bit arithmetic each time) made a custom
expression 1.5 to 3.4x slower than the built-in pattern it equals (issue 20). The bits form builds
the word as the built-ins do, from key intervals: the expression's ``&``, ``|`` and ``~`` become
AND, OR and NOT of 32-bit words, and each comparison (an *atom*) becomes one word:

* ``rows``: a comparison without ``j`` (or whose ``j`` cancels): every bit or none, decided once.
* ``lin``: a comparison ``A OP B`` with ``A - B == c j + r(i)``, ``c`` +1 or -1 (``j < 16``,
  ``i - j < 64``, ``j - i < W``, ``j >= 32760``): at key ``j0 + b`` the difference is ``c b + e``
  with ``e = A - B`` at ``(i, j0)``, so the word is the bits ``b`` with ``b OP' v`` for
  ``v = -c e`` (``OP'``: ``OP``, mirrored when c is -1): one span (``ab_cmp_word``).
* ``div``: a comparison ``A - B == c Q + r(i)`` with ``Q = (s j + h(i)) // k``, ``c`` and ``s``
  +1 or -1 (a block of keys: ``i // 128 == j // 128``, ``(i - j) // 4 == 0``): ``Q`` moves by at
  most one per ``k`` keys, so the word is the span between the keys where it crosses the bounds
  (``ab_div_word``, from ``e`` and the dividend's residue at ``j0``).
* ``each``: any other comparison (``%`` of ``j``, products of ``j`` with ``i``, ...), evaluated at
  each of the 32 keys (``AB_EACH``): what the whole expression cost before, for this atom only.

A comparison with ``abs``, ``min`` or ``max`` of a ``j`` term as one of its sides is first split
into the comparisons of their arguments (``abs(x) < w`` is ``(x < w) & (-x < w)``; ``==`` and ``!=``
through ``<=`` and ``>=``) when every part then becomes a rows, lin or div atom.

Widths: an atom whose every value (interval arithmetic, ``expr._boxes``, over positions up to
``max(T, REF_T) + MARGIN``) stays below 2^29 in magnitude is computed in 32-bit ``int``; any other in
64-bit, its ``v`` clamped to [-64, 64] (where it falls against 0 .. 31 is all that counts). The
positions bound does not depend on T below REF_T, so an expression without T gives one C text
for every T up to it.

Bits of keys at or past T are the caller's (kernels/common.cuh): they may be set or not; every bit
for ``j0 + b < T + MARGIN`` is the expression's value there (the overflow check of ``bind`` covers
them), which is what the numpy emulation here is tested for.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .expr import MARGIN, Node, _boxes, _c, _evaluator, _vars

LIM32 = 1 << 29   # an atom whose every value stays below this in magnitude computes in int
REF_T = 1 << 21   # widths are judged over positions up to max(T, REF_T) + MARGIN
CLAMP = 64        # a 64-bit atom's v, clamped to [-CLAMP, CLAMP]
SPLIT_MAX = 16    # comparisons that one comparison's abs, min and max may split into, at most
MIRROR = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
OP_NAMES = {"<": "AB_LT", "<=": "AB_LE", ">": "AB_GT", ">=": "AB_GE", "==": "AB_EQ", "!=": "AB_NE"}
ALL = 0xFFFFFFFF


@dataclass(frozen=True, eq=False)
class Atom:
    """One comparison of the expression as a 32-key word."""
    kind: str             # rows, lin, div, each
    cmp: Node             # the comparison (its sides A and B)
    narrow: bool          # computed in 32-bit int (else 64-bit)
    op: str = ""          # lin, div: the comparison of b (lin) or Q (div) with its bound, as OP'
    c: int = 0            # lin, div: the coefficient (+1, -1) of j or of Q in A - B
    q: Node | None = None  # div: Q, the floor division by k of s j + h(i)
    s: int = 0            # div: the coefficient (+1, -1) of j in Q's dividend

    @property
    def k(self) -> int:
        return self.q.args[1].value


# ---- from the tree to words of atoms ------------------------------------------------------------
def _add(a: dict, b: dict, sign: int) -> dict:
    out = dict(a)
    for key, (coef, q) in b.items():
        total = out.get(key, (0, q))[0] + sign * coef
        if total:
            out[key] = (total, q)
        else:
            out.pop(key, None)
    return out


def _linear(node: Node):
    """The j-terms of ``node`` as {key: (coefficient, Q node or None)} with key "j" for j itself
    and the C text of Q for each floor division ``Q = (s j + h(i)) // k``, when ``node`` is a sum
    of such terms (with constant coefficients) and terms of i alone; None otherwise."""
    if "j" not in _vars(node):
        return {}
    k = node.kind
    if k == "j":
        return {"j": (1, None)}
    if k == "neg":
        inner = _linear(node.args[0])
        return None if inner is None else _add({}, inner, -1)
    if k != "arith":
        return None
    a, b = node.args
    if node.op in ("+", "-"):
        la, lb = _linear(a), _linear(b)
        return None if la is None or lb is None else _add(la, lb, 1 if node.op == "+" else -1)
    if node.op == "*":
        for x, y in ((a, b), (b, a)):
            if x.kind == "const":
                ly = _linear(y)
                return None if ly is None else {key: (x.value * coef, q) for key, (coef, q) in ly.items()}
        return None
    if node.op == "//" and b.kind == "const":
        inner = _linear(a)
        if inner is not None and set(inner) == {"j"} and abs(inner["j"][0]) == 1:
            return {_c(node): (1, node)}
    return None


def _cmp(op: str, a: Node, b: Node, at: Node) -> Node:
    return Node("cmp", at.pos, at.end, "bool", op, (a, b))


def _splittable(node: Node) -> bool:
    return node.kind == "call" and "j" in _vars(node)


class _TooMany(Exception):
    pass


def _split(cmp: Node, budget: list):
    """``cmp`` as a word tree of simpler comparisons, abs, min and max of j-terms taken apart
    (_TooMany past ``budget[0]`` comparisons)."""
    op, (a, b) = cmp.op, cmp.args
    if not (_splittable(a) or _splittable(b)):
        budget[0] -= 1
        if budget[0] < 0:
            raise _TooMany
        return ("cmp", cmp)
    if op in ("==", "!="):
        both = ("and", _split(_cmp("<=", a, b, cmp), budget), _split(_cmp(">=", a, b, cmp), budget))
        return both if op == "==" else ("not", both)
    if not _splittable(a):
        return _split(_cmp(MIRROR[op], b, a, cmp), budget)
    if a.op == "abs":
        x = a.args[0]
        parts, larger = (x, Node("neg", x.pos, x.end, "int", "-", (x,))), True   # abs(x) = max(x, -x)
    else:
        parts, larger = a.args, a.op == "max"
    below = op in ("<", "<=")
    # max(p, q) < b: both below; max(p, q) > b: either above; min the other way round
    join = "and" if larger == below else "or"
    return (join, _split(_cmp(op, parts[0], b, cmp), budget), _split(_cmp(op, parts[1], b, cmp), budget))


def _fits32(nodes, hi: int) -> bool:
    box = (np.array([0], dtype=object), np.array([hi], dtype=object),
           np.array([0], dtype=object), np.array([hi], dtype=object))
    seen = []
    for n in nodes:
        _boxes(n, box, seen)
    return all(max(abs(int(np.ravel(lo)[0])), abs(int(np.ravel(up)[0]))) < LIM32 for _, lo, up in seen)


def _atom(cmp: Node, hi: int) -> Atom:
    """The word kind of one comparison."""
    a, b = cmp.args
    narrow = _fits32((a, b), hi)
    la, lb = _linear(a), _linear(b)
    lin = None if la is None or lb is None else _add(la, lb, -1)
    if lin == {}:
        return Atom("rows", cmp, narrow)
    if lin is not None and len(lin) == 1:
        ((key, (c, q)),) = lin.items()
        if abs(c) == 1:
            op = cmp.op if c > 0 else MIRROR[cmp.op]
            if key == "j":
                return Atom("lin", cmp, narrow, op, c)
            return Atom("div", cmp, narrow, op, c, q, _linear(q.args[0])["j"][0])
    return Atom("each", cmp, narrow)


def plan(tree: Node, T: int):
    """The word tree of a bound expression: ("const", value), ("and" | "or", w, w), ("not", w),
    ("atom", Atom)."""
    hi = max(int(T), REF_T) + MARGIN - 1

    def words(w):
        if w[0] == "cmp":
            return ("atom", _atom(w[1], hi))
        return (w[0],) + tuple(words(x) for x in w[1:])

    def walk(n: Node):
        if n.kind == "const":
            return ("const", bool(n.value))
        if n.kind in ("and", "or"):
            return (n.kind, walk(n.args[0]), walk(n.args[1]))
        if n.kind == "not":
            return ("not", walk(n.args[0]))
        try:
            split = words(_split(n, [SPLIT_MAX]))
        except _TooMany:
            return ("atom", _atom(n, hi))
        if any(a.kind == "each" for a in atoms(split)):
            return ("atom", _atom(n, hi))  # one atom evaluated key by key rather than several
        return split
    return walk(tree)


def atoms(w) -> list[Atom]:
    """The atoms of a word tree, left to right."""
    if w[0] == "atom":
        return [w[1]]
    if w[0] == "const":
        return []
    return [a for x in w[1:] for a in atoms(x)]


# ---- the C text (kernels/patterns/custom.cuh defines the helpers) -------------------------------------
def _leaves(narrow: bool, j: str) -> dict:
    if narrow:
        return {"i": "ab_i", "j": j}
    return {"i": "((long long)ab_i)", "j": f"((long long){j})"}


def _c_atom(a: Atom) -> str:
    if a.kind == "each":
        return f"AB_EACH({_c(a.cmp, a.narrow, _leaves(a.narrow, 'ab_j'))})"
    at = _leaves(a.narrow, "ab_j0")
    if a.kind == "rows":
        return f"ab_rows_word({_c(a.cmp, a.narrow, at)})"
    A, B = (_c(x, a.narrow, at) for x in a.cmp.args)
    v = f"(-({A}-{B}))" if a.c > 0 else f"({A}-{B})"
    if a.kind == "lin":
        return f"ab_cmp_word<{OP_NAMES[a.op]}>(ab_clamp_word({v}))"
    x0 = _c(a.q.args[0], a.narrow, at)
    k = _c(a.q.args[1], a.narrow, at)
    mod = "ab_floormod32" if a.narrow else "ab_floormod"
    return f"ab_div_word<{OP_NAMES[a.op]},{a.s}>({v},{mod}({x0},{k}),{k})"


def c_bits(w) -> str:
    """The word tree in C over ``int ab_i, ab_j0``: the unsigned word of the 32 keys from ab_j0."""
    if w[0] == "const":
        return "0xffffffffu" if w[1] else "0u"
    if w[0] == "not":
        return f"(~{c_bits(w[1])})"
    if w[0] in ("and", "or"):
        return f"({c_bits(w[1])}{'&' if w[0] == 'and' else '|'}{c_bits(w[2])})"
    return _c_atom(w[1])


# ---- the same in numpy: what the device computes, for the tests ---------------------------------------
def _span_from(lo, dt):
    """ab_span_from: bits >= lo (PTX shl by 32 or more gives 0)."""
    n = np.maximum(lo, dt(0)).astype(np.int64)
    return np.where(n >= 32, 0, (ALL << np.minimum(n, 31).astype(np.uint64)) & ALL).astype(np.uint64)


def _span_to(hi, dt):
    """ab_span_to: bits <= hi (31 - min(hi, 31) computed in the atom's width)."""
    n = (dt(31) - np.minimum(hi, dt(31))).astype(np.int64)
    return np.where(n >= 32, 0, np.uint64(ALL) >> np.minimum(n, 31).astype(np.uint64)).astype(np.uint64)


def _cmp_word(op: str, v, dt):
    """ab_cmp_word: the bits b = 0 .. 31 with b OP v."""
    one = dt(1)
    if op == "<":
        return _span_to(v - one, dt)
    if op == "<=":
        return _span_to(v, dt)
    if op == ">":
        return _span_from(v + one, dt)
    if op == ">=":
        return _span_from(v, dt)
    # one bit: PTX shl of 1 by v as unsigned (a negative v is 2^31 or more: 0)
    eq = np.where((v >= 0) & (v < 32), np.uint64(1) << np.clip(v, 0, 31).astype(np.uint64), np.uint64(0))
    return eq if op == "==" else ~eq & np.uint64(ALL)


def _div_word(op: str, s: int, n, r0, k: int, dt):
    """ab_div_word: the bits b at which (x0 + s b) // k OP x0 // k + n, r0 = x0 mod k."""
    k = dt(k)

    def clamp(x, lo, hi):
        return np.minimum(np.maximum(x, dt(lo)), dt(hi))

    if s > 0:  # Q - Q(0) reaches m from b = m k - r0 on
        top = int(32 // k) + 2
        u0, u1 = (clamp(clamp(m, 0, top) * k - r0, -1, 33).astype(np.int32) for m in (n, n + dt(1)))
        lo, hi = {"<": (None, u0 - 1), "<=": (None, u1 - 1), ">": (u1, None), ">=": (u0, None)}.get(op, (u0, u1 - 1))
    else:  # Q - Q(0) falls below m from b = r0 - m k + 1 on
        bottom = -(int(32 // k) + 1)
        l0, l1 = (clamp(r0 - clamp(m, bottom, 1) * k + dt(1), -1, 33).astype(np.int32) for m in (n, n + dt(1)))
        lo, hi = {"<": (l0, None), "<=": (l1, None), ">=": (None, l0 - 1), ">": (None, l1 - 1)}.get(op, (l1, l0 - 1))
    i32 = np.int32
    word = (_span_from(lo, i32) if lo is not None else np.uint64(ALL)) & \
           (_span_to(hi, i32) if hi is not None else np.uint64(ALL))
    return ~word & np.uint64(ALL) if op == "!=" else word


def _word(a: Atom, i, j0):
    dt = np.int32 if a.narrow else np.int64
    i, j0 = i.astype(dt), j0.astype(dt)
    if a.kind == "each":
        cmp = _evaluator(a.cmp)
        out = np.zeros(np.broadcast_shapes(i.shape, j0.shape), dtype=np.uint64)
        for b in range(32):
            out |= np.asarray(cmp(i, j0 + dt(b)), dtype=np.uint64) << np.uint64(b)
        return out
    if a.kind == "rows":
        return np.where(_evaluator(a.cmp)(i, j0), np.uint64(ALL), np.uint64(0))
    A, B = (_evaluator(x)(i, j0) for x in a.cmp.args)
    v = np.asarray(-(A - B) if a.c > 0 else (A - B), dtype=dt)
    if a.kind == "lin":
        if not a.narrow:  # ab_clamp_word
            v = np.clip(v, -CLAMP, CLAMP).astype(np.int32)
        return _cmp_word(a.op, v, np.int32)
    x0 = np.asarray(_evaluator(a.q.args[0])(i, j0), dtype=dt)
    return _div_word(a.op, a.s, v, x0 % dt(a.k), a.k, dt)


def emulate(w, i, j0):
    """The word tree on int arrays ``i`` and ``j0`` that broadcast: uint32 words, bit b for key
    j0 + b, computed as the device does (32-bit atoms in int32 arithmetic)."""
    i, j0 = np.asarray(i, dtype=np.int64), np.asarray(j0, dtype=np.int64)
    shape = np.broadcast_shapes(i.shape, j0.shape)

    def walk(w):
        if w[0] == "const":
            return np.full(shape, ALL if w[1] else 0, dtype=np.uint64)
        if w[0] == "not":
            return ~walk(w[1]) & np.uint64(ALL)
        if w[0] == "and":
            return walk(w[1]) & walk(w[2])
        if w[0] == "or":
            return walk(w[1]) | walk(w[2])
        return np.broadcast_to(_word(w[1], i, j0), shape)
    return walk(w).astype(np.uint32)


__all__ = ["Atom", "plan", "atoms", "c_bits", "emulate", "LIM32", "REF_T", "CLAMP"]
