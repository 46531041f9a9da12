"""Prepare one implementation on one llm-style case and launch it a few times, for Nsight Compute.

    ncu --nvtx --nvtx-include "profile/" --launch-skip 1 --launch-count 1 \
        python3 scripts/profile_case.py --impl fast-tc --pattern streaming --param sink=16 --param window=64

Inputs are random (B=1, H=16 unless told, bfloat16); nothing is timed or checked here: the
sweep does that.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", default="fast-tc")
    ap.add_argument("--pattern", default="streaming")
    ap.add_argument("--T", type=int, default=32768)
    ap.add_argument("--B", type=int, default=1)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--launches", type=int, default=4)
    ap.add_argument("--param", action="append", default=[], help="NAME=INT pattern parameter (repeatable)")
    args = ap.parse_args(argv)

    import cupy

    import attnbench  # noqa: F401  (registers every implementation)
    from attnbench.arrays import random_inputs
    from attnbench.impls import Problem, get_impl
    from attnbench.patterns import make_mask

    params = {k: int(v) for k, v in (p.split("=") for p in args.param)}
    mask = make_mask(args.pattern, args.T, not args.no_causal, **params)
    prob = Problem(mask, args.B, args.H, args.D, args.dtype)
    impl = get_impl(args.impl)
    impl.require(prob)
    q, k, v = random_inputs(prob.shape, prob.dtype, seed=1)
    runner = impl.prepare(prob, q, k, v)
    runner.run()
    cupy.cuda.runtime.deviceSynchronize()
    # ncu --nvtx --nvtx-include "profile/" sees these launches only, not the setup's
    cupy.cuda.nvtx.RangePush("profile")
    for _ in range(args.launches):
        runner.run()
    cupy.cuda.runtime.deviceSynchronize()
    cupy.cuda.nvtx.RangePop()
    print(f"{args.impl} {mask.label()} T={args.T} D={args.D}: {args.launches} launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
