"""Fake implementations, inputs and timer for CPU tests and the test fixture CSV.

Nothing here measures anything: the "times" are a made-up function of the useful FLOPs so
that plots and tables have something to draw. Rows built from these carry the GPU name
"test-fixture".
"""
from __future__ import annotations

import numpy as np

from attnbench.arrays import from_float32, poison, random_inputs
from attnbench.fwd_config import TileConfig
from attnbench.impls import PASSES, Impl, Runner
from attnbench.reference import reference, reference_gradients
from attnbench.timing import Peaks, Timing

FIXTURE = "test-fixture"
PROVENANCE = {"gpu": FIXTURE, "sm_count": 0, "driver": FIXTURE, "cuda_runtime": FIXTURE,
              "cupy": FIXTURE, "torch": "", "git_commit": FIXTURE}
PEAKS = Peaks(tc_tflops=100.0, f32_tflops=10.0, copy_tbps=1.0)


class NumpyRunner(Runner):
    """Computes attention on the host from the float64 reference, times ``factor``; for a backward
    pass its gradients from ``reference_gradients``, each times ``factor`` and ``grad_scale[name]``,
    but those named in ``unwritten`` (left as poisoned) and those ``grad_shapes`` gives another shape."""

    def __init__(self, prob, q, k, v, factor=1.0, do=None, grad_scale=None, unwritten=(), grad_shapes=None):
        self.prob, self.q, self.k, self.v, self.factor = prob, q, k, v, factor
        self._out = np.zeros(q.shape, dtype=q.dtype)
        self.setup = {"compile_s": 0.0, "fake_build_s": 0.0}
        self.calls = 0
        self.do, self.grad_scale, self.unwritten = do, dict(grad_scale or {}), tuple(unwritten)
        if prob.pass_name != "fwd":
            shapes = {"dq": q.shape, "dk": k.shape, "dv": v.shape, **(grad_shapes or {})}
            self._grads = tuple(np.zeros(shapes[n], dtype=q.dtype) for n in ("dq", "dk", "dv"))
            if prob.pass_name == "bwd":  # the saved forward state
                self._forward()

    def _forward(self):
        ref = reference(self.q, self.k, self.v, self.prob.mask, self.prob.dtype, self.prob.softmax_scale,
                        cache_lens=self.prob.cache_lens)
        self._out[...] = from_float32((ref * self.factor).astype(np.float32), self.prob.dtype)

    def run(self):
        self.calls += 1
        if self.prob.pass_name != "bwd":
            self._forward()
        if self.prob.pass_name == "fwd":
            return
        g = reference_gradients(self.q, self.k, self.v, self.do, self.prob.mask, self.prob.dtype,
                                self.prob.softmax_scale)
        for name, a in zip(("dq", "dk", "dv"), self._grads or ()):
            if name not in self.unwritten and a.shape == g[name].shape:
                x = g[name] * self.factor * self.grad_scale.get(name, 1.0)
                a[...] = from_float32(x.astype(np.float32), self.prob.dtype)

    @property
    def out(self):
        return self._out

    def poison(self):
        if self.prob.pass_name != "bwd":
            poison(self._out)
        for a in self._grads or ():
            poison(a)


class FakeImpl(Impl):
    """``factor`` != 1 fails the gate; ``raises`` is raised by prepare; ``unavailable`` is
    the availability reason; ``speed`` scales the made-up time; ``passes`` the passes it computes
    (``grads`` the faults of its gradients: NumpyRunner's keywords)."""

    def __init__(self, name, family="attnbench", dtypes=("float32", "float16"), factor=1.0, raises=None,
                 unavailable=None, speed=1.0, passes=("fwd",), **grads):
        super().__init__(name=name, family=family, description=f"fake {name}", dtypes=tuple(dtypes))
        self.factor, self.raises, self.unavailable, self.speed = factor, raises, unavailable, speed
        self.passes, self.grads = tuple(passes), grads
        self.prepared = 0

    def availability(self):
        return self.unavailable

    def prepare(self, prob, q, k, v, do=None):
        self.prepared += 1
        if self.raises is not None:
            raise self.raises
        return NumpyRunner(prob, q, k, v, self.factor, do, **self.grads)


class FakeTiledImpl(FakeImpl):
    """Takes tile shapes as fast-tc does: ``tile_variant(spec)`` is a copy named ``name[spec]``
    whose runners record the shape they ran (``spec`` over ``base``) in their setup."""

    def __init__(self, name="fake-tiled", base=TileConfig(NWARPS=4, BN=64, STAGES=2), spec=None, **kw):
        super().__init__(name, **kw)
        self.base, self.spec = base, spec

    def tile_variant(self, spec):
        return FakeTiledImpl(f"{self.name}[{spec}]", self.base, spec, dtypes=self.dtypes)

    def prepare(self, prob, q, k, v, do=None):
        runner = super().prepare(prob, q, k, v, do)
        runner.setup["tile_config"] = (self.spec.apply(self.base) if self.spec else self.base).spec
        return runner


def fake_impls():
    return [
        FakeImpl("fake-exact", passes=PASSES),
        FakeImpl("fake-slow", speed=4.0, passes=PASSES),
        FakeImpl("fake-peer", family="peer", speed=0.5, passes=PASSES),
        FakeImpl("fake-wrong", factor=1.5, passes=PASSES),
        FakeImpl("fake-oom", raises=MemoryError("out of memory allocating 1 GiB (fake)")),
        FakeImpl("fake-absent", unavailable="fake: needs a library that is not installed"),
        FakeImpl("fake-f16", dtypes=("float16",)),
    ]


def host_inputs(shape, dtype, seed, keep="qkv"):
    return random_inputs(shape, dtype, seed, xp=np, keep=keep)


class FakeTimer:
    """Calls each run a few times and reports a made-up time: 0.01 ms + flops / 1e9 per ms,
    times the implementation's ``speed`` (looked up by name)."""

    def __init__(self, impls):
        self.speed = {i.name: i.speed for i in impls}
        self.calls = []
        self.options = []  # the keywords of each call: budget_s, or samples

    def __call__(self, runs, budget_s=None, samples=None):
        self.calls.append(sorted(runs))
        self.options.append({k: v for k, v in (("budget_s", budget_s), ("samples", samples)) if v is not None})
        out = {}
        for name, fn in runs.items():
            for _ in range(3):
                fn()
            ms = (0.01 + fn.__self__.prob.flops / 1e9) * self.speed.get(name, 1.0)
            out[name] = Timing(ms, ms * 0.98, ms * 1.03, samples or 10)
        return out
