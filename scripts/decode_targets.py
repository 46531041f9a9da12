"""The serving targets (the decode configuration's) counted over a decode CSV: a host count, no GPU.

    python scripts/decode_targets.py results/decode-h200.csv [--impl fast-decode] [--csv-out out.csv]

The CSVs are read as one. A case is a row's pattern, B, Tq, T (the cache), cache lengths, heads, D and dtype. For each
case, "ours" is the fastest row of the ``--impl`` implementations (give it more than once: a prefill kernel may serve
a small Tq), and the peers are that case's rows in the same CSV:
- dense at T >= 32768: ``vs_sdpa``, the best SDPA backend's time over ours (target: at least 1), and ``share``, the
  bytes floor at the bandwidth the run measured (``floor_ms``) over our time (target: at least 0.9);
- every other pattern: ``vs_flex``, Flex's time over ours (target: at least 5), and ``over_floor``, our time over
  max(floor, 10 us) (target: at most 1.5); ``flex_target_below_floor``: Flex's time / 5 is below max(floor, 10 us),
  a target that no kernel can reach;
- streaming at T = 1048576: ``flat``, its time over the same case's at T = 4096 (target: at most 1.1).
Then one line per target and Tq: how many cases meet it, of how many that have the rows it needs.

With ``--read FLOOR.csv`` (``attnbench floor``'s rows from the same GPU), ``read_ms`` is what the timing protocol
measures for one launch that reads the case's bytes (``bytes_floor``) and does nothing else: interpolated in bytes
between an empty launch and the reads the file holds (4 and 32 MiB, and 128 MiB and 1 GiB in files written since they
were added; at each size the faster of the plain read and the read under L2's evict-first policy where the file has
both), and past the longest the rest at the bandwidth the row's own floor takes (the fastest a longer read could
go, so no case is counted below a read it could beat). For the sparse targets, ``floor_target_below_read`` and
``flex_target_below_read`` say where the time a target asks is below that read; for dense at T >= 32768,
``share_target_below_read`` says where 90% of the bandwidth asks for less time than that read. The summary counts
such misses (``misses_below_read``).

Where the rows carry ``git_commit``, ``flex_same_commit`` and ``sdpa_same_commit`` say whether the peer's row (the
fastest of its backends for SDPA) was run at our row's commit, and the summary counts the ratios taken across commits
(``peer_other_commit``): rows of one process share a commit, so such a ratio crosses processes (the converse need not
hold: one commit may have run in two).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from attnbench.devtools import read_time  # noqa: F401 - this script's --read (tests call it here too)

FLOOR_MIN_MS = 0.010  # the 10 us below which a decode's floor does not go
SHARE = 0.9  # dense: the share of the measured bandwidth asked
CASE = ["pattern", "label", "B", "Tq", "T", "cache_lens", "H", "H_kv", "D", "dtype"]
SDPA = ("sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math")
FLAT_FROM, FLAT_AT = 4096, 1048576


def table(rows: pd.DataFrame, impls=("fast-decode",), read=None) -> pd.DataFrame:
    """One row per case that ``impls`` ran (status ok), with the targets' columns (NaN where a peer's row is
    missing or the target does not apply); with ``read`` (``read_time``'s function) the one-launch read of each
    case's bytes and, for the sparse targets, whether the time each asks lies below it."""
    ok = rows[rows.status == "ok"].copy()
    ok["cache_lens"] = ok["cache_lens"].map(lambda v: "" if pd.isna(v) else str(v))  # ragged batches' lengths
    ours = ok[ok.impl.isin(impls)]
    if ours.empty:
        raise ValueError(f"no rows with status ok of {', '.join(impls)}")
    best = ours.loc[ours.groupby(CASE, dropna=False).median_ms.idxmin()].set_index(CASE)
    t = best[["impl", "median_ms", "floor_ms"] + (["bytes_floor"] if read is not None else [])].copy()

    def peer(names) -> pd.Series:
        rows_ = ok[ok.impl.isin(names)]
        return rows_.groupby(CASE, dropna=False).median_ms.min().reindex(t.index)

    def same_commit(names) -> pd.Series:
        """1 where the fastest of ``names``' rows of a case was run at our row's commit, 0 where not, NaN without one."""
        rows_ = ok[ok.impl.isin(names)]
        if rows_.empty:
            return pd.Series(np.nan, index=t.index)
        theirs = rows_.loc[rows_.groupby(CASE, dropna=False).median_ms.idxmin()].set_index(CASE).git_commit
        theirs = theirs.reindex(t.index)
        return pd.Series(np.where(theirs.isna(), np.nan, (theirs == best.git_commit).astype(float)), index=t.index)

    dense = t.index.get_level_values("pattern") == "dense"
    T = t.index.get_level_values("T")
    t["vs_sdpa"] = np.where(dense & (T >= 32768), peer(SDPA) / t.median_ms, np.nan)
    t["share"] = np.where(dense & (T >= 32768), t.floor_ms / t.median_ms, np.nan)
    limit = np.maximum(t.floor_ms, FLOOR_MIN_MS)
    flex = peer(("flex",))
    t["vs_flex"] = np.where(~dense, flex / t.median_ms, np.nan)
    t["over_floor"] = np.where(~dense, t.median_ms / limit, np.nan)
    t["flex_target_below_floor"] = np.where(~dense & flex.notna(), flex / 5 < limit, np.nan)
    if "git_commit" in ok:
        t["flex_same_commit"] = np.where(~dense & flex.notna(), same_commit(("flex",)), np.nan)
        t["sdpa_same_commit"] = np.where(t.vs_sdpa.notna(), same_commit(SDPA), np.nan)
    if read is not None:
        t["read_ms"] = read(t.bytes_floor, t.floor_ms / t.bytes_floor)
        t["floor_target_below_read"] = np.where(~dense, 1.5 * limit < t.read_ms, np.nan)
        t["flex_target_below_read"] = np.where(~dense & flex.notna(), flex / 5 < t.read_ms, np.nan)
        t["share_target_below_read"] = np.where(dense & (T >= 32768), t.floor_ms / SHARE < t.read_ms, np.nan)
    t = t.reset_index()
    base = t[t["T"] == FLAT_FROM].set_index([c for c in CASE if c != "T"]).median_ms
    at = t["T"] == FLAT_AT
    key = pd.MultiIndex.from_frame(t[[c for c in CASE if c != "T"]])
    t["flat"] = np.where(at & (t.pattern == "streaming"), t.median_ms / base.reindex(key).to_numpy(), np.nan)
    return t


# (name, column, test): the targets the summary counts
TARGETS = [
    ("dense: at least SDPA's best backend (T >= 32768)", "vs_sdpa", lambda x: x >= 1),
    ("dense: at least 90% of the measured bandwidth (T >= 32768)", "share", lambda x: x >= SHARE),
    ("sparse: at least 5x Flex", "vs_flex", lambda x: x >= 5),
    ("sparse: within 1.5x of max(floor, 10 us)", "over_floor", lambda x: x <= 1.5),
    ("streaming at T=1048576 within 10% of T=4096", "flat", lambda x: x <= 1.1),
]


def summary(t: pd.DataFrame) -> pd.DataFrame:
    """Per target and Tq: cases that meet it, cases with the rows it needs, (5x Flex) the misses whose Flex / 5
    lies below max(floor, 10 us), (against a peer, where the rows carry commits) the ratios whose peer row was run at
    another commit, and (the sparse targets and dense's share of the bandwidth, where the table has
    ``read_ms``) the misses whose target lies below one launch's read of the case's bytes."""
    out = []
    for name, col, test in TARGETS:
        for tq, g in t.groupby("Tq"):
            x = g[g[col].notna()]
            if x.empty:
                continue
            met = test(x[col])
            row = dict(target=name, Tq=int(tq), met=int(met.sum()), of=len(x))
            if col == "vs_flex":
                row["misses_below_floor"] = int((~met & (x.flex_target_below_floor == 1)).sum())
            same = {"vs_flex": "flex_same_commit", "vs_sdpa": "sdpa_same_commit"}.get(col)
            if same in x:
                row["peer_other_commit"] = int((x[same] == 0).sum())
            below = {"vs_flex": "flex_target_below_read", "over_floor": "floor_target_below_read",
                     "share": "share_target_below_read"}.get(col)
            if below in x:
                row["misses_below_read"] = int((~met & (x[below] == 1)).sum())
            out.append(row)
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--impl", action="append", help="ours (default fast-decode); more than once: the fastest")
    ap.add_argument("--csv-out", dest="out")
    ap.add_argument("--read", metavar="FLOOR_CSV", help="attnbench floor's CSV from the same GPU: the one-launch reads")
    a = ap.parse_args(argv)
    from attnbench.patterns import BadInput
    from attnbench.results import read_results

    try:
        rows = pd.concat([read_results(f) for f in a.csv], ignore_index=True)
        read = None
        if a.read:
            try:
                read = read_time(pd.read_csv(a.read))
            except (OSError, ValueError, pd.errors.ParserError) as e:
                print(f"decode_targets: --read {a.read}: {e}", file=sys.stderr)
                return 1
        t = table(rows, tuple(a.impl or ("fast-decode",)), read)
    except BadInput as e:  # (it names the file)
        print(f"decode_targets: {e}", file=sys.stderr)
        return 1
    except ValueError as e:
        print(f"decode_targets: {e} in {', '.join(a.csv)}", file=sys.stderr)
        return 1
    if a.out:
        t.to_csv(a.out, index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.max_rows", 500):
        shown = t.drop(columns=["pattern", "H", "D", "dtype"]).assign(label=t.label.str.slice(0, 30),
                                                                   cache_lens=t.cache_lens.str.slice(0, 12))
        print(shown.round(4).to_string(index=False))
        print()
        print(summary(t).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
