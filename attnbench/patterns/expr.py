"""The expression language of the ``custom`` pattern: one boolean expression over the query
position ``i``, the key position ``j``, the sequence length ``T`` and named integer parameters.

Grammar, loosest binding first (every operator of one line binds alike, left to right)::

    expr := expr '|' expr              boolean or
          | expr '&' expr              boolean and
          | '~' expr                   boolean not
          | sum CMP sum                CMP one of < <= > >= == != (integers to a boolean; no chains)
    sum  := sum ('+' | '-') sum        integers
          | sum ('*' | '//' | '%') sum
          | '-' sum                    unary minus
          | INT | 'i' | 'j' | 'T' | NAME | FN '(' sum, ... ')' | '(' expr ')'

``INT`` is a decimal literal, ``NAME`` a parameter declared with ``--param NAME=VALUE`` (an
undeclared name is refused), ``FN`` one of ``min(a, b)``, ``max(a, b)``, ``abs(a)``. ``//`` and
``%`` floor as Python's do (``-7 // 2 == -4``, ``-7 % 2 == 1``); their divisor must be constant
(no ``i`` or ``j``) and, once the parameters are known, above 0. Unlike Python, comparisons bind
tighter than ``&`` and ``|``: ``i - j < W | j < S`` is ``(i - j < W) | (j < S)``. ``&``, ``|``
and ``~`` take booleans only, the arithmetic and the comparisons integers only, and the whole
expression must be a boolean. Input outside the grammar raises BadInput naming the 1-based column
of the offending token, with a caret under it.

Values are 64-bit integers on every side. A parsed expression bound to T and its parameters
(``Expr.bind``) is folded (every part without ``i`` or ``j`` becomes its value) and checked for
overflow: every integer it computes for ``0 <= i, j < T + 64`` must stay within 2^62 in magnitude,
so the three forms it gives agree exactly:

* ``Bound.allowed(i, j)``: the predicate on numpy arrays or torch tensors (int64 arithmetic,
  ``//`` and ``%`` flooring in both libraries, min and max without library calls);
* ``Bound.c``: the same as a C expression over ``long long ab_i, ab_j``, parameters and T as
  literals, for ``-DAB_CUSTOM_EXPR=...`` (kernels/patterns/custom.cuh defines the helpers);
* ``Bound.boxes(ilo, ihi, jlo, jhi)``: interval arithmetic over boxes of positions: whether the
  expression may be true and may be false somewhere in each box (``attnbench.classify`` decides
  whole tiles with it and evaluates only the undecided ones pair by pair).

A fourth, ``Bound.c_bits`` (``-DAB_CUSTOM_BITS=...``), gives the 32 keys ``j0 .. j0 + 31`` of a row
at once, from key intervals where it can (attnbench/patterns/expr_bits.py); ``Bound.bits`` is the
same in numpy, for the tests.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from ..errors import BadInput
from .base import NAME, is_torch

FUNCTIONS = {"min": 2, "max": 2, "abs": 1}
RESERVED = ("i", "j", "T", *FUNCTIONS)
COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")
LIMIT = 1 << 62   # every integer an expression computes stays below this in magnitude
MARGIN = 64       # positions checked past T (a 32-key word that starts just below T reads them)

_TOKEN = re.compile(r"\s*(?:([0-9]+)|([A-Za-z_][A-Za-z0-9_]*)|(//|<=|>=|==|!=|[-+*%<>&|~(),]))")
_HINTS = {"/": " (floor division is //)", "=": " (equality is ==)", "!": " (not is ~)"}


@dataclass(frozen=True)
class Node:
    kind: str        # num, i, j, T, name, neg, arith, call, cmp, and, or, not; after binding: const
    pos: int         # 0-based offset of its first character
    end: int         # just past its last character
    typ: str         # "int" or "bool"
    op: str = ""     # operator, function or parameter name
    args: tuple = ()
    value: int | bool = 0


def _fail(text: str, pos: int, what: str):
    raise BadInput(f"expr: {what} at column {pos + 1}\n  {text}\n  {' ' * pos}^")


def _tokens(text: str) -> list[tuple[str, str, int]]:
    """(kind, text, offset) of each token, then ("end", "", len(text))."""
    out, pos = [], 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return out + [("end", "", pos)]
        m = _TOKEN.match(text, pos)
        if m is None:
            c = text[pos]
            _fail(text, pos, f"unexpected character {c!r}{_HINTS.get(c, '')}")
        kind = "int" if m.group(1) else "name" if m.group(2) else "op"
        tok = m.group(m.lastindex)
        out.append((kind, tok, m.start(m.lastindex)))
        pos = m.end()


class _Parser:
    def __init__(self, text: str, names):
        self.text, self.names = text, set(names)
        self.toks = _tokens(text)
        self.n = 0

    # -- tokens -----------------------------------------------------------------------
    @property
    def tok(self):
        return self.toks[self.n]

    def take(self, *ops):
        kind, tok, _ = self.tok
        if kind == "op" and tok in ops:
            self.n += 1
            return tok
        return None

    def unexpected(self):
        kind, tok, pos = self.tok
        _fail(self.text, pos, "unexpected end of the expression" if kind == "end" else f"unexpected token {tok!r}")

    def show(self, node: Node) -> str:
        return repr(self.text[node.pos:node.end])

    def need(self, node: Node, typ: str, what: str) -> Node:
        if node.typ != typ:
            got = "a boolean" if node.typ == "bool" else "an integer"
            _fail(self.text, node.pos, f"{what} takes {'booleans' if typ == 'bool' else 'integers'}, "
                                       f"but {self.show(node)} is {got}")
        return node

    # -- grammar, loosest first ---------------------------------------------------------
    def parse(self) -> Node:
        if self.tok[0] == "end":
            _fail(self.text, 0, "the expression is empty")
        node = self.disjunction()
        if self.tok[0] != "end":
            self.unexpected()
        if node.typ != "bool":
            _fail(self.text, node.pos, f"the expression {self.show(node)} is an integer: it must be a boolean "
                                       "(a comparison, or &, | and ~ of comparisons)")
        return node

    def binary(self, ops, kind: str, typ: str, sub) -> Node:
        """Operators of one binding, left to right, on operands of type ``typ`` (``sub``: the next tighter)."""
        left = sub()
        while op := self.take(*ops):
            right = self.need(sub(), typ, repr(op))
            self.need(left, typ, repr(op))
            if op in ("//", "%") and _uses_ij(right):
                _fail(self.text, right.pos, f"the divisor of {op!r} must be constant (no i or j), "
                                            f"but {self.show(right)} is not")
            left = Node(kind, left.pos, right.end, typ, op, (left, right))
        return left

    def prefix(self, op: str, kind: str, typ: str, what: str, sub, other) -> Node:
        """``op`` applied to ``sub()`` when it comes next, else ``other()``."""
        pos = self.tok[2]
        if self.take(op):
            a = self.need(sub(), typ, what)
            return Node(kind, pos, a.end, typ, op, (a,))
        return other()

    def disjunction(self) -> Node:
        return self.binary(("|",), "or", "bool", self.conjunction)

    def conjunction(self) -> Node:
        return self.binary(("&",), "and", "bool", self.negation)

    def negation(self) -> Node:
        return self.prefix("~", "not", "bool", "'~'", self.negation, self.comparison)

    def comparison(self) -> Node:
        left = self.sum()
        op = self.take(*COMPARISONS)
        if not op:
            return left
        right = self.need(self.sum(), "int", f"{op!r}")
        self.need(left, "int", f"{op!r}")
        if self.tok[0] == "op" and self.tok[1] in COMPARISONS:
            _fail(self.text, self.tok[2], f"comparisons do not chain: write (a < b) & (b < c), not a < b < c; "
                                          f"unexpected {self.tok[1]!r}")
        return Node("cmp", left.pos, right.end, "bool", op, (left, right))

    def sum(self) -> Node:
        return self.binary(("+", "-"), "arith", "int", self.product)

    def product(self) -> Node:
        return self.binary(("*", "//", "%"), "arith", "int", self.unary)

    def unary(self) -> Node:
        return self.prefix("-", "neg", "int", "unary '-'", self.unary, self.atom)

    def atom(self) -> Node:
        kind, tok, pos = self.tok
        if kind == "int":
            self.n += 1
            return Node("num", pos, pos + len(tok), "int", value=int(tok))
        if kind == "name":
            self.n += 1
            if tok in FUNCTIONS:
                return self.call(tok, pos)
            if tok in ("i", "j", "T"):
                return Node(tok, pos, pos + len(tok), "int", tok)
            if tok not in self.names:
                _fail(self.text, pos, f"undeclared name {tok!r} (declare it with --param {tok}=VALUE)")
            return Node("name", pos, pos + len(tok), "int", tok)
        if self.take("("):
            inner = self.disjunction()
            if not self.take(")"):
                if self.tok[0] == "end":
                    _fail(self.text, pos, "this '(' is never closed")
                self.unexpected()
            return Node(inner.kind, pos, self.toks[self.n - 1][2] + 1, inner.typ, inner.op, inner.args, inner.value)
        self.unexpected()

    def call(self, fn: str, pos: int) -> Node:
        if not self.take("("):
            _fail(self.text, pos, f"{fn!r} is a function: write {fn}({', '.join('ab'[:FUNCTIONS[fn]])})")
        args = [self.need(self.sum(), "int", f"{fn}()")]
        while self.take(","):
            args.append(self.need(self.sum(), "int", f"{fn}()"))
        if not self.take(")"):
            self.unexpected()
        if len(args) != FUNCTIONS[fn]:
            _fail(self.text, pos, f"{fn}() takes {FUNCTIONS[fn]} argument{'s' if FUNCTIONS[fn] > 1 else ''}, "
                                  f"got {len(args)}")
        return Node("call", pos, self.toks[self.n - 1][2] + 1, "int", fn, tuple(args))


def _vars(node: Node) -> set[str]:
    """Which of i and j ``node`` reads."""
    return ({node.kind} if node.kind in ("i", "j") else set()).union(*(_vars(a) for a in node.args))


def _uses_ij(node: Node) -> bool:
    return bool(_vars(node))


def check_name(name: str) -> str:
    """A parameter name: an identifier other than i, j, T, min, max, abs (BadInput otherwise)."""
    if not isinstance(name, str) or not NAME.match(name):
        raise BadInput(f"param name {name!r} is not a name (letters, digits and _, not starting with a digit)")
    if name in RESERVED:
        raise BadInput(f"param name {name!r} is reserved ({', '.join(RESERVED)})")
    return name


@functools.lru_cache(maxsize=256)
def parse(text: str, names: tuple[str, ...] = ()) -> Node:
    """The syntax tree of ``text``, parameter names ``names``; BadInput with the column and a caret."""
    if not isinstance(text, str):
        raise BadInput(f"expr={text!r} must be a string")
    return _Parser(text, names).parse()


def uses_T(text: str, names: tuple[str, ...] = ()) -> bool:
    def walk(n: Node) -> bool:
        return n.kind == "T" or any(walk(a) for a in n.args)
    return walk(parse(text, names))


# ---- binding: parameters and T as values, constants folded, overflow ruled out ------------------
def _const(node: Node, v) -> Node:
    return Node("const", node.pos, node.end, node.typ, value=v)


def _arith(op: str, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if op == "//" else a % b


def _compare(op: str, a, b):
    if op == "<":
        return a < b
    if op == "<=":
        return a <= b
    if op == ">":
        return a > b
    if op == ">=":
        return a >= b
    return a == b if op == "==" else a != b


def _fold(text: str, node: Node, env: dict) -> Node:
    k = node.kind
    if k == "num":
        return _const(node, node.value)
    if k in ("T", "name"):
        return _const(node, env[node.op])
    if k in ("i", "j"):
        return node
    args = tuple(_fold(text, a, env) for a in node.args)
    const = all(a.kind == "const" for a in args)
    vals = [a.value for a in args]
    if k == "arith" and node.op in ("//", "%") and vals[1] <= 0:
        given = ", ".join(f"{n}={env[n]}" for n in sorted(_names(node.args[1])))
        _fail(text, node.args[1].pos, f"the divisor {text[node.args[1].pos:node.args[1].end]!r} of {node.op!r} is "
                                      f"{vals[1]}{f' ({given})' if given else ''}: it must be above 0")
    if k in ("and", "or"):
        absorb = k == "or"  # the constant that decides it (True for |, False for &); the other is neutral
        if any(a.kind == "const" and a.value == absorb for a in args):
            return _const(node, absorb)
        rest = tuple(a for a in args if a.kind != "const")
        if len(rest) < 2:
            return rest[0] if rest else _const(node, not absorb)
        return Node(k, node.pos, node.end, node.typ, node.op, rest)
    if const:
        if k == "arith":
            return _const(node, _arith(node.op, *vals))
        if k == "neg":
            return _const(node, -vals[0])
        if k == "call":
            return _const(node, {"min": min, "max": max, "abs": abs}[node.op](*vals))
        if k == "cmp":
            return _const(node, _compare(node.op, *vals))
        if k == "not":
            return _const(node, not vals[0])
    return Node(k, node.pos, node.end, node.typ, node.op, args)


def _names(node: Node) -> set[str]:
    own = {node.op} if node.kind in ("name", "T") else set()
    return own.union(*(_names(a) for a in node.args))


# ---- the forms of a bound expression --------------------------------------------------------------
def _evaluator(node: Node):
    """A function (i, j) -> value of ``node`` on int64 arrays or tensors (python values for constants)."""
    k = node.kind
    if k == "const":
        v = node.value
        return lambda i, j: v
    if k == "i":
        return lambda i, j: i
    if k == "j":
        return lambda i, j: j
    fs = [_evaluator(a) for a in node.args]
    if k == "neg":
        (f,) = fs
        return lambda i, j: -f(i, j)
    if k == "not":
        (f,) = fs
        return lambda i, j: ~f(i, j)
    f, g = fs if len(fs) == 2 else (fs[0], None)
    op = node.op
    if k == "arith":
        return lambda i, j: _arith(op, f(i, j), g(i, j))
    if k == "cmp":
        return lambda i, j: _compare(op, f(i, j), g(i, j))
    if k == "and":
        return lambda i, j: f(i, j) & g(i, j)
    if k == "or":
        return lambda i, j: f(i, j) | g(i, j)
    if op == "abs":
        return lambda i, j: abs(f(i, j))
    if op == "min":  # b + (a - b) [a < b]: the same operators on numpy, torch and python values
        def mn(i, j):
            a, b = f(i, j), g(i, j)
            return b + (a - b) * (a < b)
        return mn

    def mx(i, j):
        a, b = f(i, j), g(i, j)
        return b + (a - b) * (a > b)
    return mx


_C_OPS = {"//": "ab_floordiv", "%": "ab_floormod", "min": "ab_min64", "max": "ab_max64", "abs": "ab_abs64"}
_C_OPS32 = {"//": "ab_floordiv32", "%": "ab_floormod32", "min": "ab_min32", "max": "ab_max32", "abs": "ab_abs32"}
_C_LEAVES = {"i": "ab_i", "j": "ab_j"}


def _c(node: Node, narrow: bool = False, leaves: dict = _C_LEAVES) -> str:
    """``node`` in C: in 64-bit (literals ``LL``, the 64-bit helpers), or with ``narrow`` in 32-bit
    ``int`` (the caller knows every value fits); i and j spelled as ``leaves`` says."""
    k = node.kind
    if k == "const":
        v = node.value
        if isinstance(v, bool):
            return "true" if v else "false"
        text = f"{v}" if narrow else f"{v}LL"
        return f"({text})" if v < 0 else text
    if k in ("i", "j"):
        return leaves[k]
    a = [_c(x, narrow, leaves) for x in node.args]
    if k == "neg":
        return f"(-{a[0]})"
    if k == "not":
        return f"(!{a[0]})"
    ops = _C_OPS32 if narrow else _C_OPS
    if node.op in ops:
        return f"{ops[node.op]}({','.join(a)})"
    return f"({a[0]}{ {'and': '&', 'or': '|'}.get(k, node.op)}{a[1]})"


def _boxes(node: Node, box, seen=None):
    """Interval arithmetic over boxes ilo <= i <= ihi, jlo <= j <= jhi (arrays that broadcast):
    (lo, hi) bounds of an integer node, (may be true, may be false) of a boolean one. ``seen``
    collects (node, lo, hi) of every integer node."""
    k = node.kind
    if k == "const":
        out = (node.value, node.value) if node.typ == "int" else (node.value, not node.value)
    elif k == "i":
        out = box[0], box[1]
    elif k == "j":
        out = box[2], box[3]
    else:
        a = [_boxes(x, box, seen) for x in node.args]
        out = _box_op(node, a)
    if seen is not None and node.typ == "int":
        seen.append((node, out[0], out[1]))
    return out


def _box_op(node: Node, a):
    k, op = node.kind, node.op
    mn, mx = np.minimum, np.maximum
    if k == "neg":
        return -a[0][1], -a[0][0]
    if k == "not":
        return a[0][1], a[0][0]
    if k == "and":
        return a[0][0] & a[1][0], a[0][1] | a[1][1]
    if k == "or":
        return a[0][0] | a[1][0], a[0][1] & a[1][1]
    if op == "abs":
        lo, hi = a[0]
        return np.where(lo >= 0, lo, np.where(hi <= 0, -hi, 0)), mx(-lo, hi)
    (alo, ahi), (blo, bhi) = a
    if op == "min":
        return mn(alo, blo), mn(ahi, bhi)
    if op == "max":
        return mx(alo, blo), mx(ahi, bhi)
    if op == "+":
        return alo + blo, ahi + bhi
    if op == "-":
        return alo - bhi, ahi - blo
    if op == "*":
        p = (alo * blo, alo * bhi, ahi * blo, ahi * bhi)
        return mn(mn(p[0], p[1]), mn(p[2], p[3])), mx(mx(p[0], p[1]), mx(p[2], p[3]))
    if op == "//":  # a constant divisor above 0: monotone
        return alo // blo, ahi // blo
    if op == "%":  # exact inside one period, else every residue
        same = alo // blo == ahi // blo
        return np.where(same, alo % blo, 0), np.where(same, ahi % blo, blo - 1)
    if op in (">", ">="):  # a > b is b < a
        (alo, ahi), (blo, bhi), op = (blo, bhi), (alo, ahi), "<" if op == ">" else "<="
    if op == "<":
        return alo < bhi, ahi >= blo
    if op == "<=":
        return alo <= bhi, ahi > blo
    meet = (alo <= bhi) & (blo <= ahi)
    point = (alo == ahi) & (blo == bhi) & (alo == blo)
    return (meet, ~point) if op == "==" else (~point, meet)


@dataclass(frozen=True, eq=False)
class Bound:
    """An expression with T and its parameters bound: folded, checked, in its forms."""
    text: str
    tree: Node
    T: int = 0

    @functools.cached_property
    def _eval(self):
        return _evaluator(self.tree)

    def allowed(self, i, j):
        """The predicate on index arrays that broadcast (numpy or torch), in int64."""
        return self.predicate(i, j)

    @functools.cached_property
    def predicate(self):
        """``allowed`` as a closure over what it needs, looked up once: the function that
        FlexAttention's mask_mod traces (no cache or property lookups inside)."""
        ev, uses, const = self._eval, _vars(self.tree), self.constant

        def allowed(i, j):
            if is_torch(i):
                i, j = i.long(), j.long()
            else:
                i, j = np.asarray(i, dtype=np.int64), np.asarray(j, dtype=np.int64)
            if const is not None:  # a constant expression: its value at every pair
                return (i == i) & (j == j) if const else (i != i) & (j != j)
            v = ev(i, j)
            return v & (i == i) if "i" not in uses else v & (j == j) if "j" not in uses else v  # the pairs' shape
        return allowed

    @functools.cached_property
    def c(self) -> str:
        """The expression in C over ``long long ab_i, ab_j`` (kernels/patterns/custom.cuh)."""
        return _c(self.tree)

    @functools.cached_property
    def words(self):
        """The bits form's word tree (attnbench/patterns/expr_bits.py): a 32-key word per comparison."""
        from .expr_bits import plan

        return plan(self.tree, self.T)

    @functools.cached_property
    def c_bits(self) -> str:
        """The bits form in C over ``int ab_i, ab_j0``: the word of keys ab_j0 .. ab_j0 + 31, bit b
        for key ab_j0 + b (``-DAB_CUSTOM_BITS=...``, kernels/patterns/custom.cuh's ``bits``)."""
        from .expr_bits import c_bits

        return c_bits(self.words)

    def bits(self, i, j0):
        """The bits form on int arrays that broadcast, as the device computes it: uint32 words,
        bit b the expression at (i, j0 + b), for 0 <= i < T and 0 <= j0 + b < T + 64."""
        from .expr_bits import emulate

        return emulate(self.words, i, j0)

    @property
    def constant(self) -> bool | None:
        """Its value when it does not depend on i or j, else None."""
        return self.tree.value if self.tree.kind == "const" else None

    def boxes(self, ilo, ihi, jlo, jhi):
        """(may be true, may be false) over each box ilo <= i <= ihi, jlo <= j <= jhi (int64
        arrays that broadcast, boxes inside 0 .. T + 63): bool arrays."""
        t, f = _boxes(self.tree, tuple(np.asarray(x, dtype=np.int64) for x in (ilo, ihi, jlo, jhi)))
        shape = np.broadcast_shapes(*(np.shape(x) for x in (ilo, ihi, jlo, jhi)))
        return np.broadcast_to(t, shape), np.broadcast_to(f, shape)


