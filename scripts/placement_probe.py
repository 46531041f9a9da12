"""Whether a decode row's time depends on where its key/value cache lies in device memory (GPU; no gate, no CSV
of the sweep's kind: a development probe).

    python scripts/placement_probe.py --pattern dense --B 8 --T 32768 --Tq 1 [--pads 0,2,64,130,514]
        [--rounds 3] [--samples 20] [--impl fast-decode] --out probe.csv

One process. Each round runs every variant once, in turn; before each, CuPy's pool gives back all it holds:
- ``fresh``: the case's inputs allocated first, as a sweep's first case has them;
- ``pad=P``: P MiB allocated and kept before the inputs, which moves them P MiB further on;
- ``after-b1``: the same case at B=1 prepared, run five times and let go first (a sweep's B=1 case before);
- ``swap``: the inputs made as ``fresh``, with the two arrays handed over the other way round (V where K was).
For each: the implementation's median over ``--samples`` (the sweep's timer: L2 flushed, a hold before the
launch), and the same timer's median of one read of K and of V alone (``kernels/bandwidth.cu``), with the arrays'
device addresses. Where the read moves with the variant as the implementation's time does, the placement of the
bytes is what moved; where the read stays and the implementation moves, something else did.
"""
from __future__ import annotations

import argparse
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pattern", default="dense")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--Tq", type=int, default=1)
    ap.add_argument("--H", type=int, default=32)
    ap.add_argument("--H-kv", type=int, default=8)
    ap.add_argument("--D", type=int, default=128)
    ap.add_argument("--impl", default="fast-decode")
    ap.add_argument("--pads", default="0,2,64,130,514", help="MiB kept before the inputs, comma separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--samples", type=int, default=20)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)

    import cupy
    import pandas as pd

    from attnbench.check import problem_inputs
    from attnbench.impls import Problem, get_impl
    from attnbench.patterns import make_mask
    from attnbench.timing import EventTimer, read_kernel

    impl = get_impl(a.impl)
    mask = make_mask(a.pattern, a.T, True)
    pool = cupy.get_default_memory_pool()
    timer = EventTimer()

    def problem(B):
        return Problem(mask, B, a.H, a.D, "bfloat16", H_kv=a.H_kv, Tq=a.Tq)

    def median_us(fn):
        fn()
        return 1e3 * statistics.median(timer.sample(fn) for _ in range(a.samples))

    def inputs(B):
        return problem_inputs(problem(B), 1234 + B)

    def one(variant: str, pad_mib: int = 0) -> dict:
        pool.free_all_blocks()
        pad = cupy.empty(pad_mib << 20, dtype=cupy.uint8) if pad_mib else None
        if variant == "after-b1":
            q1, k1, v1 = inputs(1)
            r1 = impl.prepare(problem(1), q1, k1, v1)
            for _ in range(5):
                r1.run()
            cupy.cuda.runtime.deviceSynchronize()
            del q1, k1, v1, r1
            pool.free_all_blocks()
        q, k, v = inputs(a.B)
        if variant == "swap":
            k, v = v, k
        runner = impl.prepare(problem(a.B), q, k, v)
        row = dict(variant=variant, pad_mib=pad_mib, k_ptr=hex(k.data.ptr), v_ptr=hex(v.data.ptr),
                   impl_us=median_us(runner.run),
                   read_k_us=median_us(read_kernel(k.view(cupy.float32).ravel())),
                   read_v_us=median_us(read_kernel(v.view(cupy.float32).ravel())))
        del q, k, v, runner, pad
        pool.free_all_blocks()
        return row

    variants = [("fresh", 0)] + [("pad", int(p)) for p in a.pads.split(",") if int(p)] + [("after-b1", 0), ("swap", 0)]
    rows = []
    for r in range(a.rounds):
        for name, pad in variants:
            row = one(name, pad)
            row["round"] = r + 1
            rows.append(row)
            print(f"round {r + 1} {name:9s} pad {pad:4d} MiB  {a.impl} {row['impl_us']:8.1f} us  "
                  f"read K {row['read_k_us']:6.1f} us  V {row['read_v_us']:6.1f} us  K at {row['k_ptr']}",
                  flush=True)
    pd.DataFrame(rows).to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
