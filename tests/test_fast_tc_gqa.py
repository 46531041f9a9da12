"""fast-tc and fast-tc-sync with grouped-query heads (H_kv < H, prefill): query head h reads key/value
head h // (H / H_kv) (KV_GROUP, kernels/tc/scheduler.cuh). CPU: what they take and refuse, the
builds compile without spills and H_kv = H builds are left as they were; GPU: the gate."""
import dataclasses
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import FakeImpl  # noqa: E402
from test_trust import device  # noqa: E402,F401

from attnbench import sweep as sw  # noqa: E402
from attnbench.compile import compile_only  # noqa: E402
from attnbench.fwd_config import choose_config, kernel_defines
from attnbench.fast_tc import IMPL, SYNC_IMPL, standard_builds  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.impls import Problem  # noqa: E402
from attnbench.patterns import PATTERNS, BadInput, make_mask  # noqa: E402
from attnbench.results import read_results  # noqa: E402

IMPLS = pytest.mark.parametrize("impl", [IMPL, SYNC_IMPL], ids=["fast-tc", "fast-tc-sync"])


# ---- CPU --------------------------------------------------------------------------------------------
@IMPLS
def test_it_takes_grouped_heads_for_prefill_and_leaves_decoding_to_fast_decode(impl, monkeypatch):
    monkeypatch.setattr(type(impl), "availability", lambda self: None)
    assert impl.gqa and not impl.decode and not impl.ragged
    assert "grouped heads" in impl.shapes_taken()
    mask = make_mask("window", 256, True, window=64)
    for H_kv in (1, 2, 4, 8):
        assert impl.unsupported(Problem(mask, 2, 8, 64, "bfloat16", H_kv=H_kv)) is None
    why = impl.unsupported(Problem(mask, 2, 8, 64, "bfloat16", H_kv=2, Tq=16))
    assert "Tq=16 < Tk=256" in why and impl.name in why
    why = impl.unsupported(Problem(mask, 2, 8, 64, "bfloat16", H_kv=2, cache_lens=(256, 256)))
    assert "ragged" in why
    with pytest.raises(BadInput, match="H_kv=2 < H=8"):  # the backward stays at H_kv = H
        Problem(mask, 2, 8, 64, "bfloat16", H_kv=2, pass_name="bwd")


def test_the_group_is_a_constant_only_where_heads_are_grouped():
    mask = make_mask("dense", 1024, True)
    assert "KV_GROUP" not in kernel_defines(64, "bfloat16", mask)
    assert kernel_defines(64, "bfloat16", mask, group=1) == kernel_defines(64, "bfloat16", mask)
    assert kernel_defines(64, "bfloat16", mask, group=4)["KV_GROUP"] == 4
    grouped = [d for _, d in standard_builds() if "KV_GROUP" in d]
    assert grouped and {d["KV_GROUP"] for d in grouped} == {4}
    assert {d["HEAD_D"] for d in grouped} == {64, 128} and {d.get("WG", 0) for d in grouped} == {0, 1}
    assert any(d["STRIDE"] > 1 for d in grouped)  # the strided (cp.async) path too


def test_h_kv_equal_h_builds_are_the_code_of_before():
    """KV_GROUP 1 is the default: given or left out, the same cubin (the standard builds' PTX and
    cubins were checked identical to the tree before grouped heads: docs/PERF.md)."""
    for pattern, ps, arch, wgmma in (("dense", {}, "sm_80", False), ("streaming", dict(sink=16, window=64), "sm_90a", True),
                                     ("dilated", dict(window=512, dilation=2), "sm_90a", True)):
        mask = make_mask(pattern, 4096, True, **ps)
        d = kernel_defines(64, "bfloat16", mask, choose_config(mask, 64, wgmma))
        (a,) = compile_only("fast_tc", d, arch)
        (b,) = compile_only("fast_tc", {**d, "KV_GROUP": 1}, arch)
        assert a.cubin_sha256 == b.cubin_sha256


