"""The custom expression's bits form (attnbench/patterns/expr_bits.py, kernels/patterns/custom.cuh):
the 32-key word of a row from key intervals, against the expression evaluated pair by pair. On the
CPU: the numpy emulation (every bit of every word of every row, j0 at every offset, keys up to
T + 63), the generated C itself compiled on the host against the real device helpers, and NVRTC
builds of every kernel that takes the predicate."""
import shutil
import struct
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attnbench import compile as kc
from attnbench.errors import BadInput
from attnbench.patterns import make_mask
from attnbench.patterns.custom import Custom
from attnbench.patterns.expr import bind
from attnbench.patterns.expr_bits import LIM32, REF_T, atoms

from test_custom import BUILTINS
from test_expr import EXPRS, P


def words_of(b, T, rows=None, starts=None):
    """(the bits form's words, the expression's bits) over rows x word starts, [rows, starts, 32]."""
    i = np.arange(T) if rows is None else np.asarray(rows)
    j0 = np.arange(T + 33) if starts is None else np.asarray(starts)  # every offset, the last words past T
    got = b.bits(i[:, None], j0[None, :])
    bits = (got[..., None].astype(np.uint64) >> np.arange(32, dtype=np.uint64)) & 1
    want = b.allowed(i[:, None, None], j0[None, :, None] + np.arange(32)[None, None, :])
    return bits.astype(bool), np.broadcast_to(want, bits.shape)


def check(text, T, params=()):
    b = bind(text, T, tuple(params))
    got, want = words_of(b, T)
    bad = np.argwhere(got != want)
    assert not bad.size, f"{text} at T={T}: row {bad[0][0]}, j0 {bad[0][1]}, bit {bad[0][2]} ({b.c_bits})"
    return b


def kinds(text, T=1000, params=()):
    return [(a.kind, a.narrow) for a in atoms(bind(text, T, tuple(params)).words)]


# expressions beyond the examples: negatives, floor division of negatives, keys near T, rows that
# allow every key or none, abs / min / max of j, operators of every kind, divisors below and above 32
MORE = [
    ("j < 16", ()), ("i - j < 64", ()), ("j - i < W", (("W", 5),)), ("j >= max(T - 8, 0)", ()),
    ("j < min(P, T)", (("P", 3),)), ("abs(i - j) < W", (("W", 7),)), ("i // 128 == j // 128", ()),
    ("(i - j < W) | (j < S) | (j % 512 == 0)", (("S", 4), ("W", 1024))),
    ("(j < 16) | (i - j < 64)", ()), ("i - j < 256", ()),
    ("(j - i) // 5 >= -1", ()), ("(i - j + 3) // 7 != i // 7 - 2", ()), ("-j // 3 < -(i // 3)", ()),
    ("(j - 2 * i) // 4 == 0", ()), ("i // 3 == j // 5", ()), ("(j + 7) // 64 > i // 64", ()),
    ("(i - j) // 100000 == 0", ()), ("(i - j) // 1 < 3", ()), ("(j - 40) // 32 <= (i - 70) // 32", ()),
    ("(i - j) // 33 == 1", ()), ("(i - j) // 31 == -1", ()), ("(j + i) // 16 != 3", ()),
    ("3 - j < i", ()), ("j * -1 > -i", ()), ("-j > -i - 3", ()), ("i + j < T", ()), ("i + j >= T - 1", ()),
    ("j >= T - 8", ()), ("j > T + 40", ()), ("j <= T + 20", ()), ("j == i", ()), ("j != i", ()), ("j == i - 5", ()),
    ("j == 40", ()), ("j != 33", ()), ("abs(j - i) == 3", ()), ("abs(i - j) != 0", ()), ("abs(i - j) >= 30", ()),
    ("max(i, j) < 50", ()), ("min(i, j) >= 10", ()), ("max(j - 5, 2 * i) <= 60", ()),
    ("min(j, 20) == min(i, 20)", ()), ("~(i - j < W) | (j == 0)", (("W", 9),)), ("min(abs(i - j), 40) > 33", ()),
    ("abs(abs(j - 50) - 20) < 5", ()),
    ("j * 2 < i", ()), ("i * j < 100", ()), ("(i - j) % 3 == 0", ()), ("j % 8 == i % 8", ()),
    ("(i != 3) & (j <= i)", ()), ("(i % 2 == 0) | (j == 0)", ()), ("j - j + i > 10", ()), ("i < 0", ()),
    ("1 < 2", ()), ("(T > 5) | (i < j)", ()), ("(1 > 2) | (j < 0)", ()),
    # 64-bit atoms: values beyond 2^29
    ("j + W > W - 5", (("W", 2 ** 40),)), ("(i - j) // K == 0", (("K", 2 ** 40),)), ("i - j < W", (("W", 2 ** 35),)),
    ("j - W < i - W", (("W", 2 ** 45),)), ("(j + W) // 8 == (i + W) // 8", (("W", 2 ** 50),)),
    ("(i - j) * W < W * 3", (("W", 2 ** 30),)), ("abs(j - i) * 1 < W", (("W", 2 ** 40),)),
    ("(j - i) * W // W >= -4", (("W", 2 ** 40),)), ("j + W == i + W", (("W", -2 ** 40),)),
    ("(j - W) // 9 < (i - W) // 9 + 1", (("W", 2 ** 33),)), ("i - j > W", (("W", -2 ** 33),)),
]

