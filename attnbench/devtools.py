"""The work of the development commands: ``attnbench profile`` (one launch of one case for a
profiler) and ``attnbench tiles`` (tile-list build times). Timing of implementations against each
other is the sweep's (``attnbench sweep --samples N --tile-config SPEC``), not done here.
"""
from __future__ import annotations

import os
import platform
import statistics
from typing import Callable

from .check import GateResult, grad_inputs, judge, problem_inputs
from .configs import get_config
from .errors import BadInput
from .impls import Impl, Problem
from .patterns import pattern_label

PROFILE_RANGE = "profile"  # the outer NVTX range; the implementation's name is the range inside it


def nvtx_module():
    """CuPy's NVTX bindings (``cupy.cuda.nvtx``), or BadInput saying why there are none."""
    try:
        from cupy.cuda import nvtx
    except ImportError as e:
        raise BadInput(f"profile needs NVTX ranges through cupy.cuda.nvtx, which cannot be imported: {e}") from None
    if not getattr(nvtx, "available", True):
        raise BadInput("profile needs NVTX ranges: cupy.cuda.nvtx is not available in this CuPy build "
                       "(no NVTX library found)")
    return nvtx


def _synchronize() -> None:
    import cupy

    cupy.cuda.runtime.deviceSynchronize()


def _device_inputs(shape, dtype, seed, keep="qkv"):
    from .arrays import random_inputs

    return random_inputs(shape, dtype, seed, keep=keep)


def profile_launch(impl: Impl, prob: Problem, seed: int = 1, *, inputs: Callable = _device_inputs,
                   nvtx=None, synchronize: Callable[[], None] = _synchronize) -> tuple[GateResult, dict]:
    """Prepare ``impl`` on random inputs of ``prob`` (a backward pass: and the output's gradient), gate
    it (one run) and, when it passes, run a warm-up, then one run (its launches) inside the NVTX range ``profile`` / ``<impl name>``, for
    ``ncu --nvtx --nvtx-include "profile/"``. Returns the gate's result and the runner's setup.
    BadInput before anything runs when the implementation cannot run the problem here or there is
    no NVTX."""
    impl.require(prob)
    nvtx = nvtx if nvtx is not None else nvtx_module()
    q, k, v = problem_inputs(prob, seed, inputs)  # (k and v at H_kv heads where it is smaller)
    grad = grad_inputs(prob, seed, inputs)  # a backward pass: the output's gradient
    runner = impl.prepare(prob, q, k, v, **grad)
    res = judge(impl, prob, runner, q, k, v, **grad)
    if not res.ok:
        return res, dict(getattr(runner, "setup", {}) or {})
    runner.run()  # warm-up
    synchronize()
    nvtx.RangePush(PROFILE_RANGE)
    nvtx.RangePush(impl.name)
    try:
        runner.run()
        synchronize()
    finally:
        nvtx.RangePop()
        nvtx.RangePop()
    return res, dict(getattr(runner, "setup", {}) or {})


# -- tile-list build times --------------------------------------------------------------------------

MAX_TILES_T = 2 ** 29 - 1  # the tile-list build's int32 keys (attnbench.tiles.build)


def tile_options(config: str, T: int, Ds=(), repeat: int = 1) -> list[int]:
    """``attnbench tiles``' options checked (BadInput naming the option and the limit); the head
    dimensions to build lists for: those given, else the config's, each one fast-tc has tile
    shapes for."""
    from .fwd_config import CONFIGS as SHAPED

    if not 1 <= T <= MAX_TILES_T:
        raise BadInput(f"--T={T} must be from 1 to {MAX_TILES_T} (the build's int32 keys)")
    if repeat < 1:
        raise BadInput(f"--repeat={repeat} must be a positive integer")
    dims = list(dict.fromkeys(Ds or get_config(config).D))
    for D in dims:
        if D not in SHAPED:
            src = "--D" if Ds else f"the {config} config's D"
            raise BadInput(f"{src}={D}: fast-tc has tile shapes for D in {', '.join(map(str, sorted(SHAPED)))}")
    return dims


