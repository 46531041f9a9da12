"""custom: a pattern from one boolean expression over i, j, T and named integers, e.g.
``--expr "(i - j < W) | (j < S) | (j % 512 == 0)" --param W=1024 --param S=4`` (the grammar:
attnbench/patterns/expr.py). The expression is the predicate before the causal clause. numpy and
torch evaluate it for the reference mask and FlexAttention, the device compiles it in as the C
text AB_CUSTOM_EXPR (kernels/patterns/custom.cuh, T and the parameters as literals), with
AB_CUSTOM_BITS, the words of 32 keys built from key intervals for the partial tiles
(attnbench/patterns/expr_bits.py), and having no
closed-form key intervals, its pair counts and tile lists come from classifying every tile
(attnbench/classify.py: on the GPU, or on the host deciding whole blocks of tiles by interval
arithmetic). A mask with a row that allows no key is refused, naming the row."""
from __future__ import annotations

import numpy as np

from ..classify import row_counts, tiles
from .expr import LIMIT, Bound, bind, check_name, parse
from .base import BadInput, Param, Pattern

DEFAULT_EXPR = "(j < 16) | (abs(i - j) < 64)"
SHORT = 40  # characters of a short label (tables, legends), at most


class Custom(Pattern):
    name = "custom"
    params = (Param("expr", DEFAULT_EXPR, 0, "the pattern as one boolean expression over i, j, T and the --param "
                                             "names, e.g. '(i - j < W) | (j < S)' (README: the grammar)",
                    kind="str", column=False),
              Param("param", (), -LIMIT, "a named integer of --expr, NAME=VALUE (repeatable; in sweep, every "
                                              "value applies to every --expr)", kind="named", column=False))
    summary = "one boolean expression over i, j, T and named integers: --expr '(i - j < W) | (j < S)' --param W=64"
    short_key = "expression"
    user_predicate = True

    @staticmethod
    def names(p: dict) -> tuple[str, ...]:
        return tuple(sorted(n for n, _ in p["param"]))

    def bound(self, T: int, p: dict) -> Bound:
        """The expression bound to T and its parameters (cached by ``bind``)."""
        return bind(p["expr"], T, tuple(p["param"]))

    # -- checks ---------------------------------------------------------------------------
    def check_params(self, p):
        for n in self.names(p):
            check_name(n)
        parse(p["expr"], self.names(p))

    def validate(self, T, p):
        self.check_params(p)
        self.bound(T, p)  # divisors above 0, no integer beyond 2^62

    def check_mask(self, mask):
        counts = mask.row_counts()
        empty = np.flatnonzero(counts == 0)
        if empty.size:
            more = f" (and {empty.size - 1} more rows)" if empty.size > 1 else ""
            raise BadInput(f"custom: row {empty[0]} allows no key{more} at T={mask.T}, "
                           f"{'causal' if mask.causal else 'non-causal'}: every row needs one (expr {mask.params['expr']!r})")

    # -- the mask ---------------------------------------------------------------------------
    def allowed(self, i, j, T, causal, p, table):
        return self.bound(T, p).allowed(i, j)

    def predicate(self, T, causal, p, table):
        return self.bound(T, p).predicate

    def _mask(self, T, causal, p):
        from .mask import Mask

        return Mask(self, T, causal, p)

    def row_counts(self, i, T, causal, p, table):
        return row_counts(self._mask(T, causal, p), self.bound(T, p).boxes)[i]

    def intervals(self, i, T, causal, p, table, split):
        raise NotImplementedError("custom has no key intervals: its tile lists come from build_tiles")

    def build_tiles(self, mask, BM, BN, fresh=False):
        return tiles(mask, BM, BN, self.bound(mask.T, mask.params).boxes, fresh)

    def device_args(self, p):
        return ()  # the expression and its parameters are compiled in (extra_defines)

    def extra_defines(self, T, p):
        b = self.bound(T, p)
        return {"AB_CUSTOM_EXPR": b.c, "AB_CUSTOM_BITS": b.c_bits}

    # -- labels -------------------------------------------------------------------------------
    def label_items(self, p):
        return [("expr", p["expr"])] + list(p.get("param", ()))

    def short_label(self, p):
        text = " ".join(str(p.get("expr", "")).split())
        if p.get("param"):
            text += " " + ",".join(f"{n}={v}" for n, v in p["param"])
        return text if len(text) <= SHORT else text[:SHORT - 1] + "…"

    def examples(self, T):
        return [
            {"expr": DEFAULT_EXPR},
            # streaming with a strided global column, from the issue
            {"expr": "(i - j < W) & (j - i < W) | (j < S) | (j % 8 == 0)", "param": (("S", 4), ("W", 24))},
            # a dilated window: every third key within 5 strides
            {"expr": "((i - j) % R == 0) & (abs(i - j) < W * R)", "param": (("R", 3), ("W", 5))},
            # blocks of a third of T, a prefix, the last keys: floor division of negatives, min, max, T
            {"expr": "((i - j) // 4 == 0) | (i // B == j // B) | (j >= max(T - 8, 0)) | (j < min(P, T))",
             "param": (("B", max(1, T // 3)), ("P", 3))},
        ]