EXAMPLES = [(e["expr"], e.get("param", ())) for T in (7, 100) for e in Custom().examples(T)]
ALL = MORE + EXAMPLES + [(t, P) for t, _ in EXPRS] + \
      [(text, tuple((named(100) if callable(named) else named).items())) for _, _, text, named in BUILTINS]


@pytest.mark.parametrize("T", [1, 2, 31, 32, 33, 100, 257])
@pytest.mark.parametrize("text,params", ALL, ids=[f"{n}:{t}" for n, (t, _) in enumerate(ALL)])
def test_the_bits_form_is_the_expression_bit_for_bit(text, params, T):
    check(text, T, params)


def test_every_offset_near_large_T_and_rows_across_it():
    for text, params in MORE + EXAMPLES:
        T = 40000
        b = bind(text, T, tuple(params))
        rows = [0, 1, 31, 127, 128, 129, 20000, T - 65, T - 33, T - 2, T - 1]
        starts = list(range(0, 70)) + list(range(19900, 20100)) + list(range(T - 100, T + 33))
        got, want = words_of(b, T, rows, starts)
        assert (got == want).all(), text


# ---- random expressions ---------------------------------------------------------------------------
LEAVES = st.sampled_from(["i", "j", "i", "j", "T", "W", "S"]) | st.integers(-40, 40).map(str)


