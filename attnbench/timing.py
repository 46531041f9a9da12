"""Timing with CUDA events (SPEC section 4)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    samples: int


def time_runner(runner, min_samples: int = 10, budget_s: float = 2.0) -> Timing:
    import cupy

    runner.run()  # warm-up
    cupy.cuda.get_current_stream().synchronize()
    ts = []
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    spent = 0.0
    while len(ts) < min_samples and spent < budget_s * 1e3:
        start.record()
        runner.run()
        stop.record()
        stop.synchronize()
        ts.append(cupy.cuda.get_elapsed_time(start, stop))
        spent += ts[-1]
    a = np.asarray(ts)
    return Timing(float(np.median(a)), float(np.percentile(a, 20)), float(np.percentile(a, 80)), len(a))
