"""What each training row would take at fast-tc's own dense rate: the tiles its lists visit, each run as fast
as a dense causal tile runs. A host count over a training CSV (no GPU).

    python scripts/dense_rate_bound.py results/train-32768-h200.csv [--impl fast-tc] [--csv-out out.csv]
    python scripts/dense_rate_bound.py results/train-32768-h200.csv results/classes-32768-h200.csv \
        --impl fast-tc-classes    # the class-major layout's lists, against fast-tc's dense rows

The CSVs are read as one. For every (instance, D) of ``--impl`` with fwd, bwd and fwd+bwd rows at one T:
- ``visited_fwd`` / ``visited_bwd``: the pairs the forward's list (the shape its rows ran, ``tile_config`` in
  ``setup_s``; else the wgmma shape fast-tc chooses now) and the backward's
  (64-row query tiles, the main loop's key tile) visit, over the live pairs, on the layout the implementation takes
  (the class-major one where ``takes_classes``);
- ``fwd_at_dense`` / ``bwd_at_dense``: fast-tc's dense causal row's time scaled by visited pairs, the instance's against
  dense's at the same D; ``eff_fwd`` / ``eff_bwd``: that over the measured time (1: as fast per visited tile as
  dense);
- ``target``: the training target's fwd+bwd time, Flex / 3, or 2x the fwd+bwd floor where Flex / 3 would pass the
  floor (dense causal: SDPA flash / 1.3);
- ``need``: measured fwd+bwd over the target; ``bound_over_target``: the dense-rate fwd+bwd over it (above 1: the
  target asks more than dense's rate per visited tile);
- ``fwd_target``, ``fwd_need``, ``fwd_bound_over_target``: the same for the forward bar, 2x Flex, or 80% of the
  forward's floor where 2x Flex would pass it (SDPA cuDNN on dense). A CSV of forward rows alone (the llm
  configuration, ``--T`` to take one size) gives these and leaves the backward's columns empty.
- with ``--read FLOOR.csv`` (``attnbench floor``'s rows from the same GPU): ``fwd_read`` and ``fwd_bwd_read``, what the
  timing protocol measures for one launch that reads the pass's bytes (``bytes_floor``) and does nothing else
  (``attnbench.devtools.read_time``, as scripts/decode_targets.py takes it), and ``fwd_target_below_read``,
  ``target_below_read`` where the target asks less time than that; the summary counts such misses;
- ``need_capped``, ``fwd_need_capped``: the same against the floor clause read as a cap, max(Flex / 3, 2x the floor)
  and max(Flex / 2, the floor / 0.8): the targets above ask 3x Flex wherever it lies beyond the floor, which is up to
  100% of the floor where Flex / 3 falls just beyond it, and only 50% where it falls just short.
Then the targets counted (``summary``): the sparse instances that meet the fwd+bwd and the forward targets, and per
D dense causal's fwd+bwd against SDPA flash and cuDNN, its bwd / fwd, and its forward against cuDNN.
"""
from __future__ import annotations

import argparse
import sys

import pandas as pd


def visited(mask, BM: int, BN: int) -> int:
    """Pairs a BM x BN list of ``mask`` visits (every residue class of a strided one)."""
    from attnbench.tiles import tile_list

    stride, inner = mask.strided()
    return tile_list(inner, BM, BN).n_visited * BM * BN * stride


def ran_tile(rows: pd.DataFrame) -> tuple[int, int] | None:
    """(BM, BN) of the forward shape these rows ran, from the first ``tile_config`` in their ``setup_s``."""
    import json

    from attnbench.fwd_config import TileConfig, parse_tile_config

    for text in rows.get("setup_s", pd.Series(dtype=object)).dropna():
        spec = json.loads(text).get("tile_config") if str(text).startswith("{") else None
        if spec:
            cfg = TileConfig(**dict(parse_tile_config(spec).given))  # a whole shape, every field named
            return cfg.BM, cfg.BN
    return None