def _ints(sub):
    return st.one_of(
        st.tuples(sub, st.sampled_from(["+", "-"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.integers(-3, 3)).map(lambda t: f"({t[0]} * {t[1]})"),
        st.tuples(sub, st.sampled_from(["//", "%"]), st.integers(1, 70)).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(["min", "max"]), sub, sub).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
        sub.map(lambda a: f"abs({a})"), sub.map(lambda a: f"(-{a})"))


INTS = st.recursive(LEAVES, _ints, max_leaves=5)
CMPS = st.tuples(INTS, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), INTS).map(lambda t: f"({t[0]} {t[1]} {t[2]})")
BOOLS = st.recursive(CMPS, lambda sub: st.one_of(
    st.tuples(sub, st.sampled_from(["&", "|"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    sub.map(lambda a: f"~{a}")), max_leaves=4)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(BOOLS, st.integers(1, 90), st.integers(-50, 50), st.integers(-50, 50))
def test_random_expressions(text, T, W, S):
    check_random(text, T, W, S)


def check_random(text, T, W, S):
    try:
        b = bind(text, T, (("S", S), ("W", W)))
    except BadInput:
        assume(False)  # beyond 2^62 somewhere
    got, want = words_of(b, T)
    assert (got == want).all(), f"{text} T={T} W={W} S={S}: {b.c_bits}"


# comparisons that the spans cover, of i-only terms with j once (or j's floor division), either side
IONLY = st.recursive(st.sampled_from(["i", "T", "W", "S"]) | st.integers(-40, 40).map(str), _ints, max_leaves=3)
JLIN = st.tuples(st.sampled_from(["j", "-j", "(0 - j)", "j * 1", "(-1) * j", "(2 * j - j)"]), IONLY) \
    .map(lambda t: f"({t[0]} + {t[1]})")
JDIV = st.tuples(JLIN, st.integers(1, 70)).map(lambda t: f"({t[0]} // {t[1]})")
JTERM = st.one_of(JLIN, JDIV, st.tuples(JDIV, IONLY).map(lambda t: f"({t[1]} - {t[0]})"),
                  JLIN.map(lambda a: f"abs({a})"),
                  st.tuples(st.sampled_from(["min", "max"]), JLIN, IONLY | JLIN).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"))
SPANS = st.tuples(JTERM, st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), IONLY, st.booleans()) \
    .map(lambda t: f"({t[0]} {t[1]} {t[2]})" if t[3] else f"({t[2]} {t[1]} {t[0]})")
SPAN_TREES = st.recursive(SPANS, lambda sub: st.one_of(
    st.tuples(sub, st.sampled_from(["&", "|"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    sub.map(lambda a: f"~{a}")), max_leaves=3)
VALUES = st.integers(-50, 50) | st.integers(-2 ** 45, 2 ** 45)  # large ones: 64-bit atoms


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SPAN_TREES, st.integers(1, 90), VALUES, VALUES)
def test_random_span_expressions(text, T, W, S):
    check_random(text, T, W, S)


# ---- what the form covers, in which width ------------------------------------------------------------
def test_the_llm_custom_instances_are_spans_in_32_bits():
    from attnbench.configs import LLM

    exprs = [i.param_dict["expr"] for i in LLM.instances if i.pattern == "custom"]
    assert exprs == ["(j < 16) | (i - j < 64)", "i - j < 256", "i // 128 == j // 128"]
    for T in LLM.Ts:
        assert [kinds(e, T) for e in exprs] == [[("lin", True)] * 2, [("lin", True)], [("div", True)]]
    assert bind("(j < 16) | (i - j < 64)", 32768).c_bits == \
        "(ab_cmp_word<AB_LT>(ab_clamp_word((-(ab_j0-16))))|ab_cmp_word<AB_GT>(ab_clamp_word(((ab_i-ab_j0)-64))))"


@pytest.mark.parametrize("text,params,want", [
    ("abs(i - j) < W", (("W", 3),), ["lin", "lin"]),
    ("(j < S) | (abs(i - j) < W)", (("S", 3), ("W", 4)), ["lin", "lin", "lin"]),
    ("(abs(i - j) < W * R) & (abs(i - j) % R == 0)", (("R", 3), ("W", 4)), ["lin", "lin", "each"]),
    ("((i - j) // 4 == 0) | (i // B == j // B) | (j >= max(T - 8, 0)) | (j < min(P, T))",
     (("B", 33), ("P", 3)), ["div", "div", "lin", "lin"]),
    ("min(i // A, 1) == min(j // A, 1)", (("A", 50),), ["div", "rows", "div", "rows"]),
    ("(i != 3) & (j <= i)", (), ["rows", "lin"]),
    ("j % 8 == 0", (), ["each"]),
    ("j * 2 < i", (), ["each"]),
    ("min(i, j) % 3 == max(-j, 1 - T)", (), ["each"]),  # split, it would be four words key by key: one
    ("max(i * j, j) < 9", (), ["each"]),
    ("1 < 2", (), []),
])
def test_atoms_by_kind(text, params, want):
    assert [k for k, _ in kinds(text, 1000, params)] == want


def test_widths_and_one_text_for_every_T():
    assert kinds("j + W > W - 5", params=(("W", 2 ** 40),)) == [("lin", False)]
    assert kinds("j + W > W - 5", params=(("W", LIM32 - REF_T - 100),)) == [("lin", True)]
    assert kinds("(i - j) // K == 0", params=(("K", 2 ** 40),)) == [("div", False)]
    # judged over positions up to REF_T whatever T is: an expression without T gives one text
    texts = {bind("(j < 16) | (i - j < 64) | (j // 7 == i // 3)", T).c_bits for T in (1, 100, 32768, REF_T)}
    assert len(texts) == 1 and "long long" not in texts.pop()
    assert kinds("i * 300 - j < 5", REF_T) == [("lin", False)]  # 300 REF_T > 2^29
    assert kinds("i * 200 - j < 5", REF_T) == [("lin", True)]


def test_device_constants_carry_both_forms():
    m = make_mask("custom", 4096, True, expr="(j < 16) | (i - j < W)", param="W=64")
    d = m.device_defines()
    assert d["AB_CUSTOM_EXPR"] == "((ab_j<16LL)|((ab_i-ab_j)<64LL))"
    assert d["AB_CUSTOM_BITS"] == m.pattern.bound(4096, m.params).c_bits


# ---- the generated C on the host, with the device helpers of kernels/ ------------------------------------
HOST_T = 150
SHIM = r"""
#pragma once
#include <algorithm>
using std::max;
using std::min;
#define __device__
#define __forceinline__ inline
float __uint_as_float(unsigned);  // declared for common.cuh's float helpers, which no test calls
"""


def host_common() -> str:
    """kernels/common.cuh for g++: its PTX shifts as C shifts that give 0 from 32 on (PTX clamps the
    count to 32); everything else as it is (the asm of unused functions is never emitted)."""
    text = (kc.kernel_dir() / "common.cuh").read_text()
    for name, op in (("ab_shl", "<<"), ("ab_shr", ">>")):
        start = text.index(f"__device__ __forceinline__ unsigned {name}(")
        end = text.index("}\n", start) + 2
        text = text[:start] + (f"__device__ __forceinline__ unsigned {name}(unsigned x, unsigned n) "
                               f"{{ return n >= 32u ? 0u : x {op} n; }}\n") + text[end:]
    return SHIM + text.replace("#pragma once", "")


@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_the_c_text_on_the_host_is_the_expression_bit_for_bit(tmp_path):
    cases = [(t, p) for t, p in MORE + EXAMPLES]
    bounds = [bind(t, HOST_T, tuple(p)) for t, p in cases]
    (tmp_path / "common.cuh").write_text(host_common())
    funcs = "\n".join(f"static unsigned f{n}(int ab_i, int ab_j0) {{ return {b.c_bits}; }}" for n, b in enumerate(bounds))
    table = ", ".join(f"f{n}" for n in range(len(bounds)))
    (tmp_path / "main.cpp").write_text(
        f'#include "{kc.kernel_dir() / "patterns" / "custom.cuh"}"\n{funcs}\n'
        f"static unsigned (*fs[])(int, int) = {{{table}}};\n"
        "#include <cstdio>\nint main() {\n"
        f"  for (auto f : fs) for (int i = 0; i < {HOST_T}; ++i) for (int j0 = 0; j0 <= {HOST_T + 32}; ++j0) {{\n"
        "    unsigned w = f(i, j0); fwrite(&w, 4, 1, stdout); }\n  return 0;\n}\n")
    exe = tmp_path / "bits"
    r = subprocess.run(["g++", "-std=c++17", "-O1", "-Wno-unknown-pragmas", f"-I{tmp_path}", "-DAB_CUSTOM_EXPR=true",
                        "-o", str(exe), str(tmp_path / "main.cpp")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    out = np.frombuffer(subprocess.run([str(exe)], check=True, capture_output=True).stdout, dtype=np.uint32)
    out = out.reshape(len(bounds), HOST_T, HOST_T + 33)
    for n, b in enumerate(bounds):
        assert (out[n] == b.bits(np.arange(HOST_T)[:, None], np.arange(HOST_T + 33)[None, :])).all(), cases[n]
        got, want = words_of(b, HOST_T)
        assert (got == want).all()


# ---- NVRTC: every form compiles; the kernels that take the predicate -------------------------------------
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_generated_form_compiles(arch):
    """All the forms above in one program: a kernel that calls each (so each is compiled to code)."""
    bounds = [bind(t, 1000, tuple(p)) for t, p in ALL]
    defines = make_mask("custom", 1000, False, expr="j <= i").device_defines(runtime=True)
    src = kc.source("predicate", defines)
    funcs = "\n".join(f"__device__ unsigned f{n}(int ab_i, int ab_j0) {{ return {b.c_bits}; }}"
                      for n, b in enumerate(bounds))
    calls = " ^ ".join(f"f{n}(i, j0)" for n in range(len(bounds)))
    src += f'\n{funcs}\nextern "C" __global__ void all_forms(int i, int j0, unsigned* out) {{ *out = {calls}; }}\n'
    _, log = kc._nvrtc("forms", src, list(kc.options(defines)) + [f"-arch={arch}", "-Xptxas=-v"])
    assert [r.kernel for r in kc.parse_ptxas(log, "forms")] == ["all_forms", "predicate_bits"]


# every kind of atom, in both widths
KINDS_EXPR = ("((i - j) // 4 == 0) | (min(i, j) % 3 == max(-j, 1 - T)) | (abs(i - j) < W) | (j < S) "
              "| (i // B == j // B) | (j + V > V - 3) | ((j - V) // 9 == (i - V) // 9) | (j * V % 7 == 1)")


def kinds_mask(T, causal):
    return make_mask("custom", T, causal, expr=KINDS_EXPR, param=f"W=3,S=2,B=100,V={2 ** 40}")


def test_the_kinds_expression_has_every_kind_in_both_widths():
    got = set(kinds(KINDS_EXPR, 4096, (("B", 100), ("S", 2), ("V", 2 ** 40), ("W", 3))))
    assert got == {(k, w) for k in ("lin", "div", "each") for w in (True, False)}
    check(KINDS_EXPR, 300, (("B", 100), ("S", 2), ("V", 2 ** 40), ("W", 3)))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_predicate_classify_naive_decode_and_backward_compile_with_the_bits_form(arch):
    from attnbench import bwd_config, decode_config

    m = kinds_mask(4096, True)
    d = m.device_defines(runtime=True)
    assert "AB_CUSTOM_BITS" in d
    for source, kernels, extra in [("predicate", ["predicate_bits"], {}), ("classify", ["classify_tiles"], {}),
                                   ("naive", ["naive_dense", "naive_sparse"], dict(MAX_T=1, MAX_KEYS=1024, C=64))]:
        assert sorted(r.kernel for r in kc.compile_only(source, {**d, **extra}, arch)) == kernels
    for D in (64, 128):
        for r in kc.compile_only("decode", decode_config.kernel_defines(D, "bfloat16", m), arch):
            assert r.spill_stores == 0, r
        for r in kc.compile_only("fast_tc_bwd", bwd_config.bwd_defines(D, "bfloat16", m), arch):
            assert r.spill_stores == 0, r


def text_instructions(cubin: bytes) -> dict:
    """SASS instructions per kernel of a cubin (the size of its .text section / 16 bytes)."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    size, count, names = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [struct.unpack_from("<IIQQQQ", cubin, shoff + k * size) for k in range(count)]
    base = sections[names][4]
    out = {}
    for name, _, _, _, _, nbytes in sections:
        label = cubin[base + name:cubin.index(b"\0", base + name)].decode()
        if label.startswith(".text."):
            out[label[6:]] = nbytes // 16
    return out


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("wgmma", [False, True])
def test_fast_tc_of_the_llm_expressions_is_the_built_ins_code(D, wgmma):
    """The custom instances that equal streaming 16+64 and window 256 compile, in the llm shapes at
    T=32768, to as many instructions and registers as the built-ins (the old per-key loop cost
    80 to 160 instructions more and up to 13 registers); no build spills."""
    from attnbench import fwd_config

    def build(mask):
        d = fwd_config.kernel_defines(D, "bfloat16", mask, fwd_config.choose_config(mask, D, wgmma))
        arch = kc.target_arch(d, "sm_90")
        cubin, log = kc._nvrtc("fast_tc", kc.source("fast_tc", d), list(kc.options(d)) + [f"-arch={arch}", "-Xptxas=-v"])
        (r,) = kc.parse_ptxas(log, "fast_tc")
        assert r.spill_stores == 0 and r.spill_loads == 0
        return text_instructions(cubin)[r.kernel], r.registers

    for expr, name, params in (("(j < 16) | (i - j < 64)", "streaming", dict(sink=16, window=64)),
                               ("i - j < 256", "window", dict(window=256))):
        (ci, cr), (bi, br) = build(make_mask("custom", 32768, True, expr=expr)), build(make_mask(name, 32768, True, **params))
        assert ci <= bi and cr <= br, (expr, D, wgmma, (ci, cr), (bi, br))
    build(make_mask("custom", 32768, False, expr="i // 128 == j // 128"))
    build(kinds_mask(32768, True))


# ---- on a device ------------------------------------------------------------------------------------
KINDS_PARAMS = (("B", 100), ("S", 2), ("V", 2 ** 40), ("W", 3))


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_device_words_are_the_expression_bit_for_bit(causal):
    """kernels/predicate.cu's ab_allowed_bits (the bits form) and ab_allowed against the expression,
    for every expression above that is a valid mask or not (no mask needed: the bound expression)."""
    from types import SimpleNamespace

    from test_predicate import check_bits

    T = 320
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    for text, params in MORE + EXAMPLES + [(KINDS_EXPR, KINDS_PARAMS)]:
        b = bind(text, T, tuple(params))
        defines = {"AB_PATTERN_T": "ab_custom", "AB_PATTERN_ARGS": "causal", "AB_CUSTOM_EXPR": b.c,
                   "AB_CUSTOM_BITS": b.c_bits}
        truth = np.broadcast_to(b.allowed(i, j), (T, T)) & ((j <= i) if causal else True)
        fake = SimpleNamespace(T=T, causal=causal, table=None, device_args=lambda: np.zeros(1, np.int32),
                               device_defines=lambda runtime=False, d=defines: d)
        check_bits(fake, truth)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_fast_tc_passes_the_gate_on_every_kind_of_word(causal):
    from attnbench.check import gate
    from attnbench.fast_tc import IMPL, SYNC_IMPL
    from attnbench.impls import Problem

    for T in (777, 4099):
        mask = kinds_mask(T, causal)
        for impl in (IMPL, SYNC_IMPL):
            for D in (64, 128):
                res = gate(impl, Problem(mask, 1, 2, D, "bfloat16"))
                assert res.ok, (impl.name, T, D, res)
