"""The README's summary tables, generated from results CSVs.

The text between ``<!-- attnbench:summary:start -->`` and ``<!-- attnbench:summary:end -->``
is replaced by a section per CSV: the GPU, date, commit and command, then per (dtype, D, B, H)
group and per implementation a table per pattern instance with T, dense ms, pattern ms,
speedup, relative error, roofline share and the best peer. The output depends on the CSVs
only (no clock, sorted everywhere), so running it twice changes nothing.
"""
from __future__ import annotations

import math
from pathlib import Path

from .patterns import PATTERNS, BadInput
from .results import read_results
from .safefile import read_text, write_atomically

START = "<!-- attnbench:summary:start -->"
END = "<!-- attnbench:summary:end -->"
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


def _table(lines: list[str], header: list[str], rows: list[list[str]]) -> None:
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join(["---:"] * (len(header) - 1) + [":---"]) + "|")
    for r in rows:
        lines.append("| " + " | ".join(r) + " |")
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


def _section(df, title: str) -> list[str]:
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
    for (dtype, D, B, H), g in sorted(shown.groupby(["dtype", "D", "B", "H"]), key=lambda kv: tuple(map(str, kv[0]))):
        untimed = []
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


def render(csv_paths: list[str]) -> str:
    """The markdown summary of the given CSVs (a section each, in the order given)."""
    lines = [f"<!-- generated by `attnbench readme {' '.join(map(str, csv_paths))}`: edit the CSVs, not this -->", ""]
    for p in csv_paths:
        df = read_results(p)
        config = ", ".join(_uniq(df, "config")) or "results"
        lines += _section(df, f"{config}: `{Path(p).as_posix()}`")
    while lines and lines[-1] == "":
        lines.pop()
    return "\n".join(lines) + "\n"


def splice(text: str, summary: str, where: str = "README") -> str:
    """``text`` with the part between the markers replaced by ``summary``."""
    s, e = text.find(START), text.find(END)
    if s < 0 or e < 0 or e < s:
        raise BadInput(f"{where} lacks the summary markers {START} and {END} (start before end): add them "
                       f"where the tables belong")
    return text[:s + len(START)] + "\n" + summary + text[e:]


def update_readme(readme_path, csv_paths: list[str], check: bool = False) -> bool:
    """Rewrite (or with ``check``, only compare) the summary; True when it was or is stale."""
    path = Path(readme_path)
    text = read_text(path, "README")
    new = splice(text, render(csv_paths), str(path))
    if new == text:
        return False
    if not check:
        write_atomically(path, lambda f: f.write(new), what="README")
    return True
