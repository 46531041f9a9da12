"""Figures from a results CSV (matplotlib's Agg backend: no display, no GPU needed).

For every (dtype, D, B, H) group of ``ok`` rows, four PNGs of small multiples (a panel per
pattern instance, a line per implementation, peers dashed, one colour per implementation):
  * runtime vs T, log-log;
  * speedup over dense (same implementation, T, B, H, D, dtype and causal flag) vs T;
  * share of the roofline vs T;
  * useful TFLOP/s vs T.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .patterns import BadInput  # noqa: E402
from .results import read_results  # noqa: E402
from .safefile import make_dir, write_atomically  # noqa: E402

GROUP = ["dtype", "D", "B", "H"]
SAME_CONFIG = ["impl", "T", "B", "H", "D", "dtype", "causal"]


def series_name(label: str, causal: bool, impl: str) -> str:
    return f"{label}{'' if causal else ' non-causal'} / {impl}"


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
    return f"{what}\n{gpus} - {r['dtype']}, B={_whole(r['B'])} H={_whole(r['H'])} D={_whole(r['D'])}"


def _style(ax, xlabel: str, ylabel: str, logy: bool = True):
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _instances(df) -> list[str]:
    """Pattern instances (label and causal flag), dense first."""
    names = {series_name(l, c, "")[:-3]: p for l, c, p in zip(df["label"], df["causal"], df["pattern"])}
    return sorted(names, key=lambda n: (names[n] != "dense", n))


def _impl_styles(df) -> dict:
    """A colour and marker per implementation, the same in every panel; peers dashed."""
    impls = sorted(set(df["impl"]), key=lambda i: (i.startswith(("cublas", "sdpa", "flex")), i))
    fam = dict(zip(df["impl"], df["family"])) if "family" in df else {}
    cmap = plt.get_cmap("tab10")
    return {i: dict(color=cmap(n % 10), marker=MARKERS[n % len(MARKERS)],
                    linestyle="--" if fam.get(i) == "peer" else "-")
            for n, i in enumerate(impls)}


def _panels(df, y: str, ylabel: str, what: str, logy: bool = True, ref: float | None = None):
    """Small multiples: a panel per pattern instance, a line per implementation."""
    insts = _instances(df)
    styles = _impl_styles(df)
    ncols = min(3, max(1, len(insts)))
    nrows = -(-len(insts) // ncols) if insts else 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.6 * nrows), squeeze=False)
    named = df.assign(_inst=[series_name(l, c, "")[:-3] for l, c in zip(df["label"], df["causal"])])
    Ts = sorted(set(df["T"]))
    for ax, inst in zip(axes.flat, insts):
        _style(ax, "T (tokens)", ylabel, logy)
        sub = named[named["_inst"] == inst]
        for impl, st in styles.items():
            s = sub[sub["impl"] == impl].sort_values("T")
            if len(s):
                ax.plot(s["T"], s[y], markersize=4, label=impl, **st)
        if ref is not None:
            ax.axhline(ref, color="grey", linewidth=0.8)
        ax.set_title(inst, fontsize="small")
        if Ts:
            ax.set_xticks(Ts)
            ax.set_xticklabels([str(t) for t in Ts], rotation=45 if len(Ts) > 4 else 0, fontsize="small")
            ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    for ax in list(axes.flat)[len(insts):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], markersize=5, **st) for st in styles.values()]
    fig.legend(handles, list(styles), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(styles), 8), fontsize="small")
    fig.suptitle(_title(df, what))
    fig.tight_layout()
    return fig


def group_figures(df) -> dict[str, "plt.Figure"]:
    """The figures of one (dtype, D, B, H) group, by kind; the caller saves and closes them."""
    ok = df[df["status"] == "ok"]
    figs = {"runtime": _panels(ok, "median_ms", "runtime (ms, median)", "Runtime vs T")}
    sp = with_speedup(df)
    figs["speedup"] = _panels(sp, "speedup", "speedup over dense (x)",
                              "Speedup over dense (same implementation) vs T", ref=1.0)
    figs["throughput"] = _panels(ok.assign(roofline_pct=100 * ok["roofline"]), "roofline_pct",
                                 "roofline share (%)", "Share of the roofline (floor time / measured) vs T")
    figs["tflops"] = _panels(ok, "tflops", "useful TFLOP/s", "Useful TFLOP/s (4*D*pairs*B*H / median) vs T")
    return figs


def _save(fig, path: Path) -> Path:
    """Through a temporary file and an atomic replace: a PNG is whole or as it was."""
    try:
        write_atomically(path, lambda f: fig.savefig(f, format="png", dpi=110, bbox_inches="tight"),
                         binary=True, what="plot")
    finally:
        plt.close(fig)
    return path


def _whole(v):
    """384 for 384.0: integer-valued numbers read as floats do not reach file names."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def group_slug(key) -> str:
    dtype, D, B, H = map(_whole, key)
    return f"{dtype}_D{D}_B{B}_H{H}"


def plot_frame(df, out_dir, prefix: str = "") -> list[Path]:
    paths = []
    ok = df[df["status"] == "ok"]
    if not len(ok):
        raise BadInput("the results hold no ok row: nothing to plot")
    out = make_dir(out_dir, "--out-dir")
    for key, g in sorted(df[df.set_index(GROUP).index.isin(ok.set_index(GROUP).index)].groupby(GROUP),
                         key=lambda kv: tuple(map(str, kv[0]))):
        for kind, fig in group_figures(g).items():
            paths.append(_save(fig, out / f"{prefix}{group_slug(key)}_{kind}.png"))
    return paths


def plot_csv(csv_path, out_dir) -> list[Path]:
    """Write the PNGs of a results CSV into ``out_dir``, named after the CSV (``seed-h200.csv``
    gives ``seed-h200_float32_D384_B1_H1_runtime.png``, ...); returns their paths."""
    return plot_frame(read_results(csv_path), out_dir, prefix=f"{Path(csv_path).stem}_")
