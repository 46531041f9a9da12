"""The correctness gate (SPEC section 4): fresh random inputs, poisoned output, float64
reference, ||out - ref|| / ||ref|| within the dtype's tolerance; NaN or Inf never passes."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from .arrays import random_inputs, to_float32
from .impls import Impl, Problem, Runner
from .reference import reference, rel_error

_seeds = itertools.count(1)


@dataclass
class GateResult:
    ok: bool
    rel_err: float
    tolerance: float
    reason: str = ""


def judge(impl: Impl, prob: Problem, runner: Runner, q, k, v, ref=None) -> GateResult:
    """Poison the runner's output, run once, compare with the float64 reference (computed
    here unless the caller passes the one of these inputs)."""
    if prob.pass_name != "fwd":  # gradients have no gate yet (issue 18 item 4): none can pass unchecked
        return GateResult(False, math.nan, impl.tolerance(prob),
                          f"no gate for pass={prob.pass_name} yet (its reference: reference.reference_backward)")
    runner.poison()
    runner.run()
    out = runner.out
    if tuple(out.shape) != prob.shape:
        return GateResult(False, math.nan, impl.tolerance(prob), f"output shape {tuple(out.shape)} != {prob.shape}")
    if ref is None:
        ref = reference_of(prob, q, k, v)
    err = rel_error(to_float32(out, prob.dtype), ref)
    tol = impl.tolerance(prob)
    if math.isnan(err):
        return GateResult(False, err, tol, "output holds NaN or Inf (unwritten or overflowed elements)")
    if err > tol:
        return GateResult(False, err, tol, f"relative error {err:.3g} above tolerance {tol:g}")
    return GateResult(True, err, tol)


def reference_of(prob: Problem, q, k, v):
    """The float64 reference of a problem on these inputs."""
    return reference(q, k, v, prob.mask, prob.dtype, prob.softmax_scale, cache_lens=prob.cache_lens)


def problem_inputs(prob: Problem, seed: int, make=None):
    """q, k, v of ``prob`` from ``make(shape, dtype, seed)`` (three arrays of one shape): one call
    when q and k have one shape (prefill with H_kv = H: the inputs of before), else k and v from
    one call at their shape and q from another at its own."""
    make = make or random_inputs
    if prob.shape == prob.kv_shape:
        return make(prob.shape, prob.dtype, seed)
    _, k, v = make(prob.kv_shape, prob.dtype, seed)
    q = make(prob.shape, prob.dtype, seed + 1)[0]
    return q, k, v


def gate(impl: Impl, prob: Problem, seed: int | None = None) -> GateResult:
    """Check ``impl`` on fresh random inputs of ``prob`` against the float64 reference."""
    q, k, v = problem_inputs(prob, next(_seeds) if seed is None else seed)
    runner = impl.prepare(prob, q, k, v)
    return judge(impl, prob, runner, q, k, v)
