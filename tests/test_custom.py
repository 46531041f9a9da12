"""The custom pattern: built-in patterns written as expressions give the built-ins' masks, counts and
tile lists; its parameters, labels, device constants, kernels and refusals on every command."""
import json

import numpy as np

import pytest
from click.testing import CliRunner

from attnbench import classify as cl
from attnbench import compile as kc
from attnbench.cli import main
from attnbench.errors import BadInput
from attnbench.patterns import make_mask
from attnbench.patterns.base import divisors_of
from attnbench.tiles import build

from test_classify import flags, truth

# built-in patterns as expressions: (name, its parameters at T, the expression, the expression's parameters)
BUILTINS = [
    ("dense", lambda T: {}, "j >= 0", {}),
    ("window", lambda T: {"window": 5}, "abs(i - j) < W", {"W": 5}),
    ("streaming", lambda T: {"sink": min(3, T), "window": 4}, "(j < S) | (abs(i - j) < W)", {"S": 3, "W": 4}),
    ("block_diagonal", lambda T: {"block": divisors_of(T, [16, 7])[0]}, "i // B == j // B",
     lambda T: {"B": divisors_of(T, [16, 7])[0]}),
    ("dilated", lambda T: {"window": 4, "dilation": 3}, "(abs(i - j) < W * R) & (abs(i - j) % R == 0)",
     {"W": 4, "R": 3}),
    ("prefix_lm", lambda T: {"prefix": T // 3}, "(j < P) | (j <= i)", lambda T: {"P": T // 3}),
    ("document", lambda T: {"doc_lens": (T // 2, T - T // 2)} if T > 1 else {"doc_lens": (1,)},
     "min(i // A, 1) == min(j // A, 1)", lambda T: {"A": max(1, T // 2)}),
]
TS = (1, 7, 64, 100, 257, 1000)
CASES = [(n, T, c) for n in range(len(BUILTINS)) for T in TS for c in (True, False)]


def as_custom(n, T, causal):
    name, ps, text, named = BUILTINS[n]
    named = named(T) if callable(named) else named
    return make_mask(name, T, causal, **ps(T)), make_mask("custom", T, causal, expr=text, param=named)


@pytest.mark.parametrize("n,T,causal", CASES, ids=[f"{BUILTINS[n][0]}-T{T}-{'c' if c else 'nc'}" for n, T, c in CASES])
def test_builtins_as_expressions_give_their_masks_counts_and_tile_lists(n, T, causal):
    ref, m = as_custom(n, T, causal)
    assert (m.dense() == ref.dense()).all()
    assert (m.row_counts() == ref.row_counts()).all() and m.pairs == ref.pairs and m.max_keys == ref.max_keys
    for tile in ((64, 64), (64, 32), (16, 16), (48, 16), (128, 64)):
        ours, theirs = flags(m.tiles(*tile), T), flags(build(ref, *tile), T)
        assert (ours == truth(ref, *tile)).all()
        assert ((ours > 0) == ((theirs > 0) & (truth(ref, *tile) > 0))).all(), "a tile with pairs missed or added"
        assert not ((theirs == 2) & (ours != 2)).any(), "a full tile of the built-in's list is partial here"


def test_a_row_without_a_key_is_refused_naming_it():
    with pytest.raises(BadInput, match=r"row 0 allows no key \(and 99 more rows\) at T=100, causal"):
        make_mask("custom", 100, True, expr="j > i")
    with pytest.raises(BadInput, match=r"row 3 allows no key at T=10, non-causal"):
        make_mask("custom", 10, False, expr="(i != 3) & (j <= i)")
    make_mask("custom", 100, False, expr="j > i | i == T - 1")  # every row has one


@pytest.mark.parametrize("given", ["S=4,W=1024", ("W=1024", "S=4"), ("W=1024,S=4",), {"W": 1024, "S": 4},
                                   [["S", 4], ["W", 1024]], " W = 1024 , S=4"])
def test_named_integers_in_every_spelling(given):
    m = make_mask("custom", 64, True, expr="(i - j < W) | (j < S)", param=given)
    assert m.params["param"] == (("S", 4), ("W", 1024))


@pytest.mark.parametrize("given,words", [
    (("W=1", "W=2"), ["param W is given twice"]),
    ("W", ["'W' must be NAME=VALUE"]),
    ("W=x", ["param W='x' must be an integer"]),
    ("2W=1", ["'2W' must be NAME=VALUE"]),
    ("i=3", ["param name 'i' is reserved"]),
    ("min=3", ["param name 'min' is reserved"]),
])
def test_bad_named_integers_are_refused(given, words):
    with pytest.raises(BadInput) as e:
        make_mask("custom", 64, True, expr="j <= i", param=given)
    for w in words:
        assert w in str(e.value)


def test_the_expression_must_be_text():
    with pytest.raises(BadInput, match="expr=3 must be a string"):
        make_mask("custom", 64, True, expr=3)


def test_labels_name_the_expression_and_its_values():
    m = make_mask("custom", 64, True, expr="(i - j < W) | (j < S)", param="W=16,S=4")
    assert m.label() == "custom(expr=(i - j < W) | (j < S),S=4,W=16)"
    assert m.pattern.short_label(m.params) == "(i - j < W) | (j < S) S=4,W=16"
    long = make_mask("custom", 64, True, expr="(i - j < 64)   |   (j < 16) | (j % 512 == 0) | (j >= T - 3)")
    short = long.pattern.short_label(long.params)
    assert len(short) == 40 and short.endswith("…") and "  " not in short


def test_device_constants_carry_the_expression_with_T_and_values_as_literals():
    m = make_mask("custom", 100, True, expr="(i - j < W) | (j >= T - S)", param="W=8,S=2")
    d = m.device_defines()
    assert d == {"AB_PATTERN_T": "ab_custom", "AB_PATTERN_ARGS": "1",
                 "AB_CUSTOM_EXPR": "(((ab_i-ab_j)<8LL)|(ab_j>=98LL))",
                 "AB_CUSTOM_BITS": "(ab_cmp_word<AB_GT>(ab_clamp_word(((ab_i-ab_j0)-8)))"
                                   "|ab_cmp_word<AB_GE>(ab_clamp_word((-(ab_j0-98)))))"}
    assert m.device_defines(runtime=True)["AB_PATTERN_ARGS"] == "causal"
    assert m.device_args().tolist() == [0]
    # without T, one build serves every T
    a, b = (make_mask("custom", T, True, expr="i - j < 8").device_defines() for T in (100, 1000))
    assert a == b


EXPR_FOR_KERNELS = "((i - j) // 4 == 0) | (min(i, j) % 3 == max(-j, 1 - T)) | (abs(i - j) < W)"


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("source,kernels", [("predicate", ["predicate_bits"]), ("classify", ["classify_tiles"]),
                                            ("naive", ["naive_dense", "naive_sparse"])])
def test_kernels_compile_with_an_expression(arch, source, kernels):
    m = make_mask("custom", 1000, False, expr=EXPR_FOR_KERNELS, param="W=3")
    defines = m.device_defines(runtime=True)
    if source == "naive":
        defines.update(MAX_T=1, MAX_KEYS=1024, C=64)
    assert sorted(r.kernel for r in kc.compile_only(source, defines, arch)) == kernels


def test_fast_tc_and_fast_f32_compile_with_an_expression():
    from attnbench import fast_f32, fwd_config

    m = make_mask("custom", 4096, True, expr=EXPR_FOR_KERNELS, param="W=3")
    for wgmma in (False, True):
        d = fwd_config.kernel_defines(64, "bfloat16", m, fwd_config.choose_config(m, 64, wgmma))
        assert d["AB_CUSTOM_EXPR"] == m.pattern.bound(4096, m.params).c
        assert d["AB_CUSTOM_BITS"] == m.pattern.bound(4096, m.params).c_bits
        (r,) = kc.compile_only("fast_tc", d, kc.target_arch(d, "sm_90"))
        assert r.spill_stores == 0
    assert [r.kernel for r in kc.compile_only("fast_f32", fast_f32.defines(64, m), "sm_80")] == \
        ["fast_f32_merge", "fast_f32_split"]


def test_constants_with_spaces_and_parentheses_reach_nvrtc_as_one_option():
    defines = {"AB_PATTERN_T": "ab_custom", "AB_PATTERN_ARGS": "causal",
               "AB_CUSTOM_EXPR": "( ab_floormod( ab_i - ab_j, 3LL ) == 0LL ) | ( ab_j < 2LL )"}
    assert "-DAB_CUSTOM_EXPR=( ab_floormod( ab_i - ab_j, 3LL ) == 0LL ) | ( ab_j < 2LL )" in kc.options(defines)
    assert [r.kernel for r in kc.compile_only("predicate", defines, "sm_80")] == ["predicate_bits"]


def test_a_kernel_without_the_expression_is_refused_by_the_compiler():
    with pytest.raises(RuntimeError, match="AB_CUSTOM_EXPR must be defined"):
        kc.compile_only("predicate", {"AB_PATTERN_T": "ab_custom", "AB_PATTERN_ARGS": "causal"}, "sm_80")


# ---- the command line: refused before any device -----------------------------------------------------
@pytest.fixture
def no_launch(monkeypatch):
    from attnbench import impls

    def boom(*a, **k):
        raise AssertionError("a kernel was loaded for input that should have been refused")
    monkeypatch.setattr(kc, "get_module", boom)
    monkeypatch.setattr(cl, "device", boom)
    monkeypatch.setattr(impls.Impl, "availability", lambda self: None)  # as if a device were there


def refused(r, col, *words):
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = r.stderr.splitlines()
    assert lines[0].startswith("error: expr: ") and lines[0].endswith(f"at column {col}"), r.stderr
    assert lines[-1] == "  " + " " * (col - 1) + "^"
    for w in words:
        assert w in lines[0]


BAD = [
    ("(i - j < W) | (j ^ 3)", 18, ["unexpected character '^'"]),
    ("((i - j < W) | (j < 3)", 1, ["never closed"]),
    ("(i - j < W)) | (j < 3)", 12, ["unexpected token ')'"]),
    ("i < j < 3", 7, ["comparisons do not chain"]),
    ("(i - j) | (j < 3)", 1, ["'|' takes booleans", "'(i - j)' is an integer"]),
    ("i - j < V", 9, ["undeclared name 'V'"]),
    ("i // (W - 64) == 0", 6, ["divisor '(W - 64)' of '//' is 0 (W=64)"]),
    ("j % i == 0", 5, ["divisor of '%' must be constant"]),
]


@pytest.mark.parametrize("expr,col,words", BAD)
def test_run_refuses_a_bad_expression_naming_the_column(expr, col, words, no_launch):
    refused(CliRunner().invoke(main, ["run", "--pattern", "custom", "--expr", expr, "--param", "W=64"]), col, *words)


@pytest.mark.parametrize("cmd", [["check"], ["sweep", "--config", "llm"]])
def test_check_and_sweep_refuse_a_bad_expression_before_anything(cmd, no_launch, tmp_path, monkeypatch):
    from attnbench import sweep as sw

    monkeypatch.setattr(sw, "device_context", lambda **kw: pytest.fail("the device was touched"))
    args = cmd + ["--pattern", "custom", "--expr", "j < 3 < i", "--param", "W=64"]
    if cmd[0] == "sweep":
        args += ["--out", str(tmp_path / "r.csv")]
    refused(CliRunner().invoke(main, args), 7, "comparisons do not chain")
    assert not list(tmp_path.iterdir())


def test_run_refuses_a_row_without_a_key(no_launch):
    r = CliRunner().invoke(main, ["run", "--pattern", "custom", "--expr", "j > i", "--T", "64"])
    assert r.exit_code == 2 and r.stderr.startswith("error: custom: row 0 allows no key"), r.output


def test_check_takes_the_options_of_the_patterns_it_checks(no_launch):
    r = CliRunner().invoke(main, ["check", "--pattern", "window", "--expr", "j <= i"])
    assert r.exit_code == 2 and "--expr: none of the patterns checked takes it (it is a parameter of custom)" in r.stderr
    from attnbench.cli import check_cases

    cases = list(check_cases(["custom", "window"], (5, 9), {"expr": "j <= i", "param": ("W=1",)}))
    assert cases[:2] == [("custom", {"expr": "j <= i", "param": ("W=1",)}, 5),
                         ("custom", {"expr": "j <= i", "param": ("W=1",)}, 9)]
    assert [c[0] for c in cases[2:]] == ["window"] * (len(cases) - 2)  # its examples


def test_sweep_takes_expressions_as_an_axis_and_the_named_integers_for_all():
    from attnbench import sweep as sw

    insts = sw.instances("seed", ("custom", "window"), expr=("i - j < W", "(j < S) | (i - j < W)"),
                         param=(("W=8", "S=2"),), window=(4,))
    got = [(i.pattern, i.param_dict) for i in insts]
    assert got == [("custom", {"expr": "i - j < W", "param": (("S", 2), ("W", 8))}),
                   ("custom", {"expr": "(j < S) | (i - j < W)", "param": (("S", 2), ("W", 8))}),
                   ("window", {"window": 4})]
    with pytest.raises(BadInput, match="undeclared name 'S'"):
        sw.instances("seed", ("custom",), expr=("j < S",))


def test_the_llm_config_holds_three_built_ins_as_expressions():
    from attnbench.configs import LLM

    pairs = {("custom", "(j < 16) | (i - j < 64)", True): ("streaming", {"sink": 16, "window": 64}, True),
             ("custom", "i - j < 256", True): ("window", {"window": 256}, True),
             ("custom", "i // 128 == j // 128", False): ("block_diagonal", {"block": 128}, False)}
    held = {(i.pattern, i.param_dict.get("expr"), i.causal): i for i in LLM.instances}
    for key, (name, ps, causal) in pairs.items():
        assert key in held
        assert any(i.pattern == name and i.causal == causal and all(i.param_dict[k] == v for k, v in ps.items())
                   for i in LLM.instances)
        a, b = held[key].mask(4096), make_mask(name, 4096, causal, **ps)
        assert a.pairs == b.pairs and (a.row_counts() == b.row_counts()).all()


def test_rows_of_custom_instances_keep_their_identity_through_the_csv():
    from attnbench.results import params_json, row_key

    p = make_mask("custom", 64, True, expr="i - j < W", param="W=4").params
    row = dict(impl="x", pattern="custom", params=params_json(p), causal=True, B=1, H=1, T=64, D=16, dtype="float32")
    again = dict(row, params=json.dumps(json.loads(row["params"])), causal="True", T="64")
    assert row_key(row) == row_key(again)
    assert json.loads(row["params"]) == {"expr": "i - j < W", "param": [["W", 4]]}


def test_plots_and_readme_take_custom_rows(tmp_path):
    """A tiny sweep through the fake implementations with custom rows: plotted, and tabled in the
    README's generated parts, under short labels."""
    from fakes import PEAKS, PROVENANCE, FakeTimer, fake_impls, host_inputs

    from attnbench.plot import plot_csv
    from attnbench.readme import render, render_headline
    from attnbench.results import ResultWriter, read_results
    from attnbench.sweep import Context, plan, run_sweep

    impls = [i for i in fake_impls() if i.name in ("fake-exact", "fake-peer")]
    ctx = Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                  cleanup=lambda: None, command="test")
    cases = plan("seed", patterns=("dense", "custom"), expr=("i - j < W", "(j < S) | (i - j < W) | (j % 64 == 0)"),
                 param=(("W=16", "S=4"),), T_min=32, T_max=128, B=1, H=2, D=(16,))
    out = tmp_path / "c.csv"
    with ResultWriter(out) as w:
        counts = run_sweep(cases, impls, w, ctx)
    assert counts["ok"] == len(cases) * 2
    df = read_results(out)
    assert set(df["label"]) == {"dense", "custom(expr=i - j < W,S=4,W=16)",
                                "custom(expr=(j < S) | (i - j < W) | (j % 64 == 0),S=4,W=16)"}
    assert len(plot_csv(out, tmp_path / "plots")) == 5
    text = render_headline([str(out)]) + render([str(out)])
    assert "| custom i - j < W S=4,W=16 |" in text
    assert "| custom (j < S) \\| (i - j < W) \\| (j % 64 == 0) S… |" in text  # a bare | would cut the table
    assert "custom expression" in text  # what its label spells


# ---- on a device ------------------------------------------------------------------------------------
GPU_T = 320


@pytest.mark.gpu
@pytest.mark.parametrize("n,causal", [(n, c) for n in range(len(BUILTINS)) for c in (True, False)])
def test_device_predicate_of_built_ins_as_expressions_is_the_mask_bit_for_bit(n, causal):
    from test_predicate import check_bits

    ref, mask = as_custom(n, GPU_T, causal)
    check_bits(mask, ref.dense())


@pytest.mark.gpu
@pytest.mark.parametrize("n", range(len(BUILTINS)))
def test_device_lists_and_counts_of_built_ins_as_expressions(n):
    for T, causal in ((4099, True), (8192, False)):
        ref, m = as_custom(n, T, causal)
        got = cl.device(m, 64, 32)
        assert (got.row_counts == ref.row_counts()).all()
        ours, theirs = flags(got.tiles, T), flags(build(ref, 64, 32), T)
        assert not ((theirs == 2) & (ours != 2)).any() and not ((ours > 0) & (theirs == 0)).any()
        assert (flags(cl.host(m, 64, 32, m.pattern.bound(T, m.params).boxes).tiles, T) == ours).all()


def test_predicate_looks_nothing_up_when_called(monkeypatch):
    """FlexAttention traces the mask_mod under torch.compile: a cache lookup inside (custom's bound
    expression) would break the graph and build the block mask eagerly over all T x T pairs. The
    predicate resolves the expression when it is made; calling it needs no lookup."""
    from attnbench.patterns import custom as custom_mod
    from attnbench.patterns import make_mask

    m = make_mask("custom", 256, True, expr="(j < 4) | (i - j < W)", param=(("W", 16),))
    pred = m.pattern.predicate(m.T, m.causal, m.params, None)
    want = m.dense()

    def no_lookup(*a, **k):
        raise AssertionError("bind called inside the predicate")

    monkeypatch.setattr(custom_mod, "bind", no_lookup)
    i, j = np.arange(256)[:, None], np.arange(256)[None, :]
    got = pred(i, j) & (j <= i)
    assert (got == want).all()