def tile_build_times(config: str = "llm", T: int = 131072, Ds=(), repeat: int = 15, device: bool = False,
                     wgmma: bool | None = None, report: Callable[[dict], None] | None = None,
                     skip: Callable[[str, str], None] | None = None) -> list[dict]:
    """One row per (pattern instance of ``config``, D): the shape fast-tc takes (``wgmma`` None: as
    the device says, mma.sync without one), the list's size, and its host build (``tiles.build``,
    afresh ``repeat`` times: first, median, min, ms); with ``device`` its expansion on the GPU
    (median, min, ms); and the transposed list of each host build (the backward's: ``tiles.transpose``;
    median and max, ms); with a pattern's own device build (``Pattern.device_tiles``) its time and
    pieces, and ``launch_floor_ms``, the least one launch and its wait cost from Python here
    (``timing.launch_floor_s``). ``report(row)`` as each row is done; ``skip(label, reason)`` for an instance
    that does not fit at T (a block that does not divide it)."""
    from .fwd_config import choose_config
    from .fast_tc import IMPL
    from .tiles import DeviceTiles, build, transpose

    dims = tile_options(config, T, tuple(Ds), repeat)
    if wgmma is None:
        wgmma = device and IMPL.uses_wgmma()
    extra = {}
    if device:
        from .results import provenance
        from .timing import launch_floor_s

        prov = provenance()
        extra = dict(gpu=prov["gpu"], git_commit=prov["git_commit"], launch_floor_ms=launch_floor_s() * 1e3)
    rows = []
    for inst in get_config(config).instances:
        try:
            mask = inst.mask(T)
        except BadInput as e:
            if skip:
                skip(pattern_label(inst.pattern, inst.param_dict), str(e))
            continue
        for D in dims:
            cfg = choose_config(mask, D, wgmma)
            inner = mask.strided()[1]
            host = [build(inner, cfg.BM, cfg.BN, fresh=True) for _ in range(repeat)]
            hs = [t.build_s * 1e3 for t in host]
            nk = -(-inner.T // cfg.BN)
            ts = [transpose(t, nk) for t in host]  # the backward's list, from each forward one
            tts = [t.build_s * 1e3 for t in ts]
            row = dict(pattern=mask.label(), causal=inst.causal, T=T, D=D, BM=cfg.BM, BN=cfg.BN,
                       tile_config=cfg.spec, entries=host[0].n_visited, partial=host[0].n_partial,
                       runs=int(host[0].run_off.size), host_first_ms=hs[0], host_median_ms=statistics.median(hs),
                       host_min_ms=min(hs), transposed_runs=int(ts[0].run_off.size),
                       transposed_median_ms=statistics.median(tts), transposed_max_ms=max(tts), cpu=platform.processor() or platform.machine(), cpus=os.cpu_count())
            if device:
                DeviceTiles.expand(host[0])  # the first expansion compiles CuPy's kernels
                ds = [DeviceTiles.expand(t).build_s * 1e3 for t in host]
                row.update(device_median_ms=statistics.median(ds), device_min_ms=min(ds), **extra)
                if host[0].on_device is not None:  # the pattern's own build from its parameters
                    host[0].on_device()  # the first compiles its kernel
                    os_ = [host[0].on_device().build_s * 1e3 for _ in host]
                    row.update(own_device_median_ms=statistics.median(os_), own_device_min_ms=min(os_))
                    pieces = [{} for _ in host]  # where its time goes: each piece's median
                    for p in pieces:
                        inner.pattern.device_tiles(inner, cfg.BM, cfg.BN, parts=p)
                    row.update({f"own_{k[:-2]}_ms": statistics.median(p[k] for p in pieces) * 1e3
                                for k in pieces[0]})
            rows.append(row)
            if report:
                report(row)
    return rows


def tile_row_line(row: dict) -> str:
    """One row of ``attnbench tiles``' table."""
    line = (f"{row['pattern']:<68} {row['D']:>4} {str(row['BM']) + 'x' + str(row['BN']):>8} {row['entries']:>9} "
            f"{row['runs']:>7} "
            f"{row['host_first_ms']:>9.3f} {row['host_median_ms']:>9.3f} {row['host_min_ms']:>9.3f}"
            f" {row['transposed_median_ms']:>9.3f}")
    if "device_median_ms" in row:
        line += f" {row['device_median_ms']:>9.3f}"
        own = row.get("own_device_median_ms")
        line += f" {own:>9.3f}" if own is not None else f" {'-':>9}"
    return line


def tile_header(device: bool) -> str:
    line = (f"{'pattern':<68} {'D':>4} {'BMxBN':>8} {'entries':>9} {'runs':>7} "
            f"{'host 1st':>9} {'host med':>9} {'host min':>9} {'bwd med':>9}")
    return line + (f" {'dev med':>9} {'own dev':>9}" if device else "") + "   (ms)"


__all__ = ["profile_launch", "nvtx_module", "tile_build_times", "tile_options", "tile_row_line", "tile_header",
           "PROFILE_RANGE"]


# -- the least a timed sample measures ----------------------------------------------------------------

# a streaming decode's K and V at B=1 and B=8 (4+1024, D=128); 128 MiB: a dense cache of 32768 keys at B=1 (window 4096
# at B=8); 1 GiB: the same at B=8 (the decode configuration, H_kv=8, D=128)
FLOOR_READ_BYTES = (4 << 20, 32 << 20, 128 << 20, 1 << 30)
FLOOR_EMPTY = "one empty launch"  # the `what` of event_floor_rows' one-launch cases (scripts/decode_targets.py reads them)


FLOOR_EVICT = ", L2 evict-first"  # the `what` of a read under L2's evict-first policy: floor_read_name + this


def floor_read_name(nbytes: int) -> str:
    """The `what` of event_floor_rows' read of ``nbytes`` alone."""
    return f"read {nbytes >> 20} MiB"


def event_floor_rows(samples: int = 51) -> list[dict]:
    """What the timing protocol (``timing.EventTimer``: the L2 flushed, a blocking kernel, CUDA events
    around the launches) measures for launches that do next to nothing: one and two launches of a
    one-thread kernel that returns at once, and a read of FLOOR_READ_BYTES by kernels/bandwidth.cu
    alone and followed by such a launch (a split kernel and its merge), and alone with L2's evict-first policy (the
    protocol's flush leaves L2 full of written lines; a read that evicts its own lines first leaves them to be written
    back after it, as fast-decode's EVICT=1 does). No implementation's row can
    go below the matching one; a row per case, medians in ms, with the run's provenance."""
    import cupy

    from .results import now, provenance
    from .timing import EventTimer, empty_launch, read_kernel, summarize

    timer = EventTimer()
    launch = empty_launch()
    cases = [(FLOOR_EMPTY, 1, 0, launch), ("two empty launches", 2, 0, lambda: (launch(), launch()))]
    bufs = []
    for n in FLOOR_READ_BYTES:
        bufs.append(cupy.ones(n // 4, dtype=cupy.float32))
        read = read_kernel(bufs[-1])
        cases.append((floor_read_name(n), 1, n, read))
        cases.append((f"{floor_read_name(n)}, then an empty launch", 2, n, lambda read=read: (read(), launch())))
        cases.append((floor_read_name(n) + FLOOR_EVICT, 1, n, read_kernel(bufs[-1], evict_first=True)))
    prov = provenance()
    rows = []
    for what, launches, nbytes, fn in cases:
        for _ in range(3):  # loaded and warm
            fn()
        cupy.cuda.runtime.deviceSynchronize()
        t = summarize([timer.sample(fn) for _ in range(samples)])
        rows.append(dict(timestamp=now(), **prov, what=what, launches=launches, bytes=nbytes, median_ms=t.median_ms,
                         p20_ms=t.p20_ms, p80_ms=t.p80_ms, samples=t.samples))
    return rows


# attnbench floor's one-launch rows used: the empty launch and each read alone; the first two reads must be there (a
# floor file from before the longer reads has only those), the others are used where present, and so are the reads
# under L2's evict-first policy (files written since they were added)
READ_POINTS = (FLOOR_EMPTY,) + tuple(floor_read_name(n) for n in FLOOR_READ_BYTES)
READ_NEEDED = READ_POINTS[:3]
EVICT_POINTS = tuple(floor_read_name(n) + FLOOR_EVICT for n in FLOOR_READ_BYTES)


def read_time(floor_rows):
    """A function of bytes and milliseconds a byte past the last point (arrays) to the milliseconds one launch that
    reads them takes under the protocol, from ``attnbench floor``'s rows: linear between its one-launch points (at each
    size the faster of the plain read and, where the file has it, the read under L2's evict-first policy), past the
    last one its time plus the rest at the given rate. ValueError when a point is missing."""
    lacks = [c for c in ("what", "bytes", "median_ms") if c not in floor_rows]
    if lacks:
        raise ValueError(f"not attnbench floor's rows: no column {', '.join(lacks)}")
    plain = floor_rows[floor_rows["what"].isin(READ_POINTS)]
    if not set(READ_NEEDED) <= set(plain["what"]):
        raise ValueError(f"the floor rows lack one of {', '.join(READ_NEEDED)}")
    pts = floor_rows[floor_rows["what"].isin(READ_POINTS + EVICT_POINTS)].groupby("bytes")["median_ms"].min()
    import numpy as np

    b, ms = pts.index.to_numpy(float), pts.to_numpy(float)

    def at(nbytes, ms_per_byte):
        x = np.asarray(nbytes, float)
        return np.where(x <= b[-1], np.interp(x, b, ms), ms[-1] + (x - b[-1]) * np.asarray(ms_per_byte, float))
    return at