@pytest.mark.parametrize("arch", ["sm_80", "sm_90", "sm_90a"])
@pytest.mark.parametrize("D", (64, 128))
@pytest.mark.parametrize("pattern", ["dense", "streaming", "dilated", "bigbird"])
def test_grouped_builds_compile_without_spills(arch, D, pattern):
    """sm_80 and sm_90: the mma.sync shapes (fast-tc-sync, and fast-tc before sm_90); sm_90a: the wgmma
    shapes, bulk tensor copies for K and V over [B * H_kv, T, D] (dilated: cp.async on its classes)."""
    mask = make_mask(pattern, 4096, True, **({"window": 64} if pattern == "streaming" else {}))
    cfg = choose_config(mask, D, wgmma=arch == "sm_90a")
    base = compile_only("fast_tc", kernel_defines(D, "bfloat16", mask, cfg), arch)[0]
    for group in (2, 4, 8):
        (r,) = compile_only("fast_tc", kernel_defines(D, "bfloat16", mask, cfg, group=group), arch)
        assert r.kernel == "fast_tc_fwd" and 0 < r.registers <= 255
        assert (r.spill_stores, r.spill_loads, r.stack) == (0, 0, 0), r
        # the group costs a division of blockIdx.y per block, not registers of its own
        assert r.registers <= -(-base.registers // 8) * 8, (r, base)


def test_the_llm_sweep_plans_grouped_heads_on_the_command_line():
    cases = sw.plan("llm", H_kv=4)
    assert len(cases) == len(sw.plan("llm"))
    assert {(c.H, c.H_kv, c.Tq, c.cache_lens) for c in cases} == {(16, 4, None, None)}
    for c in cases[:3]:
        prob = Problem(c.inst.mask(c.T), c.B, c.H, c.D, c.dtype, H_kv=c.H_kv, Tq=c.Tq)
        assert prob.prefill and prob.kv_shape == (1, 4, c.T, c.D)


def test_the_llm_sweep_with_h_kv_4_writes_grouped_rows(tmp_path, device, registry, monkeypatch):
    """`attnbench sweep --config llm --H-kv 4` through the CLI (the fakes for the device, one that takes
    grouped heads, and fast-tc, which must not refuse the shape: only this machine)."""
    fake = FakeImpl("fake-gqa", dtypes=("bfloat16",))
    fake.gqa = True
    tc = dataclasses.replace(IMPL)
    tc.speed = 1.0  # (the fake timer's; fast-tc is never timed here)
    registry.clear()
    registry.update({"fake-gqa": fake, "fast-tc": tc})
    monkeypatch.setattr(type(IMPL), "availability", lambda self: "no CUDA device (test)")
    out = tmp_path / "gqa.csv"
    r = CliRunner().invoke(main, ["sweep", "--config", "llm", "--H-kv", "4", "--T", "64", "--pattern", "dense",
                                  "--pattern", "window", "--window", "16", "--D", "64", "--impl", "fake-gqa",
                                  "--impl", "fast-tc", "--out", str(out)])
    assert r.exit_code == 0, r.output
    df = read_results(out)
    assert set(df["H_kv"]) == {4} and set(df["H"]) == {16} and set(df["Tq"]) == {64}
    assert set(df[df.impl == "fake-gqa"]["status"]) == {"ok"}
    tc = df[df.impl == "fast-tc"]
    assert set(tc["status"]) == {"skipped"} and all(x == "no CUDA device (test)" for x in tc["reason"])


# ---- GPU: the gate -----------------------------------------------------------------------------------
def _params(pattern, T):
    return PATTERNS[pattern].examples(T)[0]


GATE_PATTERNS = ("dense", "window", "streaming", "block_diagonal", "dilated", "bigbird", "document")
GATE = [(pattern, D, T, H_kv, causal)
        for pattern in GATE_PATTERNS for D in (64, 128) for T, causal in ((7, True), (100, False), (1000, True))
        for H_kv in (1, 2)]


@pytest.mark.gpu
@IMPLS
@pytest.mark.parametrize("pattern,D,T,H_kv,causal", GATE,
                         ids=[f"{p}-D{D}-T{T}-Hkv{h}-{'c' if c else 'nc'}" for p, D, T, h, c in GATE])
def test_gate(impl, pattern, D, T, H_kv, causal):
    from attnbench.check import gate

    mask = make_mask(pattern, T, causal, **_params(pattern, T))
    res = gate(impl, Problem(mask, 2, 8, D, "bfloat16", H_kv=H_kv))
    assert res.ok, res


@pytest.mark.gpu
@IMPLS
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pattern,T", [("dense", 4096), ("streaming", 4096), ("dilated", 1000), ("window", 333)])
def test_grouped_heads_equal_the_same_keys_repeated(impl, dtype, pattern, T):
    """H=8 over H_kv=2: bit for bit the output of H_kv = H on K and V with each head repeated for its
    group (the same products in the same order; only where K and V are read from differs)."""
    import cupy

    from attnbench.arrays import random_inputs

    mask = make_mask(pattern, T, True, **_params(pattern, T))
    grouped = Problem(mask, 2, 8, 64, dtype, H_kv=2)
    q = random_inputs(grouped.shape, dtype, 3)[0]
    _, k, v = random_inputs(grouped.kv_shape, dtype, 4)
    a = impl.prepare(grouped, q, k, v)
    a.run()
    full = Problem(mask, 2, 8, 64, dtype)
    kk, vv = (cupy.ascontiguousarray(cupy.repeat(x, 4, axis=1)) for x in (k, v))
    b = impl.prepare(full, q, kk, vv)
    b.run()
    assert cupy.array_equal(a.out, b.out)


@pytest.mark.gpu
@IMPLS
@pytest.mark.parametrize("D", (64, 128))
def test_gate_long_grouped(impl, D):
    """The llm shape of the issue's target: H=16 over H_kv=4, T=4096, odd batch."""
    from attnbench.check import gate

    for pattern in ("dense", "streaming", "dilated"):
        mask = make_mask(pattern, 4096, True, **({"sink": 16, "window": 64} if pattern == "streaming" else {}))
        res = gate(impl, Problem(mask, 1, 16, D, "bfloat16", H_kv=4))
        assert res.ok, (pattern, res)


@pytest.mark.gpu
def test_k_of_the_query_heads_is_refused_by_name():
    from attnbench.arrays import random_inputs

    prob = Problem(make_mask("dense", 64, True), 1, 8, 64, "bfloat16", H_kv=2)
    q, k, v = random_inputs(prob.shape, "bfloat16", 1)
    with pytest.raises(BadInput, match=r"k has shape \(1, 8, 64, 64\), expected \(1, 2, 64, 64\)"):
        IMPL.prepare(prob, q, k, v)
