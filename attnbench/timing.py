"""Timing protocol (SPEC section 4) and the machine's peaks (SPEC section 3).

* ``EventTimer``: CUDA events around one launch, the L2 flushed before every sample, the
  host's launch path hidden behind a short blocking kernel, held longer (and the sample taken
  again) for a run whose host path outlasts it (``next_hold_us``).
* ``time_interleaved``: warm-up, then round-robin samples over several runners until each
  one's relative spread (p80 - p20) / median is small or the time budget is spent.
* ``measure_peaks``: tensor-core matmul, float32 matmul without TF32, device copy.

The adaptive loop takes any ``sample(fn) -> ms`` callable, so its logic runs without a GPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

MIN_SAMPLES = 10
MAX_SAMPLES = 1000
TARGET_SPREAD = 0.05
WARMUP_RUNS = 3
DEFAULT_BUDGET_S = 2.0
# The pause between a configuration's gates and its timing. Right after a gate (in a process whose earlier case
# was gated too), an H200 ran fast-decode's 1 GB dense decode 12% slower in every sample of the row, and at full
# speed 50 ms later with the same runner and the same timer; a pause of 50 ms before the timing removed it in 4
# processes of 4, against 3 of 4 slow without one (docs/PERF.md, "A row's time and what the process timed before
# it"). Four times what was seen to be enough.
SETTLE_S = 0.2


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples: int
    hold_us: float | None = None  # the blocking kernel's hold the samples were taken behind (EventTimer)

    @property
    def spread(self) -> float:
        return relative_spread([self.p20_ms, self.p80_ms], self.median_ms)


def relative_spread(p20_p80, median: float) -> float:
    lo, hi = p20_p80
    return (hi - lo) / median if median > 0 else float("inf")


def summarize(samples_ms) -> Timing:
    a = np.asarray(samples_ms, dtype=np.float64)
    if a.size == 0:
        raise ValueError("no samples")
    p20, med, p80 = np.percentile(a, [20, 50, 80])
    return Timing(float(med), float(p20), float(p80), int(a.size))


def settled(samples_ms, min_samples: int, target: float) -> bool:
    if len(samples_ms) < min_samples:
        return False
    return summarize(samples_ms).spread <= target


def time_interleaved(runs: dict[str, Callable[[], None]], sample: Callable[[Callable[[], None]], float],
                     *, budget_s: float = DEFAULT_BUDGET_S, min_samples: int = MIN_SAMPLES,
                     max_samples: int = MAX_SAMPLES, target_spread: float = TARGET_SPREAD,
                     warmup: int = WARMUP_RUNS, clock: Callable[[], float] = time.perf_counter,
                     samples: int | None = None) -> dict[str, Timing | BaseException]:
    """Time several launches of the same configuration against each other.

    Each name gets ``warmup`` untimed calls, then rounds: one sample of every name still
    unsettled per round, so drifts of the machine land on all of them alike. Each round starts
    one name later than the last, so every name takes every place in a round (and follows every
    other name) about as often: in one A/B a fixed order gave identical builds of a decode kernel a
    place effect of several percent; a later A/B showed none under either order (docs/PERF.md
    "decode v12", "The timer's rotation, measured"). A name
    settles at ``min_samples`` samples with a relative spread <= ``target_spread``, or at
    ``max_samples``; once ``budget_s`` seconds of sampling have passed, the loop stops as
    soon as every name has ``min_samples``. An exception from one name ends that name
    (its value is the exception) and the others go on. ``samples``: exactly that many samples
    of each name instead (the budget and the spread are not looked at).
    """
    if samples is not None:
        if not 1 <= samples <= MAX_SAMPLES:
            raise ValueError(f"samples={samples} must be from 1 to {MAX_SAMPLES}")
        min_samples = max_samples = samples  # stops at the count, whatever the spread or the clock
    out: dict[str, Timing | BaseException] = {}
    taken: dict[str, list[float]] = {}
    for name, fn in runs.items():
        try:
            for _ in range(warmup):
                fn()
            taken[name] = []
        except Exception as e:  # noqa: BLE001 - one implementation's failure is a row, not a crash
            out[name] = e
    start = clock()
    active = list(taken)
    rnd = 0
    while active:
        over = clock() - start > budget_s
        turn = rnd % len(active)  # each round starts one name later
        rnd += 1
        for name in active[turn:] + active[:turn]:
            s = taken[name]
            if len(s) >= max_samples or settled(s, min_samples, target_spread) or (over and len(s) >= min_samples):
                active.remove(name)
                continue
            try:
                s.append(float(sample(runs[name])))
            except Exception as e:  # noqa: BLE001
                out[name] = e
                active.remove(name)
    for name, s in taken.items():
        if name not in out:
            out[name] = summarize(s)
    return {name: out[name] for name in runs}


# -- the GPU side ----------------------------------------------------------------------

class L2Flusher:
    """Writes a buffer of at least twice the device's L2 size, evicting what a launch left."""

    def __init__(self):
        import cupy

        l2 = int(cupy.cuda.Device().attributes["L2CacheSize"])
        self.nbytes = max(2 * l2, 1 << 20)
        self.buf = cupy.empty(self.nbytes // 4, dtype=cupy.int32)
        self._value = 0

    def flush(self) -> None:
        self._value ^= 1  # a different value each time, so no write is elided
        self.buf.fill(self._value)


_HOLD = r"""
extern "C" __global__ void attnbench_hold(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
HOLD_US = 500.0
# A sample counts only where the host issued the whole run within this share of the hold: the hold
# kernel cannot start before the host launched it, so every launch of the run was queued before the
# GPU left the hold, and no host time lies between the events. A run issued more slowly takes its
# sample again behind a longer hold (twice the host's time), up to HOLD_MAX_US.
HOLD_MARGIN = 0.8
HOLD_MAX_US = 200_000.0


class HostOutranHold(RuntimeError):
    """The host took longer to issue one run than the longest hold (HOLD_MAX_US)."""


def next_hold_us(hold_us: float, issued_us: float) -> float | None:
    """None where a run the host issued in ``issued_us`` was hidden by a hold of ``hold_us``; else
    the hold to take the sample again behind (at least twice both); HostOutranHold past HOLD_MAX_US."""
    if issued_us <= HOLD_MARGIN * hold_us:
        return None
    if hold_us >= HOLD_MAX_US:
        raise HostOutranHold(f"the host took {issued_us:.0f} us to issue one run, more than "
                             f"{HOLD_MARGIN:g} of the longest hold ({HOLD_MAX_US:.0f} us): its time would "
                             "include the host's")
    return min(HOLD_MAX_US, max(2 * hold_us, 2 * issued_us))


class EventTimer:
    """``sample(fn)``: flush the L2, then CUDA events around one launch on the current stream.

    Before the start event a one-thread kernel holds the stream for ``hold_us`` microseconds
    (a blocking kernel, as NVBench does): the host issues the launch while the GPU waits, so
    the time between the events is the GPU's and not the host's launch path (a torch.compile
    dispatch, a Python wrapper). The hold touches no memory, so the L2 stays flushed. Where the
    host took longer than the hold to issue a run (a compiled forward and its autograd backward
    can take a millisecond), that sample is dropped and taken again behind a longer hold
    (``next_hold_us``); ``time`` starts each name's later samples at the hold its last one needed and
    puts it in the name's Timing. The timer keeps no reference to a run after ``time`` returns."""

    def __init__(self, flush: bool = True, hold_us: float = HOLD_US):
        import cupy

        self._cupy = cupy
        self.flusher = L2Flusher() if flush else None
        self.hold = cupy.RawKernel(_HOLD, "attnbench_hold") if hold_us > 0 else None
        self.hold_us = float(hold_us)
        self.last_hold_us = self.hold_us  # the hold the last sample was taken behind
        self.start = cupy.cuda.Event()
        self.end = cupy.cuda.Event()

    def sample(self, fn: Callable[[], None], hold_us: float | None = None) -> float:
        """One sample of ``fn`` behind a hold of ``hold_us`` (default: the timer's), longer where the
        host's path needed it (``last_hold_us`` then says how long)."""
        stream = self._cupy.cuda.get_current_stream()
        hold = self.hold_us if hold_us is None else hold_us
        while True:
            if self.flusher is not None:
                self.flusher.flush()
            t0 = time.perf_counter()
            if self.hold is not None:
                self.hold((1,), (1,), (np.uint64(int(hold * 1e3)),))
            self.start.record(stream)
            fn()
            self.end.record(stream)
            issued_us = (time.perf_counter() - t0) * 1e6
            self.end.synchronize()
            ms = float(self._cupy.cuda.get_elapsed_time(self.start, self.end))
            longer = next_hold_us(hold, issued_us) if self.hold is not None else None
            if longer is None:
                self.last_hold_us = hold
                return ms
            hold = longer

    def time(self, runs: dict[str, Callable[[], None]], **kw) -> dict[str, Timing | BaseException]:
        holds: dict[str, float] = {}
        name_of = {id(fn): name for name, fn in runs.items()}

        def sample(fn):
            name = name_of[id(fn)]
            ms = self.sample(fn, holds.get(name))
            holds[name] = self.last_hold_us
            return ms

        out = time_interleaved(runs, sample, **kw)
        return {name: replace(t, hold_us=holds.get(name, self.hold_us)) if isinstance(t, Timing) else t
                for name, t in out.items()}


@dataclass(frozen=True)
class Peaks:
    """Measured ceilings of this GPU: TFLOP/s and TB/s."""
    tc_tflops: float     # float16 tensor-core matmul (stands for the 16-bit dtypes)
    f32_tflops: float    # float32 matmul, TF32 off
    copy_tbps: float     # device-to-device copy, read + write
    read_tbps: float = 0.0  # reading alone (kernels/bandwidth.cu); 0 when not measured

    def matrix_tflops(self, dtype: str) -> float:
        return self.f32_tflops if dtype == "float32" else self.tc_tflops

    @property
    def bytes_tbps(self) -> float:
        """The bandwidth of the bytes floor: the better of copy and read, so that a kernel that
        mostly reads cannot run faster than its floor."""
        return max(self.copy_tbps, self.read_tbps)


def empty_launch() -> Callable[[], None]:
    """A launch of a one-thread kernel that returns at once (the hold kernel, held 0 ns)."""
    import cupy

    kernel = cupy.RawKernel(_HOLD, "attnbench_hold")
    zero = np.uint64(0)
    return lambda: kernel((1,), (1,), (zero,))


def launch_floor_s(repeat: int = 51) -> float:
    """The median wall seconds of the least a one-launch GPU step costs from Python here: a kernel
    that returns at once (one argument) launched through CuPy, then the wait for it. What a list
    built in one launch (``attnbench tiles``' own device build) cannot go below."""
    import cupy

    launch, stream = empty_launch(), cupy.cuda.get_current_stream()
    launch()  # loaded before the clock
    stream.synchronize()
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        launch()
        stream.synchronize()
        out.append(time.perf_counter() - t0)
    return float(np.median(out))


def floor_ms(flops: float, bytes_floor: float, peak_tflops: float, peak_tbps: float) -> float:
    """max(useful FLOPs / matrix peak, bytes floor / bandwidth), in ms (SPEC section 3)."""
    return max(flops / (peak_tflops * 1e12), bytes_floor / (peak_tbps * 1e12)) * 1e3


def _best_ms(timer: EventTimer, fn, n: int = 10) -> float:
    for _ in range(2):
        fn()
    return min(timer.sample(fn) for _ in range(n))


def measure_peaks(matmul_n: int = 8192, f32_n: int = 4096, copy_bytes: int = 1 << 30) -> Peaks:
    """The fastest of a few samples of each ceiling (a peak is the best the chip reaches)."""
    import cupy
    from cupy._core import _routines_linalg as linalg

    timer = EventTimer(flush=False)
    a = cupy.random.standard_normal((matmul_n, matmul_n), dtype=cupy.float32).astype(cupy.float16)
    b = a.T.copy()
    c = cupy.empty_like(a)
    tc_ms = _best_ms(timer, lambda: cupy.matmul(a, b, out=c))
    a = b = c = None  # the buffers go back before the next ceiling (the lambdas hold the names, not the arrays)

    f32 = np.dtype(np.float32)
    old = linalg.get_compute_type(f32)
    linalg.set_compute_type(f32, linalg.COMPUTE_TYPE_PEDANTIC)  # plain FP32, no TF32
    try:
        a = cupy.random.standard_normal((f32_n, f32_n), dtype=cupy.float32)
        b = a.T.copy()
        c = cupy.empty_like(a)
        f32_ms = _best_ms(timer, lambda: cupy.matmul(a, b, out=c))
        a = b = c = None
    finally:
        linalg.set_compute_type(f32, old)

    src = cupy.ones(copy_bytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    copy_ms = _best_ms(timer, lambda: dst.data.copy_from_device_async(src.data, copy_bytes))
    dst = None
    read_ms = _best_ms(timer, read_kernel(src))
    src = None
    cupy.get_default_memory_pool().free_all_blocks()
    return Peaks(tc_tflops=2 * matmul_n ** 3 / (tc_ms * 1e-3) / 1e12,
                 f32_tflops=2 * f32_n ** 3 / (f32_ms * 1e-3) / 1e12,
                 copy_tbps=2 * copy_bytes / (copy_ms * 1e-3) / 1e12,
                 read_tbps=copy_bytes / (read_ms * 1e-3) / 1e12)


def read_kernel(src, blocks_per_sm: int = 8, threads: int = 256, evict_first: bool = False):
    """A launch of kernels/bandwidth.cu's read_sum over ``src`` (float32, a multiple of 4); with ``evict_first``
    read_sum_evict_first (the same reads under L2's evict-first policy)."""
    import cupy

    from .compile import get_module

    fn = get_module("bandwidth", {}).get_function("read_sum_evict_first" if evict_first else "read_sum")
    sink = cupy.zeros(1, dtype=cupy.float32)
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    args = (src, np.int64(src.size // 4), sink)
    return lambda: fn((sms * blocks_per_sm,), (threads,), args)


def standard_builds() -> list[tuple[str, dict]]:
    return [("bandwidth", {})]