def bwd_tile(mask, D: int) -> tuple[int, int]:
    """(query rows, keys) of the wgmma backward's main-loop tile for ``mask``."""
    from attnbench.bwd_config import bwd_config, choose_dq

    kpq = mask.pairs / mask.T
    cfg = bwd_config(D, True, kpq, choose_dq(D, kpq, True))
    return 64, 64 * max(1, cfg.NWARPS // 4)


def table(rows: pd.DataFrame, impl: str = "fast-tc", rate_impl: str = "fast-tc", T: int | None = None,
          read=None) -> pd.DataFrame:
    from attnbench.fwd_config import choose_config
    from attnbench.impls import get_impl
    from attnbench.patterns import make_mask
    from attnbench.results import params_from_json

    ok = rows[rows.status == "ok"]
    if T is not None:
        ok = ok[ok["T"] == T]
    Ts = sorted(int(t) for t in ok[ok.impl == impl]["T"].unique())
    if not Ts:
        raise SystemExit(f"no ok row of {impl} in the CSV{f' at T={T}' if T is not None else ''}")
    if len(Ts) != 1:
        raise SystemExit(f"one T expected among {impl}'s rows, found {Ts}: take one with --T")
    T = int(Ts[0])
    ms = ok.groupby(["label", "D", "pass", "impl"]).median_ms.min()
    floor = ok[ok.impl == impl].groupby(["label", "D", "pass"]).floor_ms.min()
    nbytes = ok[ok.impl == impl].groupby(["label", "D", "pass"]).bytes_floor.min()
    ms_a_byte = 1e3 / (ok[ok.impl == impl].peak_tbps.max() * 1e12)  # past the floor file's longest read
    out = []
    dense_rows = ok[(ok.impl == rate_impl) & (ok.pattern == "dense") & (ok["T"] == T)]
    for (label, D), g in pd.concat([ok[ok.impl == impl], dense_rows]).groupby(["label", "D"]):
        r = g.iloc[0]
        mask = make_mask(r.pattern, T, bool(r.causal), **params_from_json(r.pattern, r.params))
        if get_impl(impl.split("[")[0]).takes_classes(mask):
            mask = mask.class_major()[1]  # it runs the class-major layout: its lists are the banded mask's
        cfg = choose_config(mask, int(D), True)
        BM, BN = ran_tile(g) or (cfg.BM, cfg.BN)
        out.append(dict(label=label, D=int(D), mask=mask, vf=visited(mask, BM, BN),
                        vb=visited(mask, *bwd_tile(mask, int(D)))))
    t = pd.DataFrame(out)
    res = []
    for _, x in t.iterrows():
        if x.label == "dense" and impl != rate_impl:
            continue
        dense = t[(t.label == "dense") & (t.D == x.D)]
        if dense.empty:
            raise SystemExit(f"no dense row of {rate_impl} at D={x.D}: the rate to scale by is missing")
        dn = dense.iloc[0]
        get = lambda lab, p, who=impl: ms.get((lab, x.D, p, who), float("nan"))  # noqa: E731
        tf = get("dense", "fwd", rate_impl) * x.vf / dn.vf
        tb = get("dense", "bwd", rate_impl) * x.vb / dn.vb
        fl = floor.get((x.label, x.D, "fwd+bwd"), float("nan"))
        flex = get(x.label, "fwd+bwd", "flex")
        if x.label == "dense":  # dense causal: 1.3x SDPA's flash backend
            target = get(x.label, "fwd+bwd", "sdpa-flash") / 1.3
        else:
            target = flex / 3 if flex / 3 >= fl else 2 * fl
        fb = get(x.label, "fwd+bwd")
        # the forward bar: 2x Flex, or 80% of the forward's floor where 2x Flex would pass it; cuDNN on dense
        fl_f, flex_f = floor.get((x.label, x.D, "fwd"), float("nan")), get(x.label, "fwd", "flex")
        if x.label == "dense":
            fwd_target = get(x.label, "fwd", "sdpa-cudnn")
        else:
            fwd_target = flex_f / 2 if flex_f / 2 >= fl_f else fl_f / 0.8
        # the floor clause read as a cap: never more than 50% (80%) of the floor asked, however fast Flex is
        capped, fwd_capped = ((target, fwd_target) if x.label == "dense" else
                              (max(flex / 3, 2 * fl), max(flex_f / 2, fl_f / 0.8)))
        res.append(dict(instance=x.label, D=x.D, visited_fwd=x.vf / x["mask"].pairs, visited_bwd=x.vb / x["mask"].pairs,
                        fwd=get(x.label, "fwd"), fwd_at_dense=tf, eff_fwd=tf / get(x.label, "fwd"),
                        bwd=get(x.label, "bwd"), bwd_at_dense=tb, eff_bwd=tb / get(x.label, "bwd"),
                        fwd_bwd=fb, flex_fwd_bwd=flex, floor_fwd_bwd=fl, target=target, need=fb / target,
                        bound_over_target=(tf + tb) / target, fwd_target=fwd_target,
                        fwd_need=get(x.label, "fwd") / fwd_target, fwd_bound_over_target=tf / fwd_target,
                        need_capped=fb / capped, fwd_need_capped=get(x.label, "fwd") / fwd_capped))
        if read is not None:  # one launch that reads the pass's bytes and does nothing else, under the protocol
            fb_read = float(read(nbytes.get((x.label, x.D, "fwd+bwd"), float("nan")), ms_a_byte))
            fwd_read = float(read(nbytes.get((x.label, x.D, "fwd"), float("nan")), ms_a_byte))
            res[-1].update(fwd_bwd_read=fb_read, target_below_read=target < fb_read, fwd_read=fwd_read,
                           fwd_target_below_read=fwd_target < fwd_read)
    return pd.DataFrame(res)


def summary(t: pd.DataFrame, rows: pd.DataFrame, impl: str = "fast-tc") -> list[str]:
    """The targets counted over ``table``'s rows ``t`` (from ``rows``, the same CSV): lines to print."""
    ok = rows[(rows.status == "ok") & rows["T"].isin(rows[rows.impl == impl]["T"].unique())]
    sparse = t[t.instance != "dense"]
    lines = []
    for col, what, cap in (("need", "fwd+bwd at 3x Flex (or 50% of its floor)", "max(Flex / 3, 2x floor)"),
                           ("fwd_need", "fwd at 2x Flex (or 80% of its floor)", "max(Flex / 2, floor / 0.8)")):
        x = sparse[sparse[col].notna()]
        if not x.empty:
            met = int((x[f"{col}_capped"] <= 1).sum())
            lines.append(f"sparse {what}: {int((x[col] <= 1).sum())} of {len(x)} met "
                         f"({met} with the floor clause as a cap, {cap})")
            below = {"need": "target_below_read", "fwd_need": "fwd_target_below_read"}[col]
            if below in x:
                miss = x[x[col] > 1]
                lines.append(f"  of its {len(miss)} misses, {int(miss[below].astype(bool).sum())} ask less time than "
                             "one launch that reads the pass's bytes")
    dense = ok[ok.pattern == "dense"].groupby(["D", "pass", "impl"]).median_ms.min()
    for D in sorted(t[t.instance == "dense"].D.unique()):
        d = lambda p, who=impl: dense.get((D, p, who), float("nan"))  # noqa: E731
        parts = [f"fwd vs cuDNN {d('fwd', 'sdpa-cudnn') / d('fwd'):.3f}x"]
        if d("fwd+bwd") == d("fwd+bwd"):  # not NaN: training rows
            parts += [f"fwd+bwd vs SDPA flash {d('fwd+bwd', 'sdpa-flash') / d('fwd+bwd'):.3f}x (target 1.3)",
                      f"vs cuDNN {d('fwd+bwd', 'sdpa-cudnn') / d('fwd+bwd'):.3f}x",
                      f"bwd / fwd {d('bwd') / d('fwd'):.2f} (target 2.5)"]
        lines.append(f"dense causal D={D}: " + ", ".join(parts))
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--impl", default="fast-tc")
    ap.add_argument("--rate-impl", default="fast-tc", help="whose dense rows give the rate")
    ap.add_argument("--T", type=int, help="the rows of one T (a CSV of several)")
    ap.add_argument("--csv-out", dest="out")
    ap.add_argument("--read", metavar="FLOOR_CSV",
                    help="attnbench floor's CSV from the same GPU: the one-launch reads (fwd_read, fwd_bwd_read)")
    a = ap.parse_args(argv)
    from attnbench.patterns import BadInput
    from attnbench.results import read_results

    try:
        rows = pd.concat([read_results(f) for f in a.csv], ignore_index=True)
    except BadInput as e:
        print(f"dense_rate_bound: {e}", file=sys.stderr)
        return 1
    read = None
    if a.read:
        from attnbench.devtools import read_time

        try:
            read = read_time(pd.read_csv(a.read))
        except (OSError, ValueError) as e:
            print(f"dense_rate_bound: --read {a.read}: {e}", file=sys.stderr)
            return 1
    t = table(rows, a.impl, a.rate_impl, a.T, read)
    if a.out:
        t.to_csv(a.out, index=False)
    with pd.option_context("display.width", 250, "display.max_columns", 30):
        t = t.assign(instance=t.instance.str.slice(0, 34))
        print(t.round(3).to_string(index=False))
    print()
    print("\n".join(summary(t, rows if a.T is None else rows[rows["T"] == a.T], a.impl)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
