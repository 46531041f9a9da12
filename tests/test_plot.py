"""Plots from the small fixture CSV: files made, axes labelled, speedup matched on the right rows."""
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from click.testing import CliRunner

from attnbench.cli import main
from attnbench.patterns import BadInput
from attnbench.plot import GROUP, HEADLINE, KINDS, best_own_impl, group_figures, impl_order, plot_csv, with_speedup
from attnbench.results import read_results

SMALL = Path(__file__).parent / "data" / "small.csv"


def test_one_set_of_pngs_per_group(tmp_path):
    paths = plot_csv(SMALL, tmp_path)
    df = read_results(SMALL)
    groups = df[df["status"] == "ok"].groupby(GROUP).ngroups
    assert groups == 2
    assert len(paths) == 5 * groups
    # each file named for what it shows, none by the old names (throughput, speedup)
    assert {p.name for p in paths} == {f"small_{dtype}_D{D}_B1_H2_{kind}.png" for dtype, D in (("float32", 16),
                                                                                               ("float16", 32))
                                       for kind in ("runtime", "speedup-over-dense", "tflops", "share-of-floor",
                                                    "best-attnbench-vs-dense")}
    assert set(KINDS) == {p.name.split("_")[-1][:-4] for p in paths}
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_a_plot_is_written_in_256_colours_and_looks_as_drawn(tmp_path):
    import io

    import numpy as np
    from PIL import Image

    from attnbench.plot import palette_png

    fig = group_figures(read_results(SMALL))["runtime"]
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    rgba, small = buf.getvalue(), palette_png(buf.getvalue())
    a = np.asarray(Image.open(io.BytesIO(rgba)).convert("RGB"), dtype=np.int16)
    b = Image.open(io.BytesIO(small))
    assert b.mode == "P" and b.size == (a.shape[1], a.shape[0]) and len(small) < len(rgba) / 2
    assert np.abs(np.asarray(b.convert("RGB"), dtype=np.int16) - a).mean() < 2  # the same picture, within a shade
    path = plot_csv(SMALL, tmp_path)[0]
    with Image.open(path) as im:
        assert im.mode == "P"


def test_figures_have_labelled_log_axes_a_title_and_a_line_per_implementation():
    df = read_results(SMALL)
    g = df[(df["dtype"] == "float32")]
    figs = group_figures(g)
    try:
        ok = g[g["status"] == "ok"]
        insts = ok.groupby(["label", "causal"])
        fig = figs["runtime"]
        assert "test-fixture" in fig._suptitle.get_text() and "float32" in fig._suptitle.get_text()
        assert "D=16" in fig._suptitle.get_text()
        panels = [ax for ax in fig.axes if ax.get_visible()]
        assert len(panels) == insts.ngroups  # a panel per pattern instance
        for ax in panels:
            assert "ms" in ax.get_ylabel() and "T" in ax.get_xlabel()
            assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
            (label, causal), rows = next((k, r) for k, r in insts
                                         if ax.get_title() == (k[0] if k[1] else f"{k[0]} non-causal"))
            assert len(ax.get_lines()) == rows["impl"].nunique()  # a line per implementation
        # one legend naming every implementation once
        (legend,) = fig.legends
        assert sorted(t.get_text().removesuffix(" (peer)") for t in legend.get_texts()) == sorted(ok["impl"].unique())
        for kind, word in (("share-of-floor", "floor"), ("tflops", "TFLOP/s"), ("speedup-over-dense", "dense ms / pattern ms")):
            ax = next(a for a in figs[kind].axes if a.get_visible())
            assert word in ax.get_ylabel()
        assert "dense time / pattern time" in figs["speedup-over-dense"]._suptitle.get_text()
        # speedup: a panel per non-dense instance that has a dense match
        sp = [a for a in figs["speedup-over-dense"].axes if a.get_visible()]
        assert len(sp) == with_speedup(g).groupby(["label", "causal"]).ngroups
    finally:
        for f in figs.values():
            plt.close(f)


