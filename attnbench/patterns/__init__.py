"""Sparse-attention patterns (SPEC section 2): the registry, and masks made from it.

Each pattern is one unit: ``attnbench/patterns/<name>.py`` (parameters, the reference predicate,
pair counts, key intervals for the tile lists; see ``base.Pattern``) beside
``kernels/patterns/<name>.cuh`` (the device predicate, the struct ``ab_<name>``). To add one, write
those two files and add its line to ``REGISTERED`` below; the CLI options, sweep axes, CSV columns,
tests and the gate follow from the registry.
"""
from __future__ import annotations

import numpy as np

from ..errors import BadInput
from .base import Param, Pattern
from .bigbird import BigBird
from .block_diagonal import BlockDiagonal
from .custom import Custom
from .dense import Dense
from .dilated import Dilated
from .document import Document
from .mask import Mask
from .prefix_lm import PrefixLM
from .streaming import Streaming
from .window import Window

REGISTERED: tuple[Pattern, ...] = (
    Dense(),
    Window(),
    Streaming(),
    BlockDiagonal(),
    Dilated(),
    BigBird(),
    PrefixLM(),
    Document(),
    Custom(),
)
PATTERNS: dict[str, Pattern] = {pat.name: pat for pat in REGISTERED}
# the longest sequence a mask is made for: its host-side row counts and tile lists take tens of
# bytes a row (and the kernels index rows with 32-bit integers)
MAX_T = 1 << 28


def all_params() -> dict[str, list[tuple[Pattern, Param]]]:
    """Every declared parameter name, with the patterns that take it, in registry order."""
    out: dict[str, list[tuple[Pattern, Param]]] = {}
    for pat in REGISTERED:
        for q in pat.params:
            out.setdefault(q.name, []).append((pat, q))
    return out


def param_columns() -> tuple[str, ...]:
    """The parameters that get a CSV column of their own."""
    return tuple(name for name, uses in all_params().items() if all(q.column for _, q in uses))


def pattern_label(name: str, params: dict) -> str:
    """``window(window=64)``: the parameters in the pattern's own order, seeds left out."""
    ps = ",".join(f"{k}={v}" for k, v in get_pattern(name).label_items(params))
    return f"{name}({ps})" if ps else name


def get_pattern(name: str) -> Pattern:
    try:
        return PATTERNS[name]
    except KeyError:
        raise BadInput(f"pattern={name!r} is unknown: choose one of {', '.join(PATTERNS)}") from None


def make_mask(pattern: str, T: int, causal: bool = True, **params) -> Mask:
    """Validate a pattern at T and return its Mask; raises BadInput naming the parameter."""
    pat = get_pattern(pattern)
    if not isinstance(T, (int, np.integer)) or T < 1:
        raise BadInput(f"T={T} must be a positive integer")
    if T > MAX_T:
        raise BadInput(f"T={T} exceeds {MAX_T}: the host side of a mask (row counts, tile lists) takes tens of "
                       f"bytes a row")
    known = {q.name for q in pat.params}
    extra = sorted(k for k, v in params.items() if v is not None and k not in known)
    if extra:
        raise BadInput(f"pattern {pat.name!r} takes no parameter {', '.join(extra)}"
                       f" (it takes: {', '.join(sorted(known)) or 'none'})")
    p = pat.defaults()
    for q in pat.params:
        v = params.get(q.name)
        p[q.name] = q.value(p[q.name] if v is None else v)
    pat.validate(int(T), p)
    table = pat.make_table(int(T), p)
    mask = Mask(pat, int(T), bool(causal), p, table)
    pat.check_mask(mask)
    return mask


def examples(T: int, causal=(True, False)):
    """(name, causal, params) for every registered pattern's examples at T: what tests and the
    gate run over."""
    for pat in REGISTERED:
        for ps in pat.examples(T):
            for c in causal:
                yield pat.name, c, ps


__all__ = ["BadInput", "Param", "Pattern", "PATTERNS", "REGISTERED", "get_pattern", "Mask", "make_mask",
           "pattern_label", "all_params", "param_columns", "examples"]
