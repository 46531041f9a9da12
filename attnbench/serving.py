"""Serving shapes (SPEC section 1): per-sequence cache lengths of a ragged batch, given as a list
or drawn from a named distribution with a seed, and how a row spells them."""
from __future__ import annotations

import numpy as np

from .errors import BadInput

# name -> what it draws (the README and --help show these lines)
DISTRIBUTIONS = {
    "uniform": "Tk_b uniform between max(Tq, Tk/4) and Tk, in steps of 64 when Tk is a multiple of 64 "
               "(so block sizes up to 64 divide every length)",
}
STEP = 64


def parse_lens(text: str) -> tuple[int, ...]:
    """``--cache-lens 4096,1024,...``: BadInput naming the option when not integers."""
    try:
        lens = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise BadInput(f"--cache-lens={text!r} must be integers separated by commas") from None
    if not lens:
        raise BadInput("--cache-lens is empty: give one cache length per sequence")
    return lens


def draw_lens(dist: str, seed: int, B: int, Tk: int, Tq: int = 1) -> tuple[int, ...]:
    """B cache lengths from the distribution ``dist`` (numpy's default_rng(seed))."""
    if dist not in DISTRIBUTIONS:
        raise BadInput(f"--cache-dist={dist!r} is unknown: choose one of {', '.join(DISTRIBUTIONS)}")
    if not 1 <= Tq <= Tk:
        raise BadInput(f"Tq={Tq} must be from 1 to Tk={Tk}")
    step = STEP if Tk % STEP == 0 else 1
    lo = -(-max(Tq, Tk // 4) // step) * step
    rng = np.random.default_rng(seed)
    return tuple(int(lo + step * x) for x in rng.integers(0, (Tk - lo) // step + 1, size=B))


def lens_text(lens) -> str:
    """A row's cache_lens cell: the lengths joined by commas, empty when the batch is not ragged."""
    return "" if lens is None else ",".join(str(int(t)) for t in lens)


def cache_lens_for(B: int, Tk: int, Tq: int, lens=None, dist: str | None = None, seed: int = 0):
    """The cache lengths a command asks for: given (``--cache-lens``), drawn (``--cache-dist``), or
    None (every sequence holds Tk keys)."""
    if lens is not None and dist is not None:
        raise BadInput("--cache-lens and --cache-dist exclude each other (lengths given, or drawn)")
    if dist is not None:
        return draw_lens(dist, seed, B, Tk, Tq)
    return None if lens is None else tuple(lens)


def one_predicate(prob) -> str | None:
    """Why one launch cannot take every sequence of ``prob``'s ragged batch with one predicate (the
    mask at the longest length, keys past each sequence's own cut off): a pattern whose compiled
    predicate or table depends on the length (document's drawn lengths, BigBird's random blocks,
    an expression reading T). None when it can, or the batch is not ragged."""
    lens = set(prob.lens)
    if prob.cache_lens is None or len(lens) == 1:
        return None
    mask = prob.mask
    if mask.pattern.uses_table or any(mask.at(t).device_defines() != mask.device_defines() for t in lens):
        return (f"a ragged batch of {mask.label()}: its predicate or table depends on the cache length, "
                f"and one launch takes one")
    return None


def query_offsets(prob) -> np.ndarray:
    """Each sequence's position of its first query: Tk_b - Tq (int64 [B])."""
    return np.asarray(prob.lens, np.int64) - prob.q_len