def _r(pattern, impl, T, ms, causal=True, status="ok"):
    return dict(pattern=pattern, label=pattern, impl=impl, T=T, B=1, H=1, D=8, dtype="float32", causal=causal,
                median_ms=ms, status=status)


def test_speedup_is_over_dense_of_the_same_impl_and_causal_flag():
    df = pd.DataFrame([
        _r("dense", "a", 64, 8.0), _r("dense", "b", 64, 100.0), _r("dense", "a", 128, 30.0, status="failed"),
        _r("window", "a", 64, 2.0), _r("window", "b", 64, 10.0),
        _r("window", "a", 128, 3.0),                 # its dense row failed: no speedup
        _r("block_diagonal", "a", 64, 1.0, causal=False),  # no non-causal dense: no speedup
    ])
    sp = with_speedup(df)
    got = sorted(zip(sp["pattern"], sp["impl"], sp["T"], sp["speedup"]))
    assert got == [("window", "a", 64, 4.0), ("window", "b", 64, 10.0)]


def test_plot_refuses_a_missing_csv_or_one_without_ok_rows(tmp_path):
    r = CliRunner().invoke(main, ["plot", str(tmp_path / "nope.csv")])
    assert r.exit_code == 2 and "error: results CSV" in r.stderr and "does not exist" in r.stderr
    df = read_results(SMALL)
    df = df[df["status"] != "ok"]
    df.to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(BadInput, match="no ok row"):
        plot_csv(tmp_path / "bad.csv", tmp_path)


def test_legend_lists_attnbench_first_then_peers_marked_and_dashed():
    """In family order (attnbench, then peers), each family in the CSV's order, not alphabetically."""
    df = read_results(SMALL)
    g = df[df["dtype"] == "float32"]
    ok = g[g["status"] == "ok"]
    order = impl_order(ok)
    assert order == ["fake-exact", "fake-slow", "fake-peer"] and sorted(order) != order
    figs = group_figures(g)
    try:
        for kind in KINDS[:4]:
            (legend,) = figs[kind].legends
            assert [t.get_text() for t in legend.get_texts()] == ["fake-exact", "fake-slow", "fake-peer (peer)"]
            assert [h.get_linestyle() for h in legend.legend_handles] == ["-", "-", "--"]
            assert "attnbench" in legend.get_title().get_text() and "peers" in legend.get_title().get_text()
            ax = next(a for a in figs[kind].axes if a.get_visible())
            styles = {line.get_label(): line.get_linestyle() for line in ax.get_lines() if line.get_label() in order}
            assert styles == {"fake-exact": "-", "fake-slow": "-", "fake-peer": "--"}
    finally:
        for f in figs.values():
            plt.close(f)
    # a peer named first in the CSV still comes last
    moved = pd.concat([ok[ok["impl"] == "fake-peer"], ok[ok["impl"] != "fake-peer"]])
    assert impl_order(moved) == ["fake-exact", "fake-slow", "fake-peer"]


def test_headline_figure_is_the_best_attnbench_implementation_against_its_dense():
    df = read_results(SMALL)
    g = df[df["dtype"] == "float32"]
    assert best_own_impl(g) == "fake-exact"  # fake-slow is 4x slower; fake-peer is no attnbench implementation
    figs = group_figures(g)
    try:
        fig = figs[HEADLINE]
        rt, sp = fig.axes
        assert fig._suptitle.get_text().startswith("fake-exact")
        assert rt.get_xscale() == rt.get_yscale() == "log" and "ms" in rt.get_ylabel()
        assert "dense ms / pattern ms" in sp.get_ylabel() and "fake-exact" in sp.get_ylabel()
        names = [line.get_label() for line in rt.get_lines()]
        assert names == ["dense", "window 16", "streaming 4+16", "block_diagonal 16", "block_diagonal 64"]
        ok = g[(g["status"] == "ok") & (g["impl"] == "fake-exact")]
        dense = rt.get_lines()[0]
        assert list(dense.get_ydata()) == list(ok[ok["pattern"] == "dense"].sort_values("T")["median_ms"])
        sp_names = [line.get_label() for line in sp.get_lines() if not line.get_label().startswith("_")]
        assert sp_names == names[1:]  # speedup: every pattern with a dense of its causal flag
    finally:
        for f in figs.values():
            plt.close(f)
    # no attnbench implementation timed: no headline figure
    peers = g[g["family"] == "peer"]
    figs = group_figures(peers)
    try:
        assert best_own_impl(peers) is None and HEADLINE not in figs and "runtime" in figs
    finally:
        for f in figs.values():
            plt.close(f)


