"""Figures from a results CSV (matplotlib's Agg backend: no display, no GPU needed).

For every (dtype, D, B, H) group of ``ok`` rows (and pass, where the CSV holds backward rows),
PNGs named ``<csv stem>_<group>_<kind>.png``.
Four kinds are small multiples (a panel per pattern instance, a line per implementation, one colour
each; attnbench's solid, peers dashed and marked "(peer)"; legend in family order, attnbench first):
  * ``runtime``: median ms vs T, log-log;
  * ``speedup-over-dense``: dense ms / pattern ms of the same implementation (same T, B, H, D,
    dtype and causal flag) vs T (none for a group without such a dense row);
  * ``tflops``: useful TFLOP/s vs T;
  * ``share-of-floor``: floor time / measured time vs T (the ``roofline`` column, in %).
The fifth, ``best-attnbench-vs-dense``, is the README's headline figure: for the fastest
attnbench implementation of the group, dense and each pattern's runtime vs T (log-log) beside each
pattern's speedup over that dense (none where that implementation has no dense row).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .errors import BadInput  # noqa: E402
from .results import params_from_json, read_results  # noqa: E402
from .safefile import make_dir, write_atomically  # noqa: E402

GROUP = ["dtype", "D", "B", "H"]
SAME_CONFIG = ["impl", "T", "B", "H", "D", "dtype", "causal"]
HEADLINE = "best-attnbench-vs-dense"
KINDS = ("runtime", "speedup-over-dense", "tflops", "share-of-floor", HEADLINE)
# a CSV with backward rows (bwd, fwd+bwd) groups by pass too: figures and tables per pass, named
# with the pass (``..._H16_fwd-bwd_runtime.png``), so no line or table mixes passes; a CSV of forward
# rows alone as before
PASS_TAG = "pass_tag"
# useful FLOPs per pass (SPEC section 3), for the titles
FLOPS_OF = {"fwd": "4*D*pairs*B*H", "bwd": "10*D*pairs*B*H", "fwd+bwd": "14*D*pairs*B*H"}


def with_pass_tag(df):
    """``df`` with a PASS_TAG column (the pass, file-name safe) when it holds a pass other than fwd."""
    if "pass" not in df or set(df["pass"].astype(str)) <= {"fwd"}:
        return df
    return df.assign(**{PASS_TAG: df["pass"].map(lambda p: str(p).replace("+", "-"))})


# a CSV with serving shapes (queries fewer than keys, grouped-query heads, a ragged batch) groups by
# shape too (``..._H32_Tq1-Hkv8_runtime.png``): no line or table mixes Tq=1 with Tq=16, a ragged batch
# with uniform ones, or H_kv=4 with H_kv=H; a CSV of prefill rows alone as before
SHAPE_TAG = "shape_tag"


def _ragged(df):
    return df["cache_lens"].fillna("").astype(str).str.len() > 0 if "cache_lens" in df else False


def with_shape_tag(df):
    """``df`` with a SHAPE_TAG column (``Tq1-Hkv8``, ``Tq1-Hkv8-ragged``, ``Hkv4``; ``prefill`` for
    the plain rows) when some row has a serving shape (``Tq`` < ``T``, ``H_kv`` < ``H`` or per
    sequence cache lengths)."""
    if "Tq" not in df or "H_kv" not in df or not len(df):
        return df
    decode, grouped, ragged = df["Tq"] < df["T"], df["H_kv"] < df["H"], _ragged(df)
    if not (decode | grouped | ragged).any():
        return df
    tags = []
    for d, g, r, tq, hkv in zip(decode, grouped, ragged, df["Tq"], df["H_kv"]):
        parts = ([f"Tq{_whole(tq)}"] if d else []) + ([f"Hkv{_whole(hkv)}"] if g else []) + (["ragged"] if r else [])
        tags.append("-".join(parts) or "prefill")
    return df.assign(**{SHAPE_TAG: tags})


def with_tags(df):
    """``with_pass_tag`` and ``with_shape_tag``: the columns figures and tables group by."""
    return with_shape_tag(with_pass_tag(df))


def shape_words(g) -> str:
    """The serving shape of a group's rows in words (``Tq=1 H_kv=8, ragged``); empty for prefill."""
    if SHAPE_TAG not in g or str(g[SHAPE_TAG].iloc[0]) == "prefill":
        return ""
    r = g.iloc[0]
    return (" ".join(([f"Tq={_whole(r['Tq'])}"] if r["Tq"] < r["T"] else []) + [f"H_kv={_whole(r['H_kv'])}"])
            + (", ragged" if str(g[SHAPE_TAG].iloc[0]).endswith("ragged") else ""))


