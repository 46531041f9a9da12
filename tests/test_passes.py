"""The pass axis (fwd, bwd, fwd+bwd): FLOPs and bytes per SPEC section 3, implementations that say
which passes they compute (the tensor-core family and the peers all three, the others the forward
only), --pass on the commands, the pass column and older CSVs without it, plots and tables per pass."""
import csv
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent / "data"))

from fakes import PEAKS, PROVENANCE, FakeImpl, FakeTimer, host_inputs  # noqa: E402

from attnbench import sweep as sw  # noqa: E402
from attnbench.cli import main  # noqa: E402
from attnbench.configs import LLM, get_config  # noqa: E402
from attnbench.errors import BadInput  # noqa: E402
from attnbench.impls import PASSES, Problem, all_impls  # noqa: E402
from attnbench.patterns import make_mask  # noqa: E402
from attnbench.plot import plot_csv  # noqa: E402
from attnbench.readme import render, render_headline  # noqa: E402
from attnbench.results import COLUMNS, KEY_COLUMNS, ResultWriter, read_results, row_key  # noqa: E402

SMALL = Path(__file__).parent / "data" / "small.csv"


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_flops_and_bytes_per_pass(dtype):
    m = make_mask("window", 1000, True, window=37)
    B, H, T, D = 2, 3, 1000, 64
    it = {"bfloat16": 2, "float32": 4}[dtype]
    fwd, bwd, step = (Problem(m, B, H, D, dtype, pass_name=p) for p in PASSES)
    assert fwd.flops == 4 * D * m.pairs * B * H == fwd.fwd_flops == bwd.fwd_flops
    assert bwd.flops == 10 * D * m.pairs * B * H
    assert step.flops == 14 * D * m.pairs * B * H
    assert fwd.bytes_floor == 4 * B * H * T * D * it
    # Q, K, V, O, dO and the float32 log-sum-exp read; dQ, dK, dV written
    assert bwd.bytes_floor == 5 * B * H * T * D * it + 4 * B * H * T + 3 * B * H * T * D * it
    assert step.bytes_floor == fwd.bytes_floor + bwd.bytes_floor


def test_an_unknown_pass_is_refused():
    with pytest.raises(BadInput, match="pass='backward' is not one of fwd, bwd, fwd\\+bwd"):
        Problem(make_mask("dense", 8), 1, 1, 16, "float32", pass_name="backward")


# the tensor-core family (attnbench/fast_tc_bwd.py) and the peers (attnbench/peers/); the float32
# family (naive, fast-f32) and fast-decode stay forward-only
BACKWARD_IMPLS = {"fast-tc", "fast-tc-sync", "fast-tc-classes", "cublas", "sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math",
                  "flex"}


@pytest.mark.parametrize("pass_name", ["bwd", "fwd+bwd"])
def test_implementations_without_a_backward_say_so(pass_name):
    impls = all_impls()
    assert {n for n, i in impls.items() if i.passes != ("fwd",)} == BACKWARD_IMPLS
    assert all(impls[n].passes == PASSES for n in BACKWARD_IMPLS)
    for impl in (i for n, i in impls.items() if n not in BACKWARD_IMPLS):
        assert impl.passes == ("fwd",)
        prob = Problem(make_mask("dense", 64), 1, 1, 64, impl.dtypes[0], pass_name=pass_name)
        why = impl.unsupported(prob)
        assert why == f"pass={pass_name} is not supported by {impl.name} (supports: {', '.join(impl.passes)})"
        with pytest.raises(BadInput, match=f"not supported by {impl.name}"):
            impl.require(prob)  # the input first: refused on a machine without a GPU too


def test_the_training_config_is_llm_at_every_pass():
    t = get_config("training")
    assert t.passes == PASSES and LLM.passes == ("fwd",)
    assert (t.instances, t.Ts, t.D, t.dtype, t.B, t.H) == (LLM.instances, LLM.Ts, LLM.D, LLM.dtype, LLM.B, LLM.H)
    cases = sw.plan("training", T=(4096,), D=(64,))
    assert len(cases) == 3 * len(LLM.instances)
    assert [c.pass_name for c in cases[:3]] == list(PASSES) and cases[0].inst == cases[2].inst
    assert {c.pass_name for c in sw.plan("llm", T=(4096,))} == {"fwd"}
    assert {c.pass_name for c in sw.plan("llm", T=(4096,), passes=("bwd",))} == {"bwd"}
    with pytest.raises(BadInput, match="pass='x'"):
        sw.plan("llm", passes=("x",))


