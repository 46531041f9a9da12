"""The correctness gate (SPEC section 4): fresh random inputs, poisoned outputs, float64
reference, ||out - ref|| / ||ref|| within the dtype's tolerance; NaN or Inf never passes.

A backward pass (``bwd``, ``fwd+bwd``) is gated on its gradients: a fresh random output gradient
``do``, the runner prepared with it, its output and gradients poisoned, one run, then dQ, dK and
dV (and for a training step the output too) each against ``reference.reference_gradients``
(a gradient that is zero by the pattern against the three gradients' joint norm: ``ZERO_BY_PATTERN``)."""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from .arrays import STORAGE, random_inputs, to_float32
from .impls import Impl, Problem, Runner
from .reference import reference, reference_gradients, rel_error

_seeds = itertools.count(1)
# A gradient whose float64 reference is below this share of the three gradients' joint norm is zero
# by the pattern (every row with a single allowed key, as at T = 1 or a window of 1: dS = P (dP -
# delta) vanishes): its error is taken against that joint norm, not against its own (rounding noise)
ZERO_BY_PATTERN = 1e-12
# the output gradient's seed, apart from the seeds of q, k and v (seed and seed + 1)
DO_SEED_OFFSET = 0x2545F491
GRADS = ("dq", "dk", "dv")


@dataclass
class GateResult:
    ok: bool
    rel_err: float
    tolerance: float
    reason: str = ""
    errors: dict = field(default_factory=dict)  # a backward pass: each tensor's relative error, by name


def judge(impl: Impl, prob: Problem, runner: Runner, q, k, v, ref=None, do=None) -> GateResult:
    """Poison the runner's outputs, run once, compare with the float64 reference (computed here
    unless the caller passes the one of these inputs: ``reference_of``). A backward pass needs
    ``do``, the output gradient the runner was prepared with."""
    tol = impl.tolerance(prob)
    if prob.pass_name != "fwd":
        return _judge_backward(prob, runner, q, k, v, do, ref, tol)
    runner.poison()
    runner.run()
    out = runner.out
    if tuple(out.shape) != prob.shape:
        return GateResult(False, math.nan, tol, f"output shape {tuple(out.shape)} != {prob.shape}")
    if ref is None:
        ref = reference_of(prob, q, k, v)
    err = rel_error(to_float32(out, prob.dtype), ref)
    if math.isnan(err):
        return GateResult(False, err, tol, "output holds NaN or Inf (unwritten or overflowed elements)")
    if err > tol:
        return GateResult(False, err, tol, f"relative error {err:.3g} above tolerance {tol:g}")
    return GateResult(True, err, tol)


def _judge_backward(prob: Problem, runner: Runner, q, k, v, do, ref, tol: float) -> GateResult:
    """dq, dk, dv (and for ``fwd+bwd`` the output) each within ``tol``; the worst error is the
    result's; every tensor that fails is named in the reason."""
    if do is None:
        raise ValueError(f"the gate of pass={prob.pass_name} needs do, the output gradient the runner was "
                         "prepared with")
    runner.poison()
    runner.run()
    grads = tuple(runner.grads or (None, None, None))
    if len(grads) != 3:
        return GateResult(False, math.nan, tol, f"grads holds {len(grads)} arrays, not (dq, dk, dv)")
    got = dict(zip(GRADS, grads))
    if prob.pass_name == "fwd+bwd":
        got = {"out": runner.out, **got}
    shapes = {"out": prob.shape, "dq": prob.shape, "dk": prob.kv_shape, "dv": prob.kv_shape}
    errors, why, joint = {}, [], None
    for name, a in got.items():
        if a is None:
            why.append(f"{name} is missing (the runner gave none)")
            errors[name] = math.nan
            continue
        if tuple(a.shape) != shapes[name]:
            why.append(f"{name}: shape {tuple(a.shape)} != {shapes[name]}")
            errors[name] = math.nan
            continue
        if str(a.dtype) != STORAGE[prob.dtype]:
            why.append(f"{name}: dtype {a.dtype}, not the storage dtype {STORAGE[prob.dtype]} of {prob.dtype}")
            errors[name] = math.nan
            continue
        if ref is None:
            ref = reference_of(prob, q, k, v, do)
        if joint is None:
            joint = math.sqrt(sum(_norm(ref[n]) ** 2 for n in GRADS))
        zero = name in GRADS and _norm(ref[name]) <= ZERO_BY_PATTERN * joint
        errors[name] = err = rel_error(to_float32(a, prob.dtype), ref[name], joint if zero else None)
        if math.isnan(err):
            why.append(f"{name} holds NaN or Inf (unwritten or overflowed elements)")
        elif err > tol:
            why.append(f"{name}: relative error {err:.3g} above tolerance {tol:g}")
    worst = math.nan if any(math.isnan(e) for e in errors.values()) else max(errors.values())
    return GateResult(not why, worst, tol, "; ".join(why), errors)


def _norm(a) -> float:
    import numpy as np

    xp = np if isinstance(a, np.ndarray) else __import__("cupy")
    return float(xp.linalg.norm(a))


def reference_of(prob: Problem, q, k, v, do=None):
    """The float64 reference of a problem on these inputs: the output of a forward; for a backward
    pass (given ``do``) a dict of ``out``, ``dq``, ``dk``, ``dv`` (``reference_gradients``)."""
    if prob.pass_name != "fwd":
        return reference_gradients(q, k, v, do, prob.mask, prob.dtype, prob.softmax_scale)
    return reference(q, k, v, prob.mask, prob.dtype, prob.softmax_scale, cache_lens=prob.cache_lens)


def problem_inputs(prob: Problem, seed: int, make=None):
    """q, k, v of ``prob`` from ``make(shape, dtype, seed, keep=...)`` (q, k and v of one shape, those
    not named in ``keep`` drawn but not stored: None): one call when q and k have one shape (prefill
    with H_kv = H: the inputs of before), else k and v from one call at their shape and q from another
    at its own."""
    make = make or random_inputs
    if prob.shape == prob.kv_shape:
        return make(prob.shape, prob.dtype, seed)
    _, k, v = make(prob.kv_shape, prob.dtype, seed, keep="kv")
    q = make(prob.shape, prob.dtype, seed + 1, keep="q")[0]
    return q, k, v


def grad_inputs(prob: Problem, seed: int, make=None) -> dict:
    """The keywords a backward pass is prepared and judged with: ``do``, the output's gradient (q's
    shape and storage dtype, from its own seed); none for a forward."""
    if prob.pass_name == "fwd":
        return {}
    make = make or random_inputs
    return {"do": make(prob.shape, prob.dtype, (seed + DO_SEED_OFFSET) % 2 ** 31, keep="q")[0]}


def gate(impl: Impl, prob: Problem, seed: int | None = None) -> GateResult:
    """Check ``impl`` on fresh random inputs of ``prob`` against the float64 reference (a backward
    pass: with a fresh random output gradient)."""
    seed = next(_seeds) if seed is None else seed
    q, k, v = problem_inputs(prob, seed)
    grad = grad_inputs(prob, seed)
    runner = impl.prepare(prob, q, k, v, **grad)
    return judge(impl, prob, runner, q, k, v, **grad)