@functools.lru_cache(maxsize=256)
def bind(text: str, T: int, params: tuple[tuple[str, int], ...] = ()) -> Bound:
    """``text`` with T and the named integers ``params`` as values: parsed, folded, divisors
    checked above 0, and every integer it computes for 0 <= i, j < T + MARGIN within 2^62 in
    magnitude. BadInput naming the column otherwise."""
    env = dict(params)
    env["T"] = int(T)
    tree = _fold(text, parse(text, tuple(sorted(n for n, _ in params))), env)
    seen = []
    hi = np.array([int(T) + MARGIN - 1], dtype=object)
    _boxes(tree, (np.array([0], dtype=object), hi, np.array([0], dtype=object), hi), seen)
    for node, lo, up in seen:
        big = max(abs(int(lo[0] if np.ndim(lo) else lo)), abs(int(up[0] if np.ndim(up) else up)))
        if big >= LIMIT:
            _fail(text, node.pos, f"{text[node.pos:node.end]!r} reaches {big:.3g} in magnitude at T={T}: beyond "
                                  f"the 64-bit integers it is computed in (at most 2^62)")
    return Bound(text, tree, int(T))


__all__ = ["parse", "bind", "Bound", "Node", "check_name", "uses_T", "FUNCTIONS", "RESERVED", "LIMIT"]
