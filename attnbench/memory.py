"""The ``peak_mem_mb`` column: device memory an implementation allocates beyond its inputs and
output while it prepares and runs, measured through the allocators it allocates with.

A row's window opens before ``prepare`` (the inputs are allocated by then: they are the baseline)
and closes right after the gate's one run. The float64 reference the gate compares against is
computed inside the window for the first implementation of a configuration; ``PeakWindow.aside``
leaves its allocations out (its transient peak, and what it keeps). The column is the highest
allocation seen in the window above the baseline, less the bytes of the pass's outputs (``O``;
a backward's ``dQ``, ``dK``, ``dV``; a training step all four), in MiB; never below 0.

``DeviceMemory`` reads CuPy's default memory pool (a tracking allocator is installed while a
window is open: CuPy keeps no peak of its own; every allocation updates the peak of used bytes)
and, when torch is imported and its CUDA state initialised, torch's caching allocator
(``memory_allocated``, ``max_memory_allocated`` after ``reset_peak_memory_stats``). The two
allocators' peaks are added (an upper bound when both allocate at different moments; one of them
is near zero for every implementation here). Not counted: memory a library takes with cudaMalloc
itself (cuBLAS and cuDNN workspaces, the CUDA context, loaded modules, Triton's autotuning
scratch outside torch's allocator), and the unused bytes either allocator caches.

A meter (``Context.memory`` makes one per row) has ``start()`` / ``stop()`` (around a window),
``used()``, ``reset_peak()`` and ``peak()`` in bytes; ``fresh()``, when it has one, drops what
earlier rows left cached for the next one to reuse (fast-tc's device tile lists), so that every
row counts what it needs.
"""
from __future__ import annotations

import math
import sys

from .impls import ITEMSIZE, Problem

MIB = 1 << 20


def output_bytes(prob: Problem) -> int:
    """Bytes of the pass's outputs: O [B, H, Tq, D]; the backward's dQ, dK, dV (K's and V's at
    [B, H_kv, Tk, D]); a training step both."""
    it = ITEMSIZE[prob.dtype]
    o = math.prod(prob.shape) * it
    grads = (math.prod(prob.shape) + 2 * math.prod(prob.kv_shape)) * it
    return {"fwd": o, "bwd": grads, "fwd+bwd": o + grads}[prob.pass_name]


def input_bytes(prob: Problem) -> int:
    """Bytes of the pass's inputs: q [B, H, Tq, D], k and v [B, H_kv, Tk, D]; a backward's output gradient too."""
    n = math.prod(prob.shape) + 2 * math.prod(prob.kv_shape) + (math.prod(prob.shape) if prob.pass_name != "fwd" else 0)
    return n * ITEMSIZE[prob.dtype]


def device_bytes() -> int:
    """The current device's memory in bytes (CUDA's total, not what is free now)."""
    import cupy

    return int(cupy.cuda.Device().mem_info[1])


def needed_bytes(prob: Problem) -> int:
    """The least device memory a row of ``prob`` takes: its inputs and the pass's outputs, nothing an implementation
    adds (``peak_mem_mb``)."""
    return input_bytes(prob) + output_bytes(prob)


class PeakWindow:
    """The most a meter saw allocated above its level at ``begin`` until ``end``, with what happens
    inside ``aside()`` left out. ``begin`` calls the meter's ``fresh`` first (when it has one)."""

    def __init__(self, meter):
        self.meter = meter
        self.open = False
        self.bytes: int | None = None  # set by end()

    def begin(self) -> None:
        m = self.meter
        getattr(m, "fresh", lambda: None)()
        m.start()
        self.open = True
        self.base = m.used()
        self.kept = 0  # bytes allocated inside aside() and still held
        m.reset_peak()
        self.top = self.base

    def aside(self):
        """A context whose allocations are not the implementation's (the reference)."""
        import contextlib

        @contextlib.contextmanager
        def cm():
            if not self.open:
                yield
                return
            m = self.meter
            self.top = max(self.top, m.peak() - self.kept)
            before = m.used()
            try:
                yield
            finally:
                self.kept += m.used() - before
                m.reset_peak()
        return cm()

    def end(self) -> int:
        """Closes the window (once; later calls give the same): the bytes above the level at begin."""
        if self.open:
            m = self.meter
            try:
                self.top = max(self.top, m.peak() - self.kept)
            finally:
                self.open = False
                m.stop()
            self.bytes = self.top - self.base
        return self.bytes if self.bytes is not None else 0

    def mib(self, prob: Problem) -> float:
        """``peak_mem_mb``: the window's bytes less the pass's outputs, in MiB (3 decimals), at least 0."""
        return round(max(0, self.end() - output_bytes(prob)) / MIB, 3)


class MeteredRunner:
    """A runner whose next ``run`` closes ``window`` right after it (the gate's run): the gate's own
    work after the run (conversions, norms) is not the implementation's. Everything else is the
    runner's."""

    def __init__(self, runner, window: PeakWindow):
        self._runner = runner
        self._window = window

    def run(self) -> None:
        try:
            self._runner.run()
        finally:
            self._window.end()

    def __getattr__(self, name):
        return getattr(self._runner, name)


class DeviceMemory:
    """CuPy's default pool and, once torch has initialised CUDA, torch's caching allocator (the module
    docstring says what is counted)."""

    def __init__(self):
        import cupy

        self.pool = cupy.get_default_memory_pool()
        self._peak = 0
        self._saved = None

    def _malloc(self, size: int):
        mem = self.pool.malloc(size)
        used = self.pool.used_bytes()
        if used > self._peak:
            self._peak = used
        return mem

    def start(self) -> None:
        import cupy

        self._saved = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(self._malloc)

    def stop(self) -> None:
        import cupy

        if self._saved is not None:
            cupy.cuda.set_allocator(self._saved)
            self._saved = None

    @staticmethod
    def _torch():
        torch = sys.modules.get("torch")
        if torch is not None and getattr(torch, "cuda", None) is not None and torch.cuda.is_initialized():
            return torch
        return None

    def used(self) -> int:
        torch = self._torch()
        return self.pool.used_bytes() + (torch.cuda.memory_allocated() if torch else 0)

    def reset_peak(self) -> None:
        self._peak = self.pool.used_bytes()
        torch = self._torch()
        if torch:
            torch.cuda.reset_peak_memory_stats()

    def peak(self) -> int:
        # torch initialised inside the window: its peak since then is the window's
        torch = self._torch()
        return self._peak + (torch.cuda.max_memory_allocated() if torch else 0)

    def fresh(self) -> None:
        """Device tile lists cached by earlier rows (attnbench.tiles) dropped: the row that needs one
        builds (and counts) its own. Runners that hold one keep it."""
        from .tiles import drop_device_copies

        drop_device_copies()


__all__ = ["DeviceMemory", "MeteredRunner", "PeakWindow", "output_bytes", "MIB"]