def group_columns(df) -> list[str]:
    """GROUP, then the pass where ``df`` holds more than one (``with_pass_tag``) and the serving
    shape where it holds one (``with_shape_tag``)."""
    return GROUP + [c for c in (PASS_TAG, SHAPE_TAG) if c in df]


def impl_order(df) -> list[str]:
    """The implementations of ``df`` by family (attnbench first, peers last), then in the order
    the CSV first names them (the registry's order, as the sweep runs them)."""
    fam = dict(zip(df["impl"], df["family"]))
    rank = {"attnbench": 0, "peer": 2}
    first = list(dict.fromkeys(df["impl"]))
    return sorted(first, key=lambda i: (rank.get(fam[i], 1), first.index(i)))


def impl_label(impl: str, family: str) -> str:
    """``flex (peer)`` for a peer; attnbench's own implementations by their name."""
    return f"{impl} (peer)" if family == "peer" else impl


def short_label(pattern: str, params: dict, causal: bool) -> str:
    """``streaming 16+64``: the pattern and its parameter values (Pattern.short_label)."""
    from .patterns import get_pattern

    vals = get_pattern(pattern).short_label(params)
    return f"{pattern}{' ' + vals if vals else ''}{'' if causal else ', non-causal'}"


def best_own_impl(df) -> str | None:
    """The fastest attnbench implementation of ``df``'s ``ok`` rows: the smallest geometric mean
    of median ms over the configurations every attnbench implementation timed (failing that, the
    one with the most ok rows); None when no attnbench implementation has an ok row."""
    import numpy as np

    own = df[(df["status"] == "ok") & (df["family"] == "attnbench")]
    if not len(own):
        return None
    key = ["T", "label", "causal"]
    times = own.pivot_table(index=key, columns="impl", values="median_ms", aggfunc="min").dropna()
    order = impl_order(own)
    if len(times):
        score = {i: float(np.log(times[i]).mean()) for i in order}
    else:
        score = {i: -float((own["impl"] == i).sum()) for i in order}
    return min(order, key=lambda i: (score[i], order.index(i)))


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
    shape = shape_words(df)
    return (f"{what}\n{gpus} - {r['dtype']}, B={_whole(r['B'])} H={_whole(r['H'])} D={_whole(r['D'])}"
            + (f", pass {r['pass']}" if PASS_TAG in df else "")
            + (f", {shape}" + (" (T: cached keys)" if r["Tq"] < r["T"] else "") if shape else ""))


class _Plain(matplotlib.ticker.LogFormatter):
    """Log-axis labels as plain numbers (0.05, not 5e-02); matplotlib chooses which ticks get one
    (minor ticks only on axes of under 2 decades)."""

    def __call__(self, x, pos=None):
        return f"{x:g}" if super().__call__(x, pos) else ""


def _style(ax, xlabel: str, ylabel: str, logy: bool = True):
    ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(_Plain())
        ax.yaxis.set_minor_formatter(_Plain(labelOnlyBase=False, minor_thresholds=(2, 0.4)))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def _t_ticks(ax, Ts) -> None:
    """A labelled tick at each measured T, no others."""
    if Ts:
        ax.set_xticks(Ts)
        ax.set_xticklabels([str(t) for t in Ts], rotation=45 if len(Ts) > 4 else 0, fontsize="small")
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _instances(df) -> list[str]:
    """Pattern instances (label and causal flag), dense first, then in the patterns' order."""
    return [series_name(l, c, "")[:-3] for l, c in instance_labels(df)]


