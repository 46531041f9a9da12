"""The peers' backward. On the host: cublas's arithmetic (its forward and backward over chunks of
query rows) with numpy standing in for cuBLAS and its two kernels, through the gradient gate. On a
device (marker gpu): every peer's gradients through the gate (patterns, D 64 and 128, odd T,
bfloat16, a few float16 and float32), Flex's backward settings (one that cannot compile is a skip
with its reason), and a training sweep timing backward rows."""
import dataclasses
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import host_inputs  # noqa: E402
from test_peers import PEERS, _ready  # noqa: E402 - the peers' gate helpers (Flex's backward pinned to one setting)

from attnbench import peers  # noqa: E402
from attnbench import sweep as sw  # noqa: E402
from attnbench.arrays import STORAGE, from_float32, to_float32  # noqa: E402
from attnbench.check import grad_inputs, judge, problem_inputs  # noqa: E402
from attnbench.impls import PASSES, Problem, get_impl  # noqa: E402
from attnbench.patterns import BadInput, make_mask  # noqa: E402

CASES = [("dense", True, {}), ("dense", False, {}), ("window", True, {"window": 64}),
         ("streaming", True, {"sink": 4, "window": 32}), ("block_diagonal", False, {"block": 8}),
         ("bigbird", True, {"block": 8, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2})]


def _id(case):
    pattern, causal, params = case
    return f"{pattern}{'-causal' if causal else ''}" + "".join(f"-{k}{v}" for k, v in params.items())


def _prob(case, T, D=64, dtype="bfloat16", pass_name="bwd", H=2, B=1):
    pattern, causal, params = case
    params = dict(params)
    if "block" in params and T % params["block"]:
        params["block"] = 1 if pattern == "bigbird" else T  # T = 7: a block that divides it
        if pattern == "bigbird":
            params["random_blocks"] = 2
    return Problem(make_mask(pattern, T, causal, **params), B, H, D, dtype, pass_name=pass_name)


# -- cublas's arithmetic on the host ------------------------------------------------------------------
def _host_gemm(self, ta, tb, m, n, k, alpha, a, ao, lda, sa, b, bo, ldb, sb, c, co, ctype, ldc, sc, beta=None):
    """cublasGemmStridedBatchedEx's column-major contract in float64 on flat numpy buffers."""
    def view(arr, off, ld, rows, cols, i, stride):
        return off + i * stride + np.arange(rows)[:, None] + np.arange(cols)[None, :] * ld

    def values(arr, idx):
        name = "bfloat16" if arr.dtype == np.uint16 else str(arr.dtype)
        return to_float32(arr.reshape(-1)[idx], name).astype(np.float64)

    beta = 0.0 if beta is None else float(beta)
    for i in range(self.bh):
        A = values(a, view(a, ao, lda, *((m, k) if ta == 0 else (k, m)), i, sa))
        B = values(b, view(b, bo, ldb, *((k, n) if tb == 0 else (n, k)), i, sb))
        idx = view(c, co, ldc, m, n, i, sc)
        res = float(alpha) * (A if ta == 0 else A.T) @ (B if tb == 0 else B.T)
        if beta:
            res += beta * values(c, idx)
        flat = c.reshape(-1)
        assert np.shares_memory(flat, c)
        flat[idx] = from_float32(res.astype(np.float32), "bfloat16") if c.dtype == np.uint16 else res.astype(c.dtype)


def _host_block(blocked, s):
    s[...] = np.where(blocked, -np.inf, s)


def _host_to_bf16(x, y):
    y[...] = from_float32(x, "bfloat16")


@pytest.fixture
def host_cublas(monkeypatch):
    """cublas's runner on numpy arrays: cuBLAS, its two elementwise kernels and the stream sync stood in
    for; scratch small enough for several chunks of rows, the last one short."""
    monkeypatch.setattr(peers.cublas._CublasRunner, "_gemm", _host_gemm)
    monkeypatch.setattr(peers.cublas, "_kernels", lambda: (_host_block, _host_to_bf16))
    monkeypatch.setattr(peers.cublas, "sync", lambda: None)
    monkeypatch.setattr(peers.cublas, "SCRATCH_BYTES", 2 * 40 * 10 * 7)  # B*H*T*(4+2+4) bytes a row: 7 rows


HOST = [(T, case) for T, case in [(40, c) for c in CASES] + [(7, CASES[0]), (7, CASES[2])]]


@pytest.mark.parametrize("pass_name", PASSES)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("T,case", HOST, ids=[f"T{T}-{_id(c)}" for T, c in HOST])
def test_cublas_arithmetic_passes_the_gate_on_the_host(host_cublas, T, case, dtype, pass_name):
    prob = _prob(case, T, D=16, dtype=dtype, pass_name=pass_name)
    q, k, v = problem_inputs(prob, 3, host_inputs)
    grad = grad_inputs(prob, 3, host_inputs)
    runner = peers.CUBLAS.build(prob, q, k, v, **grad)
    assert runner.rows == peers.cublas_rows(1, 2, T, dtype, backward=pass_name != "fwd")
    assert len(runner.chunks) > 1 or T == 7
    res = judge(peers.CUBLAS, prob, runner, q, k, v, **grad)
    assert res.ok, res.reason
    if pass_name != "fwd":
        assert [g.dtype for g in runner.grads] == [np.dtype(STORAGE[dtype])] * 3
        assert [g.shape for g in runner.grads] == [q.shape] * 3


