"""The gradient gate (SPEC section 4 for the backward passes), without a GPU: fake implementations on
the host computing exact gradients (from reference_gradients) pass it; a wrong, unwritten, missing or
misshapen gradient fails it, named; the sweep gates and times backward rows with their own FLOPs and
floor, one reference per configuration; serving shapes refuse a backward."""
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import PEAKS, PROVENANCE, FakeImpl, FakeTimer, host_inputs  # noqa: E402

from attnbench import check  # noqa: E402
from attnbench import sweep as sw  # noqa: E402
from attnbench.check import gate, grad_inputs, judge, problem_inputs, reference_of  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.errors import BadInput  # noqa: E402
from attnbench.impls import PASSES, Problem  # noqa: E402
from attnbench.patterns import make_mask  # noqa: E402
from attnbench.reference import reference_backward, reference_forward  # noqa: E402

BACKWARD = ("bwd", "fwd+bwd")
CASES = [("dense", True, {}), ("window", True, {"window": 5}), ("block_diagonal", False, {"block": 8}),
         ("streaming", True, {"sink": 2, "window": 4}), ("bigbird", True, {"block": 4, "random_blocks": 1})]


def prob_of(pattern="window", causal=True, T=24, dtype="float32", pass_name="bwd", B=1, H=2, D=16, **params):
    params = params or {"window": 5} if pattern == "window" else params
    return Problem(make_mask(pattern, T, causal, **params), B, H, D, dtype, pass_name=pass_name)


def host_gate(impl, prob, seed=3):
    """``check.gate`` on host inputs (the fakes compute on numpy arrays)."""
    q, k, v = problem_inputs(prob, seed, host_inputs)
    grad = grad_inputs(prob, seed, host_inputs)
    return judge(impl, prob, impl.prepare(prob, q, k, v, **grad), q, k, v, **grad)


@pytest.mark.parametrize("pass_name", BACKWARD)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("pattern,causal,params", CASES, ids=[c[0] for c in CASES])
def test_exact_gradients_pass(pattern, causal, params, dtype, pass_name):
    prob = prob_of(pattern, causal, T=23 if pattern in ("dense", "window") else 24, dtype=dtype,
                   pass_name=pass_name, **params)
    res = host_gate(FakeImpl("exact", dtypes=(dtype,), passes=PASSES), prob)
    assert res.ok, res.reason
    names = ["out", "dq", "dk", "dv"] if pass_name == "fwd+bwd" else ["dq", "dk", "dv"]
    assert sorted(res.errors) == sorted(names)
    assert res.rel_err == max(res.errors.values()) <= res.tolerance == {"float32": 1e-5, "float16": 5e-3,
                                                                       "bfloat16": 1e-2}[dtype]


def test_a_wrong_dk_fails_naming_dk_alone():
    res = host_gate(FakeImpl("wrong-dk", passes=PASSES, grad_scale={"dk": 1.3}), prob_of())
    assert not res.ok
    assert res.reason == "dk: relative error 0.3 above tolerance 1e-05"
    assert res.rel_err == pytest.approx(0.3, rel=1e-4) == res.errors["dk"]
    assert res.errors["dq"] <= 1e-5 and res.errors["dv"] <= 1e-5


def test_an_unwritten_dv_is_caught_by_the_poison():
    res = host_gate(FakeImpl("lazy", passes=PASSES, unwritten=("dv",)), prob_of())
    assert not res.ok and math.isnan(res.rel_err)
    assert res.reason == "dv holds NaN or Inf (unwritten or overflowed elements)"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_poison_reaches_every_gradient(dtype):
    prob = prob_of(dtype=dtype)
    q, k, v = problem_inputs(prob, 1, host_inputs)
    runner = FakeImpl("a", dtypes=(dtype,), passes=PASSES).prepare(prob, q, k, v, **grad_inputs(prob, 1, host_inputs))
    runner.run()
    runner.poison()
    from attnbench.arrays import to_float32

    assert all(np.isnan(to_float32(g, dtype)).all() for g in runner.grads)
    assert np.isfinite(to_float32(runner.out, dtype)).all()  # bwd: the saved forward is never poisoned


def test_a_misshapen_gradient_fails_with_both_shapes():
    res = host_gate(FakeImpl("odd", passes=PASSES, grad_shapes={"dq": (1, 2, 24, 8)}), prob_of())
    assert not res.ok and math.isnan(res.rel_err)
    assert res.reason == "dq: shape (1, 2, 24, 8) != (1, 2, 24, 16)"


