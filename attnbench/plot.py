"""Figures from a results CSV (matplotlib's Agg backend: no display, no GPU needed).

For every (dtype, D, B, H) group of ``ok`` rows, three PNGs:
  * runtime vs T, log-log, one line per pattern instance x implementation;
  * speedup over dense (same implementation, T, B, H, D, dtype and causal flag) vs T;
  * useful TFLOP/s and share of the roofline vs T.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .patterns import BadInput  # noqa: E402
from .results import read_results  # noqa: E402

GROUP = ["dtype", "D", "B", "H"]
SAME_CONFIG = ["impl", "T", "B", "H", "D", "dtype", "causal"]


def series_name(label: str, causal: bool, impl: str) -> str:
    return f"{label}{'' if causal else ' non-causal'} / {impl}"


def _add_series(df):
    df = df.copy()
    df["series"] = [series_name(l, c, i) for l, c, i in zip(df["label"], df["causal"], df["impl"])]
    return df


def with_speedup(df):
    """``ok`` non-dense rows with ``speedup`` = dense median / pattern median, matched on
    implementation, T, B, H, D, dtype and causal flag (rows without a dense match drop out)."""
    ok = df[df["status"] == "ok"]
    dense = ok[ok["pattern"] == "dense"][SAME_CONFIG + ["median_ms"]].rename(columns={"median_ms": "dense_ms"})
    dense = dense.drop_duplicates(SAME_CONFIG)
    m = ok[ok["pattern"] != "dense"].merge(dense, on=SAME_CONFIG, how="inner")
    m["speedup"] = m["dense_ms"] / m["median_ms"]
    return m


def _title(df, what: str) -> str:
    gpus = ", ".join(sorted(set(map(str, df["gpu"])))) if "gpu" in df else "unknown GPU"
    r = df.iloc[0]
    return f"{what}\n{gpus} - {r['dtype']}, B={r['B']} H={r['H']} D={r['D']}"


def _style(ax, xlabel: str, ylabel: str, logy: bool = True):
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def _lines(ax, df, y: str):
    """One line per series: the colour names the pattern instance, the line style and
    marker name the implementation."""
    insts = sorted({series_name(l, c, "") for l, c in zip(df["label"], df["causal"])})
    impls = sorted(set(df["impl"]))
    colours = plt.get_cmap("tab10" if len(insts) <= 10 else "tab20")
    for name, s in sorted(df.groupby("series"), key=lambda kv: kv[0]):
        s = s.sort_values("T")
        ci = insts.index(series_name(s["label"].iloc[0], s["causal"].iloc[0], ""))
        ii = impls.index(s["impl"].iloc[0])
        ax.plot(s["T"], s[y], color=colours(ci % colours.N), linestyle=LINESTYLES[ii % len(LINESTYLES)],
                marker=MARKERS[ii % len(MARKERS)], markersize=4, label=name)
    Ts = sorted(set(df["T"]))
    if Ts:
        ax.set_xticks(Ts)
        ax.set_xticklabels([str(t) for t in Ts], rotation=45 if len(Ts) > 6 else 0)
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


def _legend(fig, ax):
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")


def _save(fig, path: Path) -> Path:
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def group_figures(df) -> dict[str, "plt.Figure"]:
    """The figures of one (dtype, D, B, H) group, by kind; the caller saves and closes them."""
    ok = _add_series(df[df["status"] == "ok"])
    figs = {}

    fig, ax = plt.subplots(figsize=(8, 5.5))
    _style(ax, "sequence length T (tokens)", "runtime (ms, median)")
    _lines(ax, ok, "median_ms")
    ax.set_title(_title(df, "Runtime vs T"))
    _legend(fig, ax)
    figs["runtime"] = fig

    fig, ax = plt.subplots(figsize=(8, 5.5))
    _style(ax, "sequence length T (tokens)", "speedup over dense (x, same implementation)")
    sp = with_speedup(df)
    if len(sp):
        _lines(ax, _add_series(sp), "speedup")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_title(_title(df, "Speedup over dense vs T"))
    _legend(fig, ax)
    figs["speedup"] = fig

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 5.5))
    _style(a1, "sequence length T (tokens)", "useful TFLOP/s (4*D*pairs*B*H / median)")
    _lines(a1, ok, "tflops")
    _style(a2, "sequence length T (tokens)", "roofline share (%, floor time / measured)")
    if "roofline" in ok:
        _lines(a2, ok.assign(roofline_pct=100 * ok["roofline"]), "roofline_pct")
    fig.suptitle(_title(df, "Throughput and roofline share vs T"))
    _legend(fig, a1)
    figs["throughput"] = fig
    return figs


def group_slug(key) -> str:
    dtype, D, B, H = key
    return f"{dtype}_D{D}_B{B}_H{H}"


def plot_frame(df, out_dir) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    ok = df[df["status"] == "ok"]
    if not len(ok):
        raise BadInput("the results hold no ok row: nothing to plot")
    for key, g in sorted(df[df.set_index(GROUP).index.isin(ok.set_index(GROUP).index)].groupby(GROUP),
                         key=lambda kv: tuple(map(str, kv[0]))):
        for kind, fig in group_figures(g).items():
            paths.append(_save(fig, out / f"{group_slug(key)}_{kind}.png"))
    return paths


def plot_csv(csv_path, out_dir) -> list[Path]:
    """Write the PNGs of a results CSV into ``out_dir``; returns their paths."""
    return plot_frame(read_results(csv_path), out_dir)