@pytest.mark.parametrize("pass_name", ["bwd", "fwd+bwd"])
def test_cublas_backward_starts_afresh_each_run_and_keeps_the_forward(host_cublas, monkeypatch, pass_name):
    monkeypatch.setattr(peers.cublas, "MASK_CACHE_BYTES", 0)  # the mask built on the host every run instead
    prob = _prob(CASES[3], 40, D=16, dtype="bfloat16", pass_name=pass_name)
    q, k, v = problem_inputs(prob, 4, host_inputs)
    grad = grad_inputs(prob, 4, host_inputs)
    runner = peers.CUBLAS.build(prob, q, k, v, **grad)
    assert runner.masks is None and len(runner.chunks) > 1
    runner.run()
    first = [g.copy() for g in runner.grads]
    out = runner.out.copy()
    runner.poison()
    if pass_name == "bwd":  # the saved forward is not the backward's to poison
        np.testing.assert_array_equal(runner.out, out)
    runner.run()
    for a, b in zip(first, runner.grads):  # dK and dV do not pile up over runs
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(runner.out, out)


def test_cublas_backward_scratch_holds_dp_too():
    for B, H, T, dtype in [(1, 16, 4096, "bfloat16"), (1, 16, 32768, "float32"), (2, 3, 1000, "float16")]:
        rows = peers.cublas_rows(B, H, T, dtype, backward=True)
        per_row = B * H * T * (8 + (0 if dtype == "float32" else 2))
        assert 1 <= rows <= peers.cublas_rows(B, H, T, dtype)
        assert rows == 1 or rows * per_row <= peers.cublas.SCRATCH_BYTES


def test_flex_settings_are_labelled_as_setup_records_them():
    default, block64 = peers.FLEX_BWD_SETTINGS
    assert default.label() == "BLOCK_SIZE=128 (defaults)" and default.kernel_options is None
    assert block64.label() == "BLOCK_SIZE=64 BLOCK_M=64 BLOCK_N=64 BLOCK_M1=32 BLOCK_N1=64 BLOCK_M2=64 BLOCK_N2=32"
    assert block64.kernel_options == {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64,
                                      "BLOCK_N2": 32}
    assert peers.FlexSetting.forward(64).kernel_options == peers.flex_kernel_options(64)
    assert peers.FlexSetting.forward(128).kernel_options is None


# -- on a device ---------------------------------------------------------------------------------------
GATE = [(name, T, D, "bfloat16", "bwd", c) for name in PEERS if name != "flex" for T in (7, 1000) for D in (64, 128)
        for c in CASES]
GATE += [(name, 1000, 64, "bfloat16", "fwd+bwd", c) for name in PEERS if name != "flex" for c in CASES[:3]]
GATE += [(name, 128, 64, dt, "bwd", c) for name in ("cublas", "sdpa-efficient", "sdpa-flash") for dt in
         ("float16", "float32") for c in CASES[:3]]
# Flex compiles its forward and backward for every case: a few, each pattern once
GATE += [("flex", 1000, 64, "bfloat16", "bwd", CASES[0]), ("flex", 1000, 128, "bfloat16", "bwd", CASES[2]),
         ("flex", 7, 64, "bfloat16", "bwd", CASES[3]), ("flex", 1000, 128, "bfloat16", "bwd", CASES[4]),
         ("flex", 1000, 64, "bfloat16", "fwd+bwd", CASES[5])]


@pytest.mark.gpu
@pytest.mark.parametrize("name,T,D,dtype,pass_name,case", GATE,
                         ids=[f"{n}-{p}-T{T}-D{D}-{dt}-{_id(c)}" for n, T, D, dt, p, c in GATE])
def test_peer_backward_passes_the_gradient_gate(name, T, D, dtype, pass_name, case):
    impl = _ready(name, prob := _prob(case, T, D, dtype, pass_name))
    q, k, v = problem_inputs(prob, T + D)
    grad = grad_inputs(prob, T + D)
    runner = impl.prepare(prob, q, k, v, **grad)
    res = judge(impl, prob, runner, q, k, v, **grad)
    assert res.ok, f"{name} {pass_name} {prob.mask.label()} T={T} D={D} {dtype}: {res.reason} ({res.errors})"
    assert set(res.errors) == {"dq", "dk", "dv"} | ({"out"} if pass_name == "fwd+bwd" else set())
    assert [(g.shape, g.dtype) for g in runner.grads] == [(q.shape, q.dtype)] * 3