def test_a_gradient_in_another_dtype_fails():
    class Float32Grads(FakeImpl):
        def prepare(self, prob, q, k, v, do=None):
            runner = super().prepare(prob, q, k, v, do)
            runner._grads = tuple(np.zeros(a.shape, np.float32) for a in (q, k, v))
            return runner

    res = host_gate(Float32Grads("f32", dtypes=("float16",), passes=PASSES), prob_of(dtype="float16"))
    assert not res.ok and "dq: dtype float32, not the storage dtype float16 of float16" in res.reason


def test_missing_gradients_fail_naming_each():
    class NoGrads(FakeImpl):
        def prepare(self, prob, q, k, v, do=None):
            runner = super().prepare(prob, q, k, v, do)
            runner._grads = None
            return runner

    res = host_gate(NoGrads("none", passes=PASSES), prob_of())
    assert not res.ok and res.reason == ("dq is missing (the runner gave none); dk is missing (the runner gave none); "
                                         "dv is missing (the runner gave none)")


def test_a_training_step_checks_its_output_too():
    res = host_gate(FakeImpl("bad-out", passes=PASSES, factor=1.5, grad_scale={n: 1 / 1.5 for n in ("dq", "dk", "dv")}),
                    prob_of(pass_name="fwd+bwd"))
    assert not res.ok and res.reason == "out: relative error 0.5 above tolerance 1e-05"
    # the backward alone does not look at the output
    res = host_gate(FakeImpl("bad-out", passes=PASSES, factor=1.5, grad_scale={n: 1 / 1.5 for n in ("dq", "dk", "dv")}),
                    prob_of(pass_name="bwd"))
    assert res.ok, res.reason


def test_gate_draws_the_output_gradient_apart_from_the_inputs():
    prob = prob_of()
    q, k, v = problem_inputs(prob, 5, host_inputs)
    (do,) = grad_inputs(prob, 5, host_inputs).values()
    assert do.shape == q.shape and do.dtype == q.dtype
    assert not any(np.array_equal(do, a) for a in (q, k, v))
    assert grad_inputs(prob_of(pass_name="fwd"), 5, host_inputs) == {}
    np.testing.assert_array_equal(do, grad_inputs(prob, 5, host_inputs)["do"])  # seeded


def test_check_gate_prepares_a_backward_with_do(monkeypatch):
    seen = {}

    class Spy(FakeImpl):
        def prepare(self, prob, q, k, v, do=None):
            seen["do"] = do
            return super().prepare(prob, q, k, v, do)

    monkeypatch.setattr(check, "random_inputs", host_inputs)
    res = gate(Spy("spy", passes=PASSES), prob_of(), seed=7)
    assert res.ok, res.reason
    assert seen["do"] is not None and seen["do"].shape == (1, 2, 24, 16)


def test_the_reference_of_a_backward_holds_the_output_and_the_gradients():
    prob = prob_of(T=20)
    q, k, v = problem_inputs(prob, 2, host_inputs)
    do = grad_inputs(prob, 2, host_inputs)["do"]
    ref = reference_of(prob, q, k, v, do)
    out, lse = reference_forward(q, k, v, prob.mask, prob.dtype)
    np.testing.assert_array_equal(ref["out"], out)
    for name, a in zip(("dq", "dk", "dv", "lse", "delta"), reference_backward(q, k, v, do, prob.mask, prob.dtype)):
        np.testing.assert_array_equal(ref[name], a)


@pytest.mark.parametrize("pass_name", BACKWARD)
@pytest.mark.parametrize("serving, words", [
    (dict(H_kv=1), "H_kv=1 < H=2"), (dict(Tq=4), "Tq=4 < Tk=24"),
    (dict(cache_lens=(24, 16), Tq=8, B=2), "ragged batch")])
def test_serving_shapes_refuse_a_backward(pass_name, serving, words):
    serving = dict(serving)
    B = serving.pop("B", 1)
    with pytest.raises(BadInput, match=re.escape(f"pass={pass_name} takes prefill shapes only")) as e:
        Problem(make_mask("dense", 24), B, 2, 16, "bfloat16", pass_name=pass_name, **serving)
    assert words in str(e.value) and "forward-only" in str(e.value)
    Problem(make_mask("dense", 24), B, 2, 16, "bfloat16", **serving)  # the forward takes them


