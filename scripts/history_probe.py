"""Which part of a sweep's earlier case moves the next case's time (GPU; a development probe, one process a run).

    python scripts/history_probe.py --before sweep --then sweep [--pattern dense --B 8 --T 32768 --Tq 1
        --B-before 1 --impl fast-decode] --out history.csv

In a sweep that times fast-decode alone, the dense decode at B=8, T=32768 took 288-291 us after the B=1 case and
256-262 us as the first case (docs/PERF.md, "A row's time and what the process timed before it"). This process
makes the sweep's device context (peaks measured, the event timer, the memory meter), does ``--before`` with the
case at ``--B-before``, then times the case at ``--B`` the ``--then`` way, and appends one row to ``--out``:
- ``--before``: ``none``; ``sweep`` (the sweep's own ``run_case``: inputs, prepare inside the meter's window, the
  float64 reference, the gate, the timing, the cleanup); ``sweep-nometer`` (the same without the memory meter);
  ``gate`` (inputs, prepare, the reference and the gate, no timing); ``time`` (inputs, prepare and the sweep's
  timing, no gate); ``prepare`` (inputs and prepare, five runs); ``ref`` (inputs and the float64 reference alone);
- ``--then``: ``sweep`` (``run_case``, the row's median) or ``probe`` (inputs, prepare, the median of 20 samples
  of the sweep's timer, no gate and no meter).
Then, on the same K and V (kept), the timer's median of one read of each (``kernels/bandwidth.cu``) and of the
implementation prepared again on them: where the slow time stays with the arrays, their memory is what differs.
With ``--then sweep`` and fast-decode, ``--parts FILE`` also writes the sweep's own runner (kept) against the one
prepared again: each one's split launch alone, merge launch alone and both, and the new runner with one of the kept
runner's device buffers (q, the partials, the list heads, the list, the lengths, the output, ...) in place of its
own, a row each: where one buffer carries the slow time, its place is what differs.
``--series FILE`` appends every sample the sweep's timer takes from the second case on, with its wall time: the
case's own, then three more timings of the kept runner by the same timer, then a new timer's.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

BEFORE = ("none", "sweep", "sweep-nometer", "gate", "time", "prepare", "ref")
THEN = ("sweep", "probe")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", choices=BEFORE, required=True)
    ap.add_argument("--then", choices=THEN, required=True)
    ap.add_argument("--pattern", default="dense")
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--B-before", type=int, default=1)
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--Tq", type=int, default=1)
    ap.add_argument("--impl", default="fast-decode")
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", help="CSV the runners' parts are appended to (--then sweep)")
    ap.add_argument("--settle-s", type=float, default=None,
                    help="the pause between the gate and the timing (default: the sweep's; 0: none)")
    ap.add_argument("--series", help="CSV every sample of the second case on is appended to (--then sweep)")
    a = ap.parse_args(argv)

    import pandas as pd

    from attnbench import sweep as sw
    from attnbench.check import judge, problem_inputs, reference_of
    from attnbench.impls import Problem

    ctx = sw.device_context(command="history_probe")
    made = []  # every input call's arrays, the last case's kept to the end

    def inputs(shape, dtype, seed, keep="qkv"):
        arrays = sw._device_inputs(shape, dtype, seed, keep)
        made.append(arrays)
        return arrays

    ctx.inputs = inputs
    runners = []  # every runner the implementation prepares, the sweep's kept past its case
    if a.before == "sweep-nometer":
        ctx.memory = None
    if a.settle_s is not None:
        ctx.settle = (lambda: time.sleep(a.settle_s)) if a.settle_s > 0 else None
    impls = sw.select_impls([a.impl])
    impl = impls[0]
    prepare = impl.prepare

    def keeping(*args, **kw):
        r = prepare(*args, **kw)
        runners.append(r)
        return r

    object.__setattr__(impl, "prepare", keeping)

    def case(B):
        cases = [c for c in sw.plan("decode", patterns=(a.pattern,), T=(a.T,), B=(B,), Tq=(a.Tq,))
                 if c.cache_lens is None]
        assert len(cases) == 1, cases
        return cases[0]

    def problem(c):
        from attnbench.patterns import make_mask

        mask = make_mask(c.inst.pattern, c.T, c.inst.causal, **c.inst.param_dict)
        return Problem(mask, c.B, c.H, c.D, c.dtype, H_kv=c.H_kv, Tq=c.Tq)

    def prepared(c):
        prob = problem(c)
        q, k, v = problem_inputs(prob, sw.case_seed(c, ctx.seed), inputs)
        return prob, (q, k, v), impl.prepare(prob, q, k, v)

    first = case(a.B_before)
    if a.before in ("sweep", "sweep-nometer"):
        sw.run_case(first, impls, ctx)
    elif a.before == "ref":
        prob = problem(first)
        reference_of(prob, *problem_inputs(prob, sw.case_seed(first, ctx.seed), inputs))
        del prob
        ctx.cleanup()
    elif a.before != "none":
        prob, qkv, runner = prepared(first)
        if a.before == "gate":
            g = judge(impl, prob, runner, *qkv, reference_of(prob, *qkv))
            assert g.ok, g
        elif a.before == "time":
            ctx.time({impl.name: runner.run}, **ctx.timing_options())
        else:
            for _ in range(5):
                runner.run()
        del prob, qkv, runner
        ctx.cleanup()

    second = case(a.B)
    made.clear()
    runners.clear()
    series, phase = [], ["sweep"]
    timer0 = ctx.time.__self__  # the sweep's EventTimer
    sample0 = timer0.sample

    def logged(fn, hold_us=None):
        ms = sample0(fn, hold_us)
        series.append(dict(phase=phase[0], wall_s=round(time.perf_counter(), 6), ms=ms))
        return ms

    if a.series:
        timer0.sample = logged
    if a.then == "sweep":
        (row,) = sw.run_case(second, impls, ctx)
        assert row["status"] == "ok", row
        us = 1e3 * row["median_ms"]
        if a.series:
            for n in range(3):
                phase[0] = f"the sweep's timer again ({n + 1})"
                ctx.time({impl.name: runners[0].run}, **ctx.timing_options())
            from attnbench.timing import EventTimer

            fresh = EventTimer()
            phase[0] = "a new timer"
            for _ in range(13):
                t = fresh.sample(runners[0].run)
                series.append(dict(phase=phase[0], wall_s=round(time.perf_counter(), 6), ms=t))
            t0 = series[0]["wall_s"]
            rows = [dict(before=a.before, round_start=t0, **r, since_s=round(r["wall_s"] - t0, 6)) for r in series]
            pd.DataFrame(rows).to_csv(a.series, mode="a", header=not os.path.exists(a.series), index=False)
    else:
        from attnbench.timing import EventTimer

        timer = EventTimer()
        _, qkv, runner = prepared(second)
        runner.run()
        us = 1e3 * statistics.median(timer.sample(runner.run) for _ in range(20))
        del runner
    # the same K and V again: a read of each, and the implementation prepared anew on them
    import cupy

    from attnbench.timing import EventTimer, read_kernel

    timer = EventTimer()
    prob = problem(second)
    q = made[-1][0] if len(made) > 1 else made[0][0]
    _, k, v = made[0]

    def median_us(fn):
        fn()
        return 1e3 * statistics.median(timer.sample(fn) for _ in range(20))

    read_k = median_us(read_kernel(k.view(cupy.float32).ravel()))
    read_v = median_us(read_kernel(v.view(cupy.float32).ravel()))
    again = median_us(impl.prepare(prob, q, k, v).run)
    out = dict(before=a.before, then=a.then, settle_s=a.settle_s, pattern=a.pattern, B=a.B, B_before=a.B_before,
               T=a.T, Tq=a.Tq, impl=a.impl, median_us=round(us, 2), read_k_us=round(read_k, 2), read_v_us=round(read_v, 2),
               again_us=round(again, 2), k_ptr=hex(k.data.ptr), v_ptr=hex(v.data.ptr),
               git_commit=ctx.provenance.get("git_commit"))
    print(" ".join(f"{k}={v}" for k, v in out.items()), flush=True)
    pd.DataFrame([out]).to_csv(a.out, mode="a", header=not os.path.exists(a.out), index=False)
    if a.parts and a.then == "sweep":
        kept, new = runners[0], runners[-1]
        rows = [dict(out, runner=name, part=part, part_us=round(us, 2))
                for name, r in (("sweep", kept), ("again", new)) for part, us in parts(r, median_us).items()]
        # the new runner with one of the kept runner's buffers: the split launch's arguments, then the merge's
        names = {0: "q", 3: "partials_o", 4: "partials_lse", 5: "heads", 6: "list", 7: "lens", 8: "list_of",
                 15: "table", 16: "out", 17: "tickets"}
        for i, name in names.items():
            hybrid = impl.prepare(prob, q, k, v)
            own = hybrid._args[i]
            hybrid._args = tuple(kept._args[i] if j == i else x for j, x in enumerate(hybrid._args))
            # the merge reads the same partials and writes the same output
            hybrid._merge_args = tuple(kept._args[i] if x is own else x for x in hybrid._merge_args)
            rows.append(dict(out, runner=f"again with the sweep's {name}", part="both",
                             part_us=round(median_us(hybrid.run), 2)))
        pd.DataFrame(rows).to_csv(a.parts, mode="a", header=not os.path.exists(a.parts), index=False)
        for r in rows:
            print(f"{r['runner']:32s} {r['part']:6s} {r['part_us']:8.2f} us", flush=True)
    return 0


def parts(r, median_us) -> dict:
    """The timer's median of a decode runner's split launch, merge launch (where it has one) and both."""
    split = lambda: r._split(r._grid, (r._threads,), r._args, shared_mem=r._smem)  # noqa: E731
    got = {"split": median_us(split)}
    if r._merge is not None:
        got["merge"] = median_us(lambda: r._merge(r._merge_grid, r._merge_block, r._merge_args))
    got["both"] = median_us(r.run)
    return got


if __name__ == "__main__":
    sys.exit(main())