@pytest.mark.gpu
@pytest.mark.parametrize("name", PEERS)
def test_peer_backward_runs_on_cupys_current_stream_and_shares_its_gradients(name):
    import cupy

    prob = _prob(CASES[0], 1000, pass_name="bwd")  # Flex: the gate's case, compiled already
    impl = _ready(name, prob)
    with cupy.cuda.Stream(non_blocking=True):
        q, k, v = problem_inputs(prob, 11)
        grad = grad_inputs(prob, 11)
        runner = impl.prepare(prob, q, k, v, **grad)
        out = runner.out.copy()
        for _ in range(2):  # the backward again, from the same saved forward
            res = judge(impl, prob, runner, q, k, v, **grad)
            assert res.ok, res.reason
        assert bool((runner.out == out).all())  # the saved forward left as it was
    assert all(g.shape == q.shape and g.dtype == q.dtype for g in runner.grads)
    if name != "cublas":
        assert runner.q.data_ptr() == q.data.ptr and runner.q.requires_grad
        assert [g.data.ptr for g in runner.grads] == [t.data_ptr() for t in runner._tgrads]  # no copies


@pytest.mark.gpu
def test_flex_backward_setting_that_cannot_compile_is_a_skip_with_its_reason():
    prob = _prob(CASES[2], 1000, D=128, pass_name="bwd")  # the gate's case: the setting that runs is compiled
    impl = _ready("flex", prob)
    bad = peers.FlexSetting.make(128, BLOCK_M1=48)  # not a power of two: no Triton kernel takes it
    q, k, v = problem_inputs(prob, 2)
    grad = grad_inputs(prob, 2)
    with pytest.raises(BadInput, match="BLOCK_M1=48") as e:
        dataclasses.replace(impl, bwd_settings=(bad,)).prepare(prob, q, k, v, **grad)
    assert "flex: no setting of its bwd pass runs" in str(e.value)
    # beside a setting that runs: that one is used, the other recorded
    runner = dataclasses.replace(impl, bwd_settings=(bad, peers.FLEX_BWD_SETTINGS[0])).prepare(prob, q, k, v, **grad)
    assert runner.setup["flex_options"] == "BLOCK_SIZE=128 (defaults)" and runner.setup["flex_block"] == 128
    assert list(runner.setup["flex_failed"]) == [bad.label()]
    assert judge(impl, prob, runner, q, k, v, **grad).ok
    # and in a sweep the row is skipped, with the reason
    from attnbench.timing import Peaks

    ctx = sw.Context(time=None, peaks=Peaks(tc_tflops=700.0, f32_tflops=50.0, copy_tbps=3.0), provenance={})
    case = sw.Case("llm", sw.Instance.make("window", True, window=64), 1000, 1, 2, 128, "bfloat16", "bwd")
    (row,) = sw.run_case(case, [dataclasses.replace(impl, bwd_settings=(bad,))], ctx)
    assert row["status"] == "skipped" and "BLOCK_M1=48" in row["reason"]


@pytest.mark.gpu
def test_flex_backward_tries_its_settings_and_records_them():
    prob = _prob(CASES[0], 1024, pass_name="fwd+bwd")
    impl = get_impl("flex")
    why = impl.availability() or impl.unsupported(prob)
    if why:
        pytest.skip(why)
    q, k, v = problem_inputs(prob, 3)
    grad = grad_inputs(prob, 3)
    runner = impl.prepare(prob, q, k, v, **grad)
    labels = [s.label() for s in peers.FLEX_BWD_SETTINGS]
    assert runner.setup["flex_options"] in labels
    assert set(runner.setup.get("flex_failed", {})) <= set(labels) - {runner.setup["flex_options"]}
    assert runner.setup["compile_s"] > 0 and runner.setup["block_mask_build_s"] > 0
    assert judge(impl, prob, runner, q, k, v, **grad).ok


@pytest.mark.gpu
def test_a_training_sweep_times_backward_rows_with_their_flops():
    from attnbench.timing import EventTimer, Peaks

    impls = [get_impl(n) for n in ("cublas", "sdpa-flash", "sdpa-cudnn")]
    ctx = sw.Context(time=EventTimer().time, peaks=Peaks(tc_tflops=700.0, f32_tflops=50.0, copy_tbps=3.0),
                     provenance={}, samples=5)
    rows = [r for c in sw.plan("training", T=(1024,), D=(64,), patterns=("dense",)) for r in sw.run_case(c, impls, ctx)]
    assert [r["pass"] for r in rows] == [p for p in PASSES for _ in impls]
    by = {(r["pass"], r["impl"]): r for r in rows}
    for (p, name), r in by.items():
        if name == "sdpa-cudnn" and r["status"] == "skipped":
            continue
        if r["status"] == "skipped" and get_impl(name).availability():
            continue
        assert r["status"] == "ok", f"{name} {p}: {r['reason']}"
        assert r["flops"] == {"fwd": 4, "bwd": 10, "fwd+bwd": 14}[p] * 64 * r["pairs"] * 16
        assert r["median_ms"] > 0 and r["samples"] == 5
