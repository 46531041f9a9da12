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
        if self.max_t is not None and self.T > self.max_t:
            raise BadInput(f"T={self.T} exceeds max_t={self.max_t}")
        # MAX_KEYS bounds the keys of one row of a sparse pattern (dense rows are bounded by MAX_T)
        sparse = self.mask.pattern.name != "dense"
        if sparse and self.max_keys is not None and self.mask.max_keys > self.max_keys:
            raise BadInput(f"keys per row reach {self.mask.max_keys} for {self.mask.label()} at T={self.T}, "
                           f"above max_keys={self.max_keys}")
        if self.pass_name not in PASSES:
            raise BadInput(f"pass={self.pass_name!r} is not one of {', '.join(PASSES)}")

    @property
    def T(self) -> int:
        return self.mask.T

    @property
    def softmax_scale(self) -> float:
        return self.scale if self.scale is not None else 1.0 / math.sqrt(self.D)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.B, self.H, self.T, self.D)

    @property
    def flops(self) -> int:
        """Useful FLOPs (SPEC section 3): 4 * D * pairs * B * H."""
        return 4 * self.D * self.mask.pairs * self.B * self.H

    @property
    def bytes_floor(self) -> int:
        return 4 * self.B * self.H * self.T * self.D * ITEMSIZE[self.dtype]

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.dtype]

    # per pass: ``flops`` and ``bytes_floor`` above are the forward's (kept as ``fwd_flops`` and
    # ``fwd_bytes_floor``); the two below, defined after them, replace them with the pass's own
    fwd_flops = flops
    fwd_bytes_floor = bytes_floor

    @property
    def flops(self) -> int:  # noqa: F811 - the pass's, over the forward's above
        """Useful FLOPs of the pass (SPEC section 3): the forward's 4 * D * pairs * B * H; the
        backward's 10 * D * pairs * B * H (five products against two); a training step both."""
        fwd = self.fwd_flops
        return {"fwd": fwd, "bwd": fwd // 4 * 10, "fwd+bwd": fwd // 4 * 14}[self.pass_name]

    @property
    def bytes_floor(self) -> int:  # noqa: F811
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
    writes into one buffer of its own keeps it in ``_out``."""

    setup: dict
    _out = None

    def run(self) -> None:
        raise NotImplementedError

    @property
    def out(self):
        return self._out

    def poison(self) -> None:
        """Fill the output buffer with NaN so an element the kernel never writes fails the check."""
        from .arrays import poison

        if self._out is not None:
            poison(self._out)


@dataclass
class Impl:
    name: str
    family: str          # "attnbench" or "peer"
    description: str
    dtypes: tuple[str, ...]
    passes = ("fwd",)    # the passes it computes (PASSES); a class attribute, not a field

    def availability(self) -> str | None:
        """None when it can run here, else the reason it cannot."""
        return device_problem()

    def unsupported(self, prob: Problem) -> str | None:
        """None when it takes the problem, else why not (becomes a skip reason)."""
        if prob.pass_name not in self.passes:
            return f"pass={prob.pass_name} is not supported by {self.name} (supports: {', '.join(self.passes)})"
        if prob.dtype not in self.dtypes:
            return f"dtype={prob.dtype} is not supported by {self.name} (supports: {', '.join(self.dtypes)})"
        return None

    def tolerance(self, prob: Problem) -> float:
        return prob.tolerance

    def prepare(self, prob: Problem, q, k, v, **options) -> Runner:
        """A runner bound to these inputs: the requirements checked once here (BadInput naming
        what is missing), then ``build``."""
        self.require(prob)
        return self.build(prob, q, k, v, **options)

    def build(self, prob: Problem, q, k, v, **options) -> Runner:
        """Compile, build masks or tile lists, allocate the output; time each such step into the
        runner's ``setup`` with ``timed``."""
        raise NotImplementedError

    def tile_variant(self, spec) -> "Impl | None":
        """This implementation with the tile shape fields of ``spec`` (``fast_tc.TileSpec``) fixed,
        under a name of its own; None when it has no tile shapes."""
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
MODULES = ("naive", "fast_f32", "fast_tc", "peers")


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
