"""Implementations: what can compute attention on a Problem, and the registry of them.

An implementation (``Impl``) says whether it can run on this machine (``availability``),
whether it takes a given problem (``unsupported``), and ``prepare``s a ``Runner`` bound to
inputs: compilation, mask or tile-list builds happen there and are recorded in
``Runner.setup`` (seconds), never in the time of ``Runner.run``.
"""
from __future__ import annotations

import contextlib
import functools
import math
import numbers
import time
from dataclasses import dataclass

from .errors import BadInput
from .patterns import Mask

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
DTYPES = tuple(ITEMSIZE)
# SPEC section 4: ||out - ref|| / ||ref|| limits
TOLERANCE = {"float32": 1e-5, "float16": 5e-3, "bfloat16": 1e-2}
# the pass axis (SPEC section 3): the forward, the backward given the forward's saved state (its output
# and row log-sum-exp), and a training step (both)
PASSES = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True, eq=False)
class Problem:
    mask: Mask
    B: int
    H: int
    D: int
    dtype: str
    scale: float | None = None
    max_t: int | None = None     # compile-time MAX_T the user asked for (None: from T)
    max_keys: int | None = None  # compile-time MAX_KEYS the user asked for (None: from the pattern)
    pass_name: str = "fwd"       # one of PASSES
    # serving (SPEC sections 1, 3): grouped-query heads, Tq queries at the end of each sequence's
    # cache, per-sequence cache lengths (None: every sequence holds T = Tk keys)
    H_kv: int | None = None      # key/value heads (None: H); H % H_kv == 0
    Tq: int | None = None        # queries (None: T, prefill)
    cache_lens: tuple[int, ...] | None = None  # Tk_b of each sequence, Tq <= Tk_b <= T

    def __post_init__(self):
        for name in ("B", "H", "D"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise BadInput(f"{name}={v!r} must be a positive integer")
        if self.scale is not None and not (isinstance(self.scale, (int, float)) and math.isfinite(self.scale)
                                           and self.scale > 0):
            raise BadInput(f"scale={self.scale!r} must be a positive finite number")
        if self.dtype not in ITEMSIZE:
            raise BadInput(f"dtype={self.dtype!r} is not supported: choose one of {', '.join(ITEMSIZE)}")
        self._check_serving()
        if self.max_t is not None and self.T > self.max_t:
            raise BadInput(f"T={self.T} exceeds max_t={self.max_t}")
        # MAX_KEYS bounds the keys of one row of a sparse pattern (dense rows are bounded by MAX_T)
        sparse = self.mask.pattern.name != "dense"
        if sparse and self.max_keys is not None and self.mask.max_keys > self.max_keys:
            raise BadInput(f"keys per row reach {self.mask.max_keys} for {self.mask.label()} at T={self.T}, "
                           f"above max_keys={self.max_keys}")
        if self.pass_name not in PASSES:
            raise BadInput(f"pass={self.pass_name!r} is not one of {', '.join(PASSES)}")
        if self.pass_name != "fwd" and (self.kv_heads != self.H or not self.prefill):
            shape = "; ".join(w for w, on in ((f"H_kv={self.kv_heads} < H={self.H}", self.kv_heads != self.H),
                                               (f"Tq={self.q_len} < Tk={self.T}", self.q_len != self.T),
                                               ("a ragged batch (cache_lens)", self.cache_lens is not None)) if on)
            raise BadInput(f"pass={self.pass_name} takes prefill shapes only (H_kv = H, Tq = Tk, no cache_lens): "
                           f"serving shapes are forward-only, and this one has {shape}")

    def _check_serving(self) -> None:
        H_kv, Tq, lens = self.kv_heads, self.q_len, self.cache_lens
        if not isinstance(H_kv, int) or H_kv < 1 or self.H % H_kv:
            raise BadInput(f"H_kv={H_kv!r} must be a positive integer dividing H={self.H}")
        if not isinstance(Tq, int) or not 1 <= Tq <= self.T:
            raise BadInput(f"Tq={Tq!r} must be an integer from 1 to Tk=T={self.T}")
        if lens is None:
            return
        if isinstance(lens, (list, tuple)) and all(isinstance(t, numbers.Integral) for t in lens):
            object.__setattr__(self, "cache_lens", lens := tuple(int(t) for t in lens))
        if not isinstance(lens, tuple) or len(lens) != self.B or not all(isinstance(t, int) for t in lens):
            raise BadInput(f"cache_lens={list(lens)} must hold one integer per sequence (B={self.B})")
        bad = [t for t in lens if not Tq <= t <= self.T]
        if bad:
            raise BadInput(f"cache_lens holds {bad[0]}: each sequence's cache length must be from Tq={Tq} "
                           f"to Tk=T={self.T}")
        for t in sorted(set(lens)):
            try:
                self.masks[t]
            except BadInput as e:
                raise BadInput(f"cache_lens holds {t}, which {self.mask.label()} does not fit: {e}") from None

    @property
    def kv_heads(self) -> int:
        return self.H if self.H_kv is None else self.H_kv

    @property
    def q_len(self) -> int:
        return self.T if self.Tq is None else self.Tq

    @property
    def prefill(self) -> bool:
        """Tq = Tk queries over every sequence's whole cache (today's rows)."""
        return self.q_len == self.T and self.cache_lens is None

    @property
    def lens(self) -> tuple[int, ...]:
        """Tk_b of every sequence (T for each when the batch is not ragged)."""
        return tuple(self.cache_lens) if self.cache_lens is not None else (self.T,) * self.B

    @functools.cached_property
    def masks(self) -> dict:
        """The mask at each distinct cache length (validated there: a block size must divide it)."""
        return {t: self.mask.at(t) for t in sorted(set(self.lens))}

    def query_rows(self, Tk: int):
        """The absolute positions Tk - Tq .. Tk - 1 of the queries of a sequence of Tk keys."""
        import numpy as np

        return np.arange(Tk - self.q_len, Tk, dtype=np.int64)

    @functools.cached_property
    def _decode_counts(self) -> dict:
        """Per distinct cache length: (allowed pairs of its Tq queries, keys some query reads)."""
        return {t: (int(m.row_counts(self.query_rows(t)).sum()), int(m.keys(self.query_rows(t)).size))
                for t, m in self.masks.items()}

    @property
    def pairs(self) -> int:
        """Allowed (query, key) pairs of one head: of one sequence (the mask's own count for
        prefill), summed over the sequences of a ragged batch."""
        if self.prefill:
            return self.mask.pairs
        per = {t: n for t, (n, _) in self._decode_counts.items()}
        return sum(per[t] for t in self.lens) if self.cache_lens is not None else per[self.T]

    @property
    def density(self) -> float:
        if self.prefill:
            return self.mask.density
        return self.pairs / float(self.q_len * (sum(self.lens) if self.cache_lens is not None else self.T))

    @property
    def T(self) -> int:
        return self.mask.T

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.D)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """Of q and of the output: [B, H, Tq, D] (Tq = T for prefill)."""
        return (self.B, self.H, self.q_len, self.D)

    @property
    def kv_shape(self) -> tuple[int, int, int, int]:
        """Of k and v: [B, H_kv, Tk, D] (a ragged batch's sequence b uses its first Tk_b keys)."""
        return (self.B, self.kv_heads, self.T, self.D)

    @property
    def fwd_flops(self) -> int:
        """Useful FLOPs of the forward (SPEC section 3): 4 * D * pairs * B * H (a ragged batch's
        pairs hold its B)."""
        seqs = 1 if self.cache_lens is not None else self.B
        return 4 * self.D * self.pairs * seqs * self.H

    @property
    def fwd_bytes_floor(self) -> int:
        """Bytes the forward must move at least: Q and O once at H heads; K and V once at H_kv
        heads: every key for prefill, for a decode only the keys some query may read (SPEC
        section 3)."""
        qo = 2 * self.B * self.H * self.q_len
        if self.prefill:
            kv = 2 * self.B * self.kv_heads * self.T
        else:
            read = {t: n for t, (_, n) in self._decode_counts.items()}
            kv = 2 * self.kv_heads * sum(read[t] for t in self.lens)
        return (qo + kv) * self.D * ITEMSIZE[self.dtype]

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    @property
    def flops(self) -> int:
        """Useful FLOPs of the pass (SPEC section 3): the forward's 4 * D * pairs * B * H; the
        backward's 10 * D * pairs * B * H (five products against two); a training step both."""
        fwd = self.fwd_flops
        return {"fwd": fwd, "bwd": fwd // 4 * 10, "fwd+bwd": fwd // 4 * 14}[self.pass_name]

    @property
    def bytes_floor(self) -> int:
        """Bytes the pass must move at least: the forward reads Q, K, V and writes O; the backward
        reads Q, K, V, O, dO and the row log-sum-exp (float32) and writes dQ, dK, dV; a training
        step both."""
        fwd = self.fwd_bytes_floor
        bwd = 8 * self.B * self.H * self.T * self.D * ITEMSIZE[self.dtype] + 4 * self.B * self.H * self.T
        return {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[self.pass_name]


@functools.lru_cache(maxsize=None)
def device_problem() -> str | None:
    """None when CuPy sees a CUDA device, else why not."""
    try:
        import cupy
    except ImportError as e:
        return f"CuPy is not installed ({e})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:
        return f"no CUDA device ({type(e).__name__}: {str(e).strip()})"
    return None if n > 0 else "no CUDA device"


class Runner:
    """A prepared implementation bound to inputs. ``run`` launches once on the current
    stream; ``out`` is the output of the last run ([B, H, T, D], storage dtype). A runner that
    writes into one buffer of its own keeps it in ``_out``.

    For the passes ``bwd`` and ``fwd+bwd`` (``Problem.pass_name``) the runner was prepared with
    ``do``, the output's gradient; ``run`` computes the pass (``bwd``: the backward alone, from the
    forward state saved at prepare time; ``fwd+bwd``: the forward, saving that state, then the
    backward) and ``grads`` gives (dq, dk, dv) of the last run, each in its input's shape and
    storage dtype (kept in ``_grads``)."""

    setup: dict
    _out = None
    _grads = None

    def run(self) -> None:
        raise NotImplementedError

    @property
    def out(self):
        return self._out

    @property
    def grads(self):
        """(dq, dk, dv) of the last run of a backward pass; None for a forward."""
        return self._grads

    def poison(self) -> None:
        """Fill the output buffers (the forward's output, the gradients) with NaN so an element the
        kernel never writes fails the check."""
        from .arrays import poison

        for a in (self._out, *(self._grads or ())):
            if a is not None:
                poison(a)


@dataclass
class Impl:
    name: str
    family: str          # "attnbench" or "peer"
    description: str
    dtypes: tuple[str, ...]
    passes = ("fwd",)    # the passes it computes (PASSES); a class attribute, not a field
    # the serving shapes it takes (SPEC section 1; class attributes, not fields): by default
    # prefill only, H_kv = H, every sequence holding Tk keys
    gqa = False     # H_kv < H: grouped-query heads
    decode = False  # Tq < Tk: queries at the end of the cache
    ragged = False  # per-sequence cache lengths (cache_lens)
    takes_prefill = True  # Tq = Tk, every sequence holding Tk keys (a decoding kernel may leave it to another)

    def availability(self) -> str | None:
        """None when it can run here, else the reason it cannot."""
        return device_problem()

    def unsupported(self, prob: Problem) -> str | None:
        """None when it takes the problem, else why not (becomes a skip reason)."""
        if prob.pass_name not in self.passes:
            return f"pass={prob.pass_name} is not supported by {self.name} (supports: {', '.join(self.passes)})"
        if prob.dtype not in self.dtypes:
            return f"dtype={prob.dtype} is not supported by {self.name} (supports: {', '.join(self.dtypes)})"
        return self.unsupported_serving(prob)

    def shapes_taken(self) -> str:
        """Which shapes it runs (``attnbench list``): prefill and/or decoding, and the serving
        shapes it takes beyond today's (grouped heads, ragged batches)."""
        kinds = (["prefill"] if self.takes_prefill else []) + (["decoding (Tq < Tk)"] if self.decode else [])
        kinds += (["grouped heads"] if self.gqa else []) + (["ragged batches"] if self.ragged else [])
        return ", ".join(kinds)

    def unsupported_serving(self, prob: Problem) -> str | None:
        """Why the serving shape of ``prob`` is not one it takes (``gqa``, ``decode``, ``ragged``)."""
        if prob.prefill and not self.takes_prefill:
            return f"{self.name} takes decoding shapes only (Tq < Tk or a ragged batch); prefill is another's"
        if prob.kv_heads != prob.H and not self.gqa:
            return (f"H_kv={prob.kv_heads} < H={prob.H} (grouped-query heads) is not supported by {self.name} "
                    f"(it takes H_kv = H only)")
        if prob.q_len != prob.T and not self.decode:
            return (f"Tq={prob.q_len} < Tk={prob.T} (decoding) is not supported by {self.name} "
                    f"(it takes Tq = Tk only: prefill)")
        if prob.cache_lens is not None and not self.ragged:
            return (f"a ragged batch (cache_lens) is not supported by {self.name} "
                    f"(every sequence must hold Tk={prob.T} keys)")
        return None

    def tolerance(self, prob: Problem) -> float:
        return prob.tolerance

    def prepare(self, prob: Problem, q, k, v, **options) -> Runner:
        """A runner bound to these inputs: the requirements checked once here (BadInput naming
        what is missing), then ``build``. A backward pass (``prob.pass_name`` ``bwd`` or
        ``fwd+bwd``) takes the output's gradient as ``do=`` (q's shape and storage dtype)."""
        self.require(prob)
        return self.build(prob, q, k, v, **options)

    def build(self, prob: Problem, q, k, v, **options) -> Runner:
        """Compile, build masks or tile lists, allocate the output; time each such step into the
        runner's ``setup`` with ``timed``."""
        raise NotImplementedError

    def tile_variant(self, spec) -> "Impl | None":
        """This implementation with the tile shape fields of ``spec`` (``fwd_config.TileSpec``) fixed,
        under a name of its own; None when it has no tile shapes."""
        return None

    def decode_variant(self, spec) -> "Impl | None":
        """The same for a decode shape (``decode_config.DecodeSpec``); None when it has none."""
        return None

    def bwd_variant(self, spec) -> "Impl | None":
        """The same for the backward's fields (``bwd_config.BwdSpec``); None when it has none."""
        return None

    def require(self, prob: Problem) -> None:
        """Raise BadInput if this implementation cannot run the problem here: the problem against
        its limits first, then the machine."""
        why = self.unsupported(prob)  # the input first, so a machine without a GPU reports it too
        if why:
            raise BadInput(why)
        why = self.availability()
        if why:
            raise BadInput(f"impl={self.name} cannot run here: {why}")


@contextlib.contextmanager
def timed(setup: dict, key: str):
    """Adds the seconds the block takes to ``setup[key]`` (a runner's setup columns)."""
    t0 = time.perf_counter()
    yield
    setup[key] = setup.get(key, 0.0) + time.perf_counter() - t0


_REGISTRY: dict[str, Impl] = {}
# the modules that register implementations, in the order lists and plots show them; each also
# gives the standard builds of its kernels (``standard_builds``), which ``attnbench compile`` compiles
MODULES = ("naive", "fast_f32", "fast_tc", "decode", "peers")


def register(impl: Impl) -> Impl:
    _REGISTRY[impl.name] = impl
    return impl


def _load_all() -> None:
    # each module registers its implementations on import
    for mod in MODULES:
        try:
            __import__(f"{__package__}.{mod}")
        except ImportError as e:  # a module not written yet, or an optional dependency
            if f"{__package__}.{mod}" not in str(e):
                raise


def all_impls() -> dict[str, Impl]:
    _load_all()
    return dict(_REGISTRY)


def get_impl(name: str) -> Impl:
    impls = all_impls()
    if name not in impls:
        raise BadInput(f"impl={name!r} is unknown: choose one of {', '.join(impls)}")
    return impls[name]