def test_rows_of_each_pass_are_their_own_and_unsupported_passes_skip():
    impls = [FakeImpl("a")]
    ctx = sw.Context(time=FakeTimer(impls), peaks=PEAKS, provenance=dict(PROVENANCE), inputs=host_inputs,
                     cleanup=lambda: None)
    rows = []
    for case in sw.plan("seed", T=(32,), D=(16,), patterns=("window",), passes=PASSES):
        rows += sw.run_case(case, impls, ctx)
    assert [r["pass"] for r in rows] == list(PASSES)
    assert rows[0]["status"] == "ok"
    for r in rows[1:]:
        assert r["status"] == "skipped" and r["reason"] == f"pass={r['pass']} is not supported by a (supports: fwd)"
    assert rows[1]["flops"] == rows[0]["flops"] // 4 * 10 and rows[2]["flops"] == rows[0]["flops"] // 4 * 14
    assert len({row_key(r) for r in rows}) == 3


def test_the_pass_is_a_key_column_and_older_rows_read_as_fwd(tmp_path):
    assert "pass" in COLUMNS and "pass" in KEY_COLUMNS
    df = read_results(SMALL)  # written before the column
    assert (df["pass"] == "fwd").all()
    with open(SMALL, newline="") as f:
        old = next(csv.DictReader(f))
    assert "pass" not in old and row_key(old) == row_key({**old, "pass": "fwd"})
    assert row_key(old) != row_key({**old, "pass": "bwd"})
    for name in ("seed-h200", "llm-h200"):
        p = Path(__file__).parent.parent / "results" / f"{name}.csv"
        assert (read_results(p)["pass"] == "fwd").all()