def test_rows_with_list_parameters_plot_and_keep_their_labels(tmp_path):
    """A CSV gives list parameters back as JSON lists (dilated's levels): the plots and labels take
    them as the pattern does, tuples."""
    from attnbench.plot import short_label
    from attnbench.results import params_from_json

    ps = params_from_json("dilated", '{"dilation":1,"levels":[[2048,2],[2048,4]],"window":2048}')
    assert ps["levels"] == ((2048, 2), (2048, 4))
    assert short_label("dilated", ps, True) == "dilated 2048/1+2048/2+2048/4"
    df = read_results(SMALL)
    dil = df[df["pattern"] == "window"].copy()
    assert len(dil)
    dil["pattern"] = "dilated"
    dil["params"] = '{"dilation":1,"levels":[[8,2],[8,4]],"window":8}'
    dil["label"] = "dilated(levels=8:1+8:2+8:4)"
    csv = tmp_path / "levels.csv"
    pd.concat([df, dil]).to_csv(csv, index=False)
    paths = plot_csv(csv, tmp_path / "out")
    assert paths and all(p.stat().st_size > 10_000 for p in paths)
    back = read_results(csv)
    figs = group_figures(back[back["dtype"] == "float32"])
    try:  # the dilated rows keep their label as a panel of their own in every figure by pattern
        for kind in ("runtime", "speedup-over-dense", "tflops"):
            assert "dilated(levels=8:1+8:2+8:4)" in {a.get_title() for a in figs[kind].axes if a.get_visible()}, kind
    finally:
        for f in figs.values():
            plt.close(f)


def test_a_csv_without_dense_rows_plots_without_a_speedup_figure(tmp_path):
    """Patterns with no dense row to compare against (one implementation, built-ins beside their
    custom expressions, as `--pattern custom --pattern window ...` sweeps them) give neither
    speedup-over-dense nor the headline (patterns against dense), and the tables link neither;
    every other kind is drawn."""
    df = pd.read_csv(SMALL, keep_default_na=False, dtype=str)
    df = df[(df["impl"] == "fake-exact") & (df["pattern"] != "dense")]
    csv = tmp_path / "nodense.csv"
    df.to_csv(csv, index=False)
    paths = plot_csv(csv, tmp_path / "out")
    kinds = [k for k in KINDS if k not in ("speedup-over-dense", HEADLINE)]
    assert sorted(p.name for p in paths) == sorted(f"nodense_{dtype}_D{D}_B1_H2_{kind}.png"
                                                  for dtype, D in (("float32", 16), ("float16", 32)) for kind in kinds)
    from attnbench.plot import group_kinds
    from attnbench.readme import render, render_headline

    assert group_kinds(read_results(csv)) == kinds
    full = render([str(csv)], base=tmp_path)
    assert "[runtime](nodense_float32_D16_B1_H2_runtime.png)" in full and "speedup-over-dense" not in full
    assert HEADLINE not in full and HEADLINE not in render_headline([str(csv)], base=tmp_path)
    # with its dense rows, the same implementation alone gets every kind
    assert group_kinds(read_results(SMALL).query("impl == 'fake-exact'")) == list(KINDS)
