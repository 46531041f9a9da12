"""The README's generated parts, from results CSVs; a file gets each part whose markers it holds.

* Between ``<!-- attnbench:headline:start -->`` and ``<!-- attnbench:headline:end -->`` (the
  README): per CSV and (dtype, D, B, H) group, one table at one representative T (the largest T
  at which the most rows were timed): a row per pattern instance, a column per implementation
  (attnbench's first, then the peers), median ms, and the best peer's time over attnbench's best;
  below it the group's ``best-attnbench-vs-dense`` figure (``attnbench plot`` writes it beside the CSV).
* Between ``<!-- attnbench:summary:start -->`` and ``<!-- attnbench:summary:end -->``
  (``results/README.md``): a section per CSV: the GPU, date, commit and command, links to the
  group's figures, then per group and per implementation a table per pattern instance with T,
  dense ms, pattern ms, speedup, relative error, roofline share and the best peer.

The output depends on the CSVs only (no clock, sorted everywhere), so running it twice changes nothing.
"""
from __future__ import annotations

import math
import os
from numbers import Number
from pathlib import Path

from .patterns import PATTERNS, BadInput
from .plot import (GROUP, HEADLINE, PASS_TAG, SHAPE_TAG, best_own_impl, group_columns, group_kinds, impl_label,
                   impl_order, instance_labels, png_name, shape_words, with_tags)
from .results import read_results
from .safefile import read_text, write_atomically

START = "<!-- attnbench:summary:start -->"
END = "<!-- attnbench:summary:end -->"
HEAD_START = "<!-- attnbench:headline:start -->"
HEAD_END = "<!-- attnbench:headline:end -->"
NONE = "—"


def _ms(x) -> str:
    return NONE if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.4g}"


def _num(x, fmt: str, suffix: str = "") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return NONE
    return NONE if math.isnan(x) else f"{x:{fmt}}{suffix}"


def _pct(x) -> str:
    try:
        return _num(100 * float(x), ".1f", "%")
    except (TypeError, ValueError):
        return NONE


def _uniq(df, col: str) -> list[str]:
    if col not in df:
        return []
    return sorted({str(v) for v in df[col] if isinstance(v, str) and v or (not isinstance(v, str) and v == v)})


def _pattern_order(pattern: str) -> int:
    names = list(PATTERNS)
    return names.index(pattern) if pattern in names else len(names)


def _cell(row) -> str:
    """A row's time, or its status when it was not timed."""
    return _ms(row["median_ms"]) if row["status"] == "ok" else row["status"]


