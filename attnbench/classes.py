"""The class-major layout: a pattern run on permuted copies of its inputs (``fast-tc-classes``).

Some patterns link positions of different residue classes mod r by bands: the three-level dilation
(dilations 1, 2 and 4, r = 4) allows i - j < 2048 of every pair, even i - j < 4096 and multiples of 4
below 8192. In positional order most of its tiles are partial, and many hold few live pairs. Taken
class by class (position c * n + a of the layout is position a * r + c, n = T / r), every pair of
classes is one band of a - b (``Mask.class_major``, the pattern ``class_bands``), whose tiles are
full but at the band's edges: at T=32768 the 64 x 64 list visits 1.06 times the live pairs instead
of 1.93, and 12% of its tiles are partial instead of 73%.

Where each class holds a multiple of 128 positions (T a multiple of 128 r), fast-tc's kernels run on
the ``class_bands`` mask read in place (its ``in_place``, kernels/tc/rows.cuh): they load and store
each layout row where it lies in the arrays, so nothing is copied (``IN_PLACE``). Elsewhere a runner
here copies Q, K and V (and dO) into the layout (kernels/classes.cu), runs fast-tc's kernels on the
mask there, and copies O (and dQ, dK, dV) back, all inside ``run``; the forward's saved state of a
``bwd`` row (O and the log-sum-exp) stays in the layout, as a training step that kept it would.
"""
from __future__ import annotations

from dataclasses import replace

from .compile import get_module
from .errors import BadInput
from .impls import Problem, Runner

KERNEL = "classes"
# fast-tc takes the layout on its own (``prefers``) where the positional 64 x 64 list visits at least this many
# times the tiles of the class-major one. The three-level dilation: 1.07x at T=4096 (positions: no copies for
# little gain), 1.43x at 8192, 1.81x at 32768 (H200, docs/PERF.md "fast-tc-classes v1 on an H200, and v2":
# fwd+bwd 1.84x and 1.68x faster at D 64 and 128, the copies included), 1.88x at 131072 (1.83x and 1.63x).
MIN_GAIN = 1.25
# the layout read in place by the kernels where the classes' lengths allow it (False: the copies always)
IN_PLACE = True
ENTRY = "class_major"
THREADS = 256
VEC_BYTES = 16


def layout_of(prob: Problem) -> tuple[int, object]:
    """(r, banded mask) of ``prob``'s mask in the class-major layout; BadInput when it has none."""
    r, banded = prob.mask.class_major()
    if r == 1:
        raise BadInput(f"{prob.mask.label()} at T={prob.T} has no class-major layout (its pairs of residue "
                       f"classes are no bands, or T is no multiple of the classes)")
    return r, banded


def read_in_place(banded):
    """``banded`` (the layout's mask) as the kernels read it in place (``Mask.in_place``) where IN_PLACE is on and its
    classes allow, else None: the copies."""
    return banded.in_place() if IN_PLACE else None


def prefers(mask) -> bool:
    """Whether fast-tc runs ``mask`` on its class-major layout: it has one, and the positional 64 x 64 list
    visits at least MIN_GAIN times the tiles of the layout's (host counts of the cached lists)."""
    from .tiles import tile_list

    r, banded = mask.class_major()
    if r == 1:
        return False
    return tile_list(mask, 64, 64).n_visited >= MIN_GAIN * tile_list(banded, 64, 64).n_visited


def copy_launch(src, dst, r: int, inverse: bool):
    """A launch that copies ``src`` into ``dst`` (both [..., T, D], contiguous, 16-bit) into the
    class-major layout of r classes (``inverse``: back out of it)."""
    import cupy
    import numpy as np

    T, D = src.shape[-2], src.shape[-1]
    row_bytes = D * src.dtype.itemsize
    if row_bytes % VEC_BYTES or src.shape != dst.shape or T % r:
        raise BadInput(f"class-major copy of shape {src.shape}: rows of {row_bytes} bytes (a multiple of "
                       f"{VEC_BYTES} needed), T={T} a multiple of r={r}")
    vecs = row_bytes // VEC_BYTES
    total = src.size * src.dtype.itemsize // VEC_BYTES
    fn = get_module(KERNEL, {}).get_function(ENTRY)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid = (int(min(-(-total // THREADS), 8 * sms)),)
    args = (src, dst, np.int32(T), np.int32(r), np.int32(vecs), np.int64(total), np.int32(int(inverse)))
    return lambda: fn(grid, (THREADS,), args)


class ClassMajorRunner(Runner):
    """``run``: the inputs into the layout, the inner runner (fast-tc on the banded mask), its
    outputs back. ``out`` and ``grads`` are in the original order."""

    def __init__(self, inner: Runner, into: list, back: list, out, grads, setup: dict):
        self._inner, self._into, self._back = inner, into, back
        self._out, self._grads = out, grads
        self.setup = setup
        self.cfg = getattr(inner, "cfg", None)

    def run(self) -> None:
        for ln in self._into:
            ln()
        self._inner.run()
        for ln in self._back:
            ln()

    def poison(self) -> None:
        super().poison()
        self._inner.poison()  # the layout's own outputs too, so that an element never written shows


def build(impl, prob: Problem, q, k, v, cfg=None, do=None) -> Runner:
    """``impl`` (fast-tc with ``classes``) on ``prob`` through the class-major layout: the inner
    runner is ``impl`` without it, on the banded mask and permuted copies of the inputs."""
    import cupy

    from .fast_tc import bind_inputs

    r, banded = layout_of(prob)
    in_place = read_in_place(banded)
    if in_place is not None:  # no copies: the kernels read and write the layout where it lies
        sub = replace(prob, mask=in_place)
        inner = replace(impl, classes=False).build(sub, q, k, v, cfg, do=do)
        inner.setup = dict(inner.setup, layout=f"class-major r={r} in place")
        return inner
    names = ("q", "k", "v") + (("do",) if do is not None else ())
    arrays = bind_inputs(prob, q, k, v, *((do,) if do is not None else ()), names=names)
    perm = [cupy.empty_like(a) for a in arrays]
    into = [copy_launch(a, p, r, inverse=False) for a, p in zip(arrays, perm)]
    for ln in into:  # once now: a bwd row's forward state is computed at build, from these
        ln()
    sub = replace(prob, mask=banded)
    inner = replace(impl, classes=False).build(sub, *perm[:3], cfg, do=perm[3] if do is not None else None)
    run_into = into if prob.pass_name != "bwd" else into[3:]  # bwd: only dO is new each step
    back, out, grads = [], None, None
    if inner.out is not None:
        out = cupy.empty_like(arrays[0])
        back.append(copy_launch(inner.out, out, r, inverse=True))
    if inner.grads is not None:
        grads = tuple(cupy.empty_like(a) for a in arrays[:3])
        back += [copy_launch(g, h, r, inverse=True) for g, h in zip(inner.grads, grads)]
    setup = dict(inner.setup, layout=f"class-major r={r}")
    return ClassMajorRunner(inner, run_into, back, out, grads, setup)


def standard_builds() -> list[tuple[str, dict]]:
    """The copy kernel takes no constants: one build."""
    return [(KERNEL, {})]


__all__ = ["MIN_GAIN", "IN_PLACE", "read_in_place", "prefers", "layout_of", "copy_launch", "ClassMajorRunner", "build", "standard_builds"]