def _impl_styles(df) -> dict:
    """A colour and marker per implementation, the same in every panel, in family order;
    attnbench's solid, peers dashed."""
    fam = dict(zip(df["impl"], df["family"]))
    cmap = plt.get_cmap("tab10")
    return {i: dict(color=cmap(n % 10), marker=MARKERS[n % len(MARKERS)],
                    linestyle="--" if fam[i] == "peer" else "-")
            for n, i in enumerate(impl_order(df))}


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
        _t_ticks(ax, Ts)
    for ax in list(axes.flat)[len(insts):]:
        ax.set_visible(False)
    handles = [plt.Line2D([], [], markersize=5, **st) for st in styles.values()]
    fam = dict(zip(df["impl"], df["family"]))
    fig.legend(handles, [impl_label(i, fam[i]) for i in styles], loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(styles), 8), fontsize="small", title="solid: attnbench · dashed: peers",
               title_fontsize="small")
    fig.suptitle(_title(df, what))
    fig.tight_layout()
    return fig


def group_kinds(df) -> list[str]:
    """The kinds of figure a group's rows give, in KINDS' order: ``speedup-over-dense`` only where
    some pattern has a dense row to be measured against (``with_speedup``; a sweep of patterns
    without dense has none), the headline only where the fastest attnbench implementation
    (``best_own_impl``) has an ok dense row."""
    best = best_own_impl(df)
    dense = (df["status"] == "ok") & (df["pattern"] == "dense") & (df["impl"] == best)
    return [k for k in KINDS if (k != "speedup-over-dense" or len(with_speedup(df)))
            and (k != HEADLINE or dense.any())]


def group_figures(df) -> dict[str, "plt.Figure"]:
    """The figures of one (dtype, D, B, H) group, by kind (``group_kinds``); the caller saves and
    closes them."""
    kinds = group_kinds(df)
    ok = df[df["status"] == "ok"]
    figs = {"runtime": _panels(ok, "median_ms", "runtime (ms, median)", "Runtime vs T")}
    if "speedup-over-dense" in kinds:
        figs["speedup-over-dense"] = _panels(
            with_speedup(df), "speedup", "dense ms / pattern ms (x)",
            "Speedup over dense = dense time / pattern time, each implementation against its own dense "
            "(same T, causal flag) vs T", ref=1.0)
    passes = sorted(set(ok["pass"].astype(str))) if "pass" in ok else ["fwd"]
    flops = FLOPS_OF.get(passes[0], "useful FLOPs") if len(passes) == 1 else "useful FLOPs"
    figs["tflops"] = _panels(ok, "tflops", "useful TFLOP/s", f"Useful TFLOP/s ({flops} / median) vs T")
    figs["share-of-floor"] = _panels(
        ok.assign(roofline_pct=100 * ok["roofline"]), "roofline_pct", "share of the floor (%)",
        "Share of the floor = floor time / measured time vs T\n(floor: max of FLOPs / matmul peak, "
        "bytes / copy bandwidth)")
    if HEADLINE in kinds:
        best = best_own_impl(df)
        figs[HEADLINE] = best_vs_dense(ok[ok["impl"] == best], best)
    return figs


def instance_labels(df) -> dict:
    """Short label per (label, causal) of ``df``, dense first, then in the patterns' order."""
    from .patterns import PATTERNS

    names = list(PATTERNS)
    seen = {}
    params = df["params"] if "params" in df else ["{}"] * len(df)
    for pat, lab, c, ps in zip(df["pattern"], df["label"], df["causal"], params):
        seen.setdefault((lab, c), (pat, short_label(pat, params_from_json(pat, ps) if isinstance(ps, str) else {}, c)))
    order = sorted(seen, key=lambda k: (names.index(seen[k][0]) if seen[k][0] in names else len(names),
                                        seen[k][1]))
    return {k: seen[k][1] for k in order}