# -- the sweep --------------------------------------------------------------------------------------
def test_sweep_rows_of_backward_passes_are_gated_and_timed_with_their_flops_and_floor(monkeypatch):
    impls = [FakeImpl("fake-exact", passes=PASSES), FakeImpl("fake-peer", family="peer", speed=0.5, passes=PASSES),
             FakeImpl("fake-bad", passes=PASSES, grad_scale={"dv": 2.0}), FakeImpl("fake-fwd")]
    timer = FakeTimer(impls)
    ctx = sw.Context(time=timer, peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs, cleanup=lambda: None)
    refs = []
    real = check.reference_gradients
    monkeypatch.setattr(check, "reference_gradients", lambda *a, **kw: refs.append(1) or real(*a, **kw))
    cases = sw.plan("seed", T=(32,), D=(16,), patterns=("window",), window=(8,), H=2, passes=PASSES)
    rows = {(r["pass"], r["impl"]): r for case in cases for r in sw.run_case(case, impls, ctx)}
    # one reference for every implementation and both backward passes: the configuration's passes share
    # their inputs, so the training step takes the backward's gradients (and the forward made its own)
    assert len(refs) == 1 and ctx.references.computed == 2
    # interleaved, each pass on its own: the forward's four, then the two whose gradients pass
    assert timer.calls == [["fake-bad", "fake-exact", "fake-fwd", "fake-peer"]] + [["fake-exact", "fake-peer"]] * 2
    fwd = rows["fwd", "fake-exact"]
    B, H, T, D, it = 1, 2, 32, 16, 4
    for p, mult in (("bwd", 10), ("fwd+bwd", 14)):
        for name in ("fake-exact", "fake-peer"):
            r = rows[p, name]
            assert r["status"] == "ok" and r["pass"] == p and r["rel_err"] <= r["tolerance"]
            assert r["flops"] == mult * D * r["pairs"] * B * H == fwd["flops"] // 4 * mult
            bwd_bytes = 8 * B * H * T * D * it + 4 * B * H * T
            assert r["bytes_floor"] == bwd_bytes + (fwd["bytes_floor"] if p == "fwd+bwd" else 0)
            assert r["floor_ms"] == pytest.approx(max(r["flops"] / (r["peak_tflops"] * 1e12),
                                                      r["bytes_floor"] / (r["peak_tbps"] * 1e12)) * 1e3)
            assert r["tflops"] == pytest.approx(r["flops"] / (r["median_ms"] * 1e-3) / 1e12)
        bad = rows[p, "fake-bad"]
        assert bad["status"] == "failed" and bad["reason"] == "dv: relative error 1 above tolerance 1e-05"
        assert rows[p, "fake-fwd"]["status"] == "skipped"
        assert rows[p, "fake-fwd"]["reason"] == f"pass={p} is not supported by fake-fwd (supports: fwd)"


def test_the_sweep_skips_a_backward_on_serving_shapes_with_the_reason():
    impls = [FakeImpl("fake-exact", passes=PASSES)]
    ctx = sw.Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                     cleanup=lambda: None)
    (case,) = sw.plan("seed", T=(32,), D=(16,), patterns=("dense",), H=2, H_kv=1, passes=("bwd",))
    (row,) = sw.run_case(case, impls, ctx)
    assert row["status"] == "skipped" and "serving shapes are forward-only" in row["reason"]


# -- the commands ------------------------------------------------------------------------------------
def test_check_command_gates_a_backward(registry, monkeypatch):
    monkeypatch.setattr(check, "random_inputs", host_inputs)
    r = CliRunner().invoke(main, ["check", "--pass", "bwd", "--impl", "fake-exact", "--impl", "fake-wrong",
                                  "--pattern", "window", "--T", "24", "--D", "16", "--B", "1", "--H", "2"])
    assert r.exit_code == 1, r.output
    lines = r.output.splitlines()
    assert any(line.startswith("fake-exact") and line.endswith("ok") for line in lines)
    assert any(line.startswith("fake-wrong") and "FAILED: dq: relative error 0.5 above tolerance" in line
               and "dk: relative error 0.5" in line and "dv: relative error 0.5" in line for line in lines)


@pytest.mark.parametrize("noise, ok", [(1e-7, True), (1e-3, False)])
@pytest.mark.parametrize("T, pattern, params", [(1, "dense", {}), (24, "window", {"window": 1})])
def test_a_gradient_zero_by_the_pattern_is_judged_against_the_gradients_norm(T, pattern, params, noise, ok):
    """Every row with one allowed key: dS = P (dP - delta) = 0, so dQ and dK are zero in exact
    arithmetic and a kernel's are rounding noise; that noise is measured against the gradients' joint
    norm, not against a zero."""
    class Noisy(FakeImpl):
        def prepare(self, prob, q, k, v, do=None):
            runner = super().prepare(prob, q, k, v, do)
            run = runner.run

            def noisy():
                run()
                rng = np.random.default_rng(0)
                for g in runner.grads[:2]:
                    g += (noise * rng.standard_normal(g.shape)).astype(g.dtype)
            runner.run = noisy
            return runner

    prob = prob_of(pattern, True, T=T, **params)
    res = host_gate(Noisy("noisy", passes=PASSES), prob)
    assert res.ok == ok, res.reason
    assert res.errors["dq"] == pytest.approx(res.errors["dk"], rel=0.5)
    if not ok:
        assert res.reason.startswith("dq: relative error") and "dk: relative error" in res.reason