def _table(lines: list[str], header: list[str], rows: list[list[str]], left: int = -1) -> None:
    """A markdown table, numbers right-aligned, column ``left`` left-aligned; a | inside a cell
    (a custom pattern's expression) escaped."""
    def row(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    lines.append(row(header))
    align = ["---:"] * len(header)
    align[left] = ":---"
    lines.append("|" + "|".join(align) + "|")
    lines += [row(r) for r in rows]
    lines.append("")


def _reasons(df, sep: str) -> str:
    """The non-ok rows of ``df``, grouped by status and reason, with the T values of each."""
    bad = df[df["status"] != "ok"]
    parts = []
    for (status, reason), g in sorted(bad.groupby(["status", bad["reason"].fillna("no reason given")])):
        ts = ", ".join(str(t) for t in sorted(set(g["T"])))
        parts.append(f"{status} at T={ts}: {reason}")
    return sep.join(parts)


CONFIG = ["T", "B", "H", "D", "dtype", "pattern", "params", "causal"]


def _best_peers(df) -> dict:
    """For each configuration, the fastest ``ok`` row of family peer: (name, ms)."""
    peers = df[(df["family"] == "peer") & (df["status"] == "ok")]
    best = {}
    for _, r in peers.sort_values(["median_ms", "impl"]).iterrows():
        key = tuple(r[c] for c in CONFIG)
        best.setdefault(key, (r["impl"], r["median_ms"]))
    return best


def _dense_of(df) -> dict:
    ok = df[(df["pattern"] == "dense") & (df["status"] == "ok")]
    return {(r["impl"], r["T"], r["B"], r["H"], r["D"], r["dtype"], r["causal"]): r["median_ms"]
            for _, r in ok.iterrows()}


def _groups(df):
    """The (dtype, D, B, H) groups of ``df`` (and pass, where it holds backward rows: ``plot.group_columns``),
    in a fixed order (numbers as numbers: D=64 before 128)."""
    return sorted(df.groupby(group_columns(df)),
                  key=lambda kv: tuple(v if isinstance(v, Number) else str(v) for v in kv[0]))


def _link(csv_path, key, kind: str, base) -> str:
    """The path of a figure ``attnbench plot`` writes beside the CSV, relative to ``base``."""
    return Path(os.path.relpath(Path(csv_path).parent / png_name(csv_path, key, kind), base)).as_posix()


def _figure_links(df, csv_path, key, base) -> str:
    return " · ".join(f"[{k}]({_link(csv_path, key, k, base)})" for k in group_kinds(df))


def headline_T(df) -> int:
    """The largest T at which the most rows of ``df`` were timed."""
    counts = df[df["status"] == "ok"].groupby("T").size()
    return max(counts.index, key=lambda t: (counts[t], t))


def _ratio(x: float) -> str:
    return f"{x:.0f}x" if x >= 10 else f"{x:.2g}x"


RATIO = "best peer / best attnbench"


def _headline_table(g, gpu: str, config: str) -> list[str]:
    """One group's table at its representative T."""
    T = headline_T(g)
    at = g[g["T"] == T]
    fam = dict(zip(g["impl"], g["family"]))
    # an implementation that ran at T gets a column, failures included; one only skipped gets a line
    ran = at[at["status"] != "skipped"]
    shown = [i for i in impl_order(at) if (ran["impl"] == i).any()]
    dtype, D, B, H = (g[c].iloc[0] for c in GROUP)
    lines = [f"**{config}: {dtype}, B={B} H={H} D={D}, T={T}** ({gpu}), median ms, fastest in bold:", ""]
    header = ["pattern"] + [impl_label(i, fam[i]) for i in shown] + [RATIO]
    rows = []
    for (label, causal), short in instance_labels(at).items():
        inst = at[(at["label"] == label) & (at["causal"] == causal)]
        status = {r["impl"]: r for _, r in inst.iterrows()}
        ms = {i: status[i]["median_ms"] for i in shown if i in status and status[i]["status"] == "ok"}
        fastest = min(ms, key=lambda i: (ms[i], shown.index(i))) if ms else None
        cells = [short]
        for i in shown:
            if i in ms:
                cells.append(f"**{_ms(ms[i])}**" if i == fastest else _ms(ms[i]))
            else:
                cells.append("failed" if i in status and status[i]["status"] == "failed" else NONE)
        own = [v for i, v in ms.items() if fam[i] == "attnbench"]
        peer = [v for i, v in ms.items() if fam[i] == "peer"]
        cells.append(_ratio(min(peer) / min(own)) if own and peer else NONE)
        rows.append(cells)
    _table(lines, header, rows, left=0)
    for status, title in (("failed", "Failed"), ("skipped", "Not run")):
        bad = at[at["status"] == status]
        why = [f"{impl_label(i, fam[i])}: {'; '.join(sorted(set(bad[bad['impl'] == i]['reason'].fillna('no reason given'))))}"
               for i in impl_order(bad) if status == "failed" or i not in shown]
        if why:
            lines += [f"{title} at T={T}: " + "; ".join(why) + ".", ""]
    return lines


def _headline(frames, base) -> str:
    lines = []
    present = set()
    for path, df in frames:
        config = ", ".join(_uniq(df, "config")) or "results"
        gpu = ", ".join(_uniq(df, "gpu")) or "unknown GPU"
        present |= set(df["pattern"])
        for key, g in _groups(df):
            if not (g["status"] == "ok").any():
                continue
            lines += _headline_table(g, gpu, config)
            if HEADLINE in group_kinds(g):
                best = best_own_impl(g)
                lines += [f"![{config}, {key[0]} D={key[1]}: {best}, runtime of dense and each pattern vs T, "
                          f"and speedup over dense]({_link(path, key, HEADLINE, base)})", ""]
    keys = [f"{p} {PATTERNS[p].short_key}" for p in PATTERNS if p in present and PATTERNS[p].short_key]
    note = (f"Cells: median GPU time in ms; failed: ran and did not pass (why: below its table); {NONE}: not "
            f"run for this pattern (the CSV row's `reason` says why); {RATIO}: the fastest peer's time over attnbench's fastest (above 1x: attnbench is "
            f"faster). Labels give the parameters" + (f" ({', '.join(keys)})" if keys else "") + ".")
    return _generated(frames, [note, ""] + lines)


def _section(df, title: str, csv_path=None, base=None) -> list[str]:
    lines = [f"### {title}", ""]
    meta = [("GPU", ", ".join(_uniq(df, "gpu")) or NONE)]
    dates = sorted(str(t)[:10] for t in df["timestamp"] if isinstance(t, str)) if "timestamp" in df else []
    meta.append(("date", (dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}") if dates else NONE))
    meta.append(("commit", ", ".join(_uniq(df, "git_commit")) or NONE))
    for k, v in meta:
        lines.append(f"- {k}: {v}")
    cmds = _uniq(df, "command")
    lines.append("- command: " + (", ".join(f"`{c}`" for c in cmds) if cmds else NONE))
    counts = df["status"].value_counts()
    lines.append("- rows: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("ok", "failed", "skipped")))
    lines.append("")
    best = _best_peers(df)
    dense = _dense_of(df)
    own = df[df["family"] != "peer"]
    shown = own if len(own) else df
    for key, g in _groups(shown):
        (dtype, D, B, H), untimed = key[:4], []
        if csv_path is not None and (g["status"] == "ok").any():
            lines += [f"Figures for {dtype}, B={B} H={H} D={D}: "
                      + _figure_links(df[(df[GROUP] == [dtype, D, B, H]).all(axis=1)], csv_path, key, base),
                      ""]
        for impl, gi in sorted(g.groupby("impl"), key=lambda kv: kv[0]):
            family = gi["family"].iloc[0]
            if not (gi["status"] == "ok").any():
                untimed.append(f"- {impl}: {_reasons(gi, '; ')}")
                continue
            lines += [f"#### {impl} ({family}): {dtype}, B={B} H={H} D={D}", ""]
            inst = gi.groupby(["pattern", "label", "causal"])
            for (pattern, label, causal), gp in sorted(inst, key=lambda kv: (_pattern_order(kv[0][0]), kv[0][1],
                                                                               not kv[0][2])):
                lines += [f"**{label}, {'causal' if causal else 'non-causal'}**", ""]
                is_dense = pattern == "dense"
                header = (["T", "ms", "TFLOP/s"] if is_dense else ["T", "dense ms", "pattern ms", "speedup"])
                header += ["rel err", "roofline", "best peer"]
                rows = []
                for _, r in gp.sort_values("T").iterrows():
                    key = tuple(r[c] for c in CONFIG)
                    peer = best.get(key)
                    peer_s = f"{peer[0]} {_ms(peer[1])}" if peer else NONE
                    ok = r["status"] == "ok"
                    if is_dense:
                        cells = [str(r["T"]), _cell(r), _num(r.get("tflops"), ".3g") if ok else NONE]
                    else:
                        d = dense.get((impl, r["T"], B, H, D, dtype, causal))
                        sp = f"{d / r['median_ms']:.2f}x" if (ok and d is not None) else NONE
                        cells = [str(r["T"]), _ms(d), _cell(r), sp]
                    cells += [_num(r.get("rel_err"), ".1e"), _pct(r.get("roofline")) if ok else NONE, peer_s]
                    rows.append(cells)
                _table(lines, header, rows)
                if (gp["status"] != "ok").any():
                    lines += [f"Not timed: {_reasons(gp, '; ')}.", ""]
        if untimed:
            lines += [f"Never timed for {dtype}, B={B} H={H} D={D}:", ""] + untimed + [""]
    return lines


def _load(csv_paths) -> list:
    """(path, rows) per CSV; a CSV with backward rows gives a frame per pass, its config named
    with the pass (``training, pass bwd``), one with serving shapes a frame per shape (``decode,
    Tq=1 H_kv=8``); one of forward prefill rows alone, one frame as before."""
    frames = []
    for p in csv_paths:
        df = with_tags(read_results(p))
        by = [c for c in (PASS_TAG, SHAPE_TAG) if c in df]
        if not by:
            frames.append((p, df))
            continue
        groups = list(df.groupby(by, sort=False))  # passes as the CSV has them
        passes = list(dict.fromkeys(str(g[PASS_TAG].iloc[0]) for _, g in groups)) if PASS_TAG in df else [""]
        for _, g in sorted(groups, key=lambda kv: (passes.index(str(kv[1][PASS_TAG].iloc[0])) if PASS_TAG in df
                                                   else 0, _shape_order(kv[1]))):
            words = ([f"pass {g['pass'].iloc[0]}"] if PASS_TAG in g else []) + [w for w in [shape_words(g)] if w]
            frames.append((p, g.assign(config=g["config"].astype(str) + "".join(f", {w}" for w in words))))
    return frames


def _shape_order(g) -> tuple:
    """A frame's place among one pass's: prefill, then fewer queries first, a ragged batch after the
    uniform ones of its query count, fewer key/value heads first."""
    if SHAPE_TAG not in g:
        return ()
    r = g.iloc[0]
    return (str(g[SHAPE_TAG].iloc[0]) != "prefill", int(r["Tq"]), str(g[SHAPE_TAG].iloc[0]).endswith("ragged"),
            int(r["H_kv"]))


def _generated(frames, body: list[str]) -> str:
    paths = dict.fromkeys(str(p) for p, _ in frames)  # a CSV with backward rows: a frame per pass
    lines = [f"<!-- generated by `attnbench readme {' '.join(paths)}`: edit the CSVs, not this -->",
             ""] + body
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def _tables(frames, base) -> str:
    lines = []
    for p, df in frames:
        config = ", ".join(_uniq(df, "config")) or "results"
        lines += _section(df, f"{config}: `{Path(p).as_posix()}`", p, base)
    return _generated(frames, lines)


def render(csv_paths: list[str], base=".") -> str:
    """The full tables of the given CSVs (a section each, in the order given); figure links are
    relative to the folder ``base`` of the file they go into."""
    return _tables(_load(csv_paths), base)


def render_headline(csv_paths: list[str], base=".") -> str:
    """The headline tables and figures of the given CSVs, links relative to ``base``."""
    return _headline(_load(csv_paths), base)


PARTS = ((HEAD_START, HEAD_END, _headline), (START, END, _tables))


def splice(text: str, summary: str, where: str = "README", start: str = START, end: str = END) -> str:
    """``text`` with the part between the markers replaced by ``summary``."""
    s, e = text.find(start), text.find(end)
    if s < 0 or e < 0 or e < s:
        raise BadInput(f"{where} lacks the markers {start} and {end} (start before end): add them "
                       f"where the generated part belongs")
    return text[:s + len(start)] + "\n" + summary + text[e:]


def _filled(path: Path, frames) -> tuple[str, str]:
    """A file's text, and its text with every generated part whose markers it holds filled in."""
    text = read_text(path, "README")
    parts = [(s, e, make) for s, e, make in PARTS if s in text or e in text]
    if not parts:
        raise BadInput(f"{path} holds no attnbench markers: add {HEAD_START} and {HEAD_END} where the headline "
                       f"belongs, or {START} and {END} where the full tables belong")
    new = text
    for s, e, make in parts:
        new = splice(new, make(frames, path.parent), str(path), s, e)
    return text, new


def update_files(paths, csv_paths: list[str], check: bool = False) -> list[Path]:
    """Rewrite (or with ``check``, only compare) the generated parts of each file (headline, full
    tables: those whose markers it holds); the files that were or are stale. Every file is read and
    rendered before any is written, so a refused one leaves all as they were."""
    frames = _load(csv_paths)
    plans = [(Path(p), *_filled(Path(p), frames)) for p in paths]
    stale = [(p, new) for p, old, new in plans if new != old]
    if not check:
        for p, new in stale:
            write_atomically(p, lambda f, new=new: f.write(new), what="README")
    return [p for p, _ in stale]


def update_readme(readme_path, csv_paths: list[str], check: bool = False) -> bool:
    """``update_files`` for one file: True when it was or is stale."""
    return bool(update_files([readme_path], csv_paths, check))