def test_an_older_csv_resumes_with_its_rows_rewritten(tmp_path):
    p = tmp_path / "old.csv"
    shutil.copy(SMALL, p)
    n = len(read_results(SMALL))
    warned = []
    w = ResultWriter(p, resume=True, warn=warned.append)
    with open(SMALL, newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(w.is_done(r) for r in rows)
    assert not w.is_done({**rows[0], "pass": "bwd"})
    with w:
        w.write([{**rows[0], "pass": "bwd"}])
    assert any("pass=fwd" in m for m in warned)
    with open(p, newline="") as f:
        r = csv.reader(f)
        assert next(r) == COLUMNS
    df = read_results(p)
    assert len(df) == n + 1 and list(df["pass"]).count("bwd") == 1
    w = ResultWriter(p, resume=True)  # now of this version
    assert w.is_done({**rows[0], "pass": "bwd"})


def _two_passes(tmp_path) -> Path:
    df = pd.read_csv(SMALL, keep_default_na=False, dtype=str)
    both = pd.concat([df.assign(**{"pass": "fwd"}), df.assign(**{"pass": "fwd+bwd"})])
    p = tmp_path / "train.csv"
    both.to_csv(p, index=False)
    return p


def test_plots_and_tables_of_several_passes_are_per_pass(tmp_path):
    p = _two_passes(tmp_path)
    names = {x.name for x in plot_csv(p, tmp_path)}
    single = {x.name for x in plot_csv(SMALL, tmp_path / "one")}
    assert names == {n.replace("small_", "train_").replace("_H2_", f"_H2_{tag}_") for n in single
                     for tag in ("fwd", "fwd-bwd")}
    full = render([str(p)], base=tmp_path)
    assert sum(x.startswith("### ") for x in full.splitlines()) == 2 and ", pass fwd+bwd: `" in full and ", pass fwd: `" in full
    assert "train_float32_D16_B1_H2_fwd-bwd_runtime.png" in full
    assert full.splitlines()[0].count("train.csv") == 1
    head = render_headline([str(p)], base=tmp_path)
    assert "pass fwd+bwd: float32" in head and "train_float32_D16_B1_H2_fwd_best-attnbench-vs-dense.png" in head


def test_pass_on_the_commands(tmp_path):
    r = CliRunner().invoke(main, ["run", "--pass", "bwd", "--impl", "naive", "--T", "64"])
    assert r.exit_code == 2 and "pass=bwd is not supported by naive (supports: fwd)" in r.output
    r = CliRunner().invoke(main, ["run", "--pass", "back"])
    assert r.exit_code == 2
    r = CliRunner().invoke(main, ["list"])
    assert r.exit_code == 0 and "pass fwd" in r.output and "forward-only" in r.output
    for cmd in ("run", "check", "sweep"):
        assert "--pass" in CliRunner().invoke(main, [cmd, "--help"]).output


def test_the_gate_of_a_backward_needs_the_output_gradient():
    from attnbench.check import judge

    prob = Problem(make_mask("dense", 8), 1, 1, 16, "float32", pass_name="bwd")
    with pytest.raises(ValueError, match="needs do"):
        judge(FakeImpl("a"), prob, None, None, None, None)


# -- a CSV of the training configuration's three passes (tests/data/train.csv) ---------------------------
TRAIN = Path(__file__).parent / "data" / "train.csv"
TAGS = {"fwd": "fwd", "bwd": "bwd", "fwd+bwd": "fwd-bwd"}


@pytest.fixture(scope="module")
def fresh_train(tmp_path_factory):
    """train.csv's sweep run again now: rows the code computes in this test run."""
    import make_small_csv

    path = tmp_path_factory.mktemp("fresh") / "train.csv"
    make_small_csv.build(path, make_small_csv.train_cases, make_small_csv.train_impls)
    return path


@pytest.mark.parametrize("which", ["committed", "fresh"])
def test_the_training_csv_holds_every_pass_with_its_flops_and_floor(which, request):
    df = read_results(TRAIN if which == "committed" else request.getfixturevalue("fresh_train"))
    assert (df["status"] == "ok").sum() > 0
    assert set(df["pass"]) == set(PASSES)
    for _, r in df[df["status"] == "ok"].iterrows():
        B, H, T, D = r["B"], r["H"], r["T"], r["D"]
        mult = {"fwd": 4, "bwd": 10, "fwd+bwd": 14}[r["pass"]]
        assert r["flops"] == mult * D * r["pairs"] * B * H
        fwd_bytes, bwd_bytes = 4 * B * H * T * D * 4, 8 * B * H * T * D * 4 + 4 * B * H * T
        assert r["bytes_floor"] == {"fwd": fwd_bytes, "bwd": bwd_bytes, "fwd+bwd": fwd_bytes + bwd_bytes}[r["pass"]]
        assert r["floor_ms"] == pytest.approx(max(r["flops"] / (r["peak_tflops"] * 1e12),
                                                  r["bytes_floor"] / (r["peak_tbps"] * 1e12)) * 1e3)
    skipped = df[df["impl"] == "fake-fwd-only"]
    assert set(skipped[skipped["status"] == "skipped"]["pass"]) == {"bwd", "fwd+bwd"}


def test_plots_of_the_training_csv_come_per_pass_and_never_mix_passes(tmp_path):
    import matplotlib.pyplot as plt

    from attnbench.plot import KINDS, group_figures, with_pass_tag

    names = {x.name for x in plot_csv(TRAIN, tmp_path)}
    assert names == {f"train_float32_D16_B1_H2_{tag}_{kind}.png" for tag in TAGS.values() for kind in KINDS}
    df = with_pass_tag(read_results(TRAIN))
    for p in PASSES:
        g = df[df["pass"] == p]
        figs = group_figures(g)
        try:
            flops = {"fwd": "4*D*pairs*B*H", "bwd": "10*D*pairs*B*H", "fwd+bwd": "14*D*pairs*B*H"}[p]
            assert f"Useful TFLOP/s ({flops} / median)" in figs["tflops"]._suptitle.get_text()
            assert f"pass {p}" in figs["runtime"]._suptitle.get_text()
            ax = next(a for a in figs["runtime"].axes if a.get_visible() and a.get_title() == "dense")
            line = next(x for x in ax.get_lines() if x.get_label() == "fake-exact")
            rows = g[(g["impl"] == "fake-exact") & (g["pattern"] == "dense")].sort_values("T")
            assert list(line.get_ydata()) == list(rows["median_ms"])  # this pass's points alone
        finally:
            for f in figs.values():
                plt.close(f)


def test_tables_of_the_training_csv_come_per_pass(tmp_path):
    full = render([str(TRAIN)], base=tmp_path)
    titles = [x for x in full.splitlines() if x.startswith("### ")]
    assert titles == [f"### training, pass {p}: `{TRAIN.as_posix()}`" for p in PASSES]
    bwd = full[full.index("### training, pass bwd"):full.index("### training, pass fwd+bwd")]
    assert "train_float32_D16_B1_H2_bwd_runtime.png" in bwd and "_fwd-bwd_" not in bwd
    assert "- fake-fwd-only: skipped at T=32, 64: pass=bwd is not supported by fake-fwd-only (supports: fwd)" in bwd
    df = read_results(TRAIN)
    r = df[(df["pass"] == "bwd") & (df["impl"] == "fake-exact") & (df["pattern"] == "dense") & (df["T"] == 64)].iloc[0]
    assert f"| 64 | {r['median_ms']:.4g} | {r['tflops']:.3g} |" in bwd
    head = render_headline([str(TRAIN)], base=tmp_path)
    for p in PASSES:
        assert f"**training, pass {p}: float32, B=1 H=2 D=16, T=64**" in head
        assert f"train_float32_D16_B1_H2_{TAGS[p]}_best-attnbench-vs-dense.png" in head


def test_a_csv_of_backward_rows_alone_is_still_named_by_its_pass(tmp_path):
    df = pd.read_csv(TRAIN, keep_default_na=False, dtype=str)
    p = tmp_path / "bwd.csv"
    df[df["pass"] == "bwd"].to_csv(p, index=False)
    names = {x.name for x in plot_csv(p, tmp_path)}
    assert names and all(n.startswith("bwd_float32_D16_B1_H2_bwd_") for n in names)
    assert "### training, pass bwd: `" in render([str(p)], base=tmp_path)
    # forward rows alone: as before, no pass in names or titles
    df[df["pass"] == "fwd"].to_csv(p, index=False)
    assert all("_fwd_" not in x.name for x in plot_csv(p, tmp_path / "f"))
    assert "pass fwd" not in render([str(p)], base=tmp_path)