def best_vs_dense(rows, impl: str):
    """The headline figure for one implementation's ``ok`` rows: runtime of dense and of each
    pattern vs T (log-log), and each pattern's speedup over that dense vs T."""
    fig, (rt, sp) = plt.subplots(1, 2, figsize=(12, 4.6))
    labels = instance_labels(rows)
    speed = with_speedup(rows)
    cmap = plt.get_cmap("tab10")
    Ts = sorted(set(rows["T"]))
    for n, ((lab, causal), short) in enumerate(labels.items()):
        dense = lab == "dense"
        st = dict(color="black" if dense else cmap(n % 10), marker=MARKERS[n % len(MARKERS)], markersize=4,
                  linewidth=2.2 if dense else 1.4, label=short)
        s = rows[(rows["label"] == lab) & (rows["causal"] == causal)].sort_values("T")
        rt.plot(s["T"], s["median_ms"], **st)
        s = speed[(speed["label"] == lab) & (speed["causal"] == causal)].sort_values("T")
        if len(s):
            sp.plot(s["T"], s["speedup"], **st)
    _style(rt, "T (tokens)", "runtime (ms, median)")
    _style(sp, "T (tokens)", f"dense ms / pattern ms, both {impl} (x)")
    sp.axhline(1.0, color="grey", linewidth=0.8)
    rt.set_title("Runtime: dense and each pattern", fontsize="medium")
    sp.set_title("Speedup over dense (same implementation, T, causal flag)", fontsize="medium")
    for ax in (rt, sp):
        _t_ticks(ax, Ts)
    handles, names = rt.get_legend_handles_labels()
    fig.legend(handles, names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(names), 5),
               fontsize="small")
    fig.suptitle(_title(rows, f"{impl} (the fastest attnbench implementation here): patterns against dense"))
    fig.tight_layout()
    return fig


def palette_png(png: bytes) -> bytes:
    """The PNG in 256 colours (median cut), about a third of matplotlib's RGBA bytes for these line plots:
    a results folder of a few hundred plots stays small enough to carry around."""
    import io

    from PIL import Image  # (matplotlib's own dependency)

    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(
        out, format="PNG", optimize=True)
    return out.getvalue()


def _save(fig, path: Path) -> Path:
    """Through a temporary file and an atomic replace: a PNG is whole or as it was."""
    import io

    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        write_atomically(path, lambda f: f.write(palette_png(buf.getvalue())), binary=True, what="plot")
    finally:
        plt.close(fig)
    return path


def _whole(v):
    """384 for 384.0: integer-valued numbers read as floats do not reach file names."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def group_slug(key) -> str:
    dtype, D, B, H = map(_whole, key[:4])
    return f"{dtype}_D{D}_B{B}_H{H}" + "".join(f"_{tag}" for tag in key[4:])


def png_name(csv_path, key, kind: str) -> str:
    """The file name ``plot_csv`` gives a kind of figure of group ``key`` of a CSV."""
    return _file_name(f"{Path(csv_path).stem}_", key, kind)


def _file_name(prefix: str, key, kind: str) -> str:
    return f"{prefix}{group_slug(key)}_{kind}.png"


def plot_frame(df, out_dir, prefix: str = "") -> list[Path]:
    paths = []
    ok = df[df["status"] == "ok"]
    if not len(ok):
        raise BadInput("the results hold no ok row: nothing to plot")
    out = make_dir(out_dir, "--out-dir")
    df = with_tags(df)
    ok, by = df[df["status"] == "ok"], group_columns(df)
    for key, g in sorted(df[df.set_index(by).index.isin(ok.set_index(by).index)].groupby(by),
                         key=lambda kv: tuple(map(str, kv[0]))):
        for kind, fig in group_figures(g).items():
            paths.append(_save(fig, out / _file_name(prefix, key, kind)))
    return paths


def plot_csv(csv_path, out_dir) -> list[Path]:
    """Write the PNGs of a results CSV into ``out_dir``, named after the CSV (``seed-h200.csv``
    gives ``seed-h200_float32_D384_B1_H1_runtime.png``, ...); returns their paths."""
    return plot_frame(read_results(csv_path), out_dir, prefix=f"{Path(csv_path).stem}_")
