"""Where a kernel's warps wait, from Nsight Compute's SASS with per-instruction counters.

    python scripts/sass_stalls.py PROFILE.sass.csv [--kernel NAME] [--top N]

reads the CSV that `ncu -i REPORT --page source --print-source sass --csv` writes (scripts/gpu_check.sh's profile
step leaves it as profile_N.sass.csv and this summary beside it as profile_N.stalls.txt): one block per kernel
launch, each opened by a "Kernel Name" line, then a header and a row per SASS instruction. For each launch that
holds warp-stall samples it prints:
- the stall reasons' shares of the samples (the stall_X columns; the "(Not Issued)" columns are a part of those and
  are left out);
- the shares by opcode (the predicate and modifiers after the first dot kept, e.g. WARPGROUP.DEPBAR.LE);
- the waits on shared-memory barriers, by the address operand of each SYNCS...TRYWAIT, with the samples of the
  branch right after it that spins on its predicate;
- the shares before, in and after the hot loop: the stretch of SASS (in address order) from the first to the last
  instruction run at least half as often as the most-run one (the CSV's "Instructions Executed"; a kernel's main
  loop over its tiles), so that the fixed cost of a short launch (its start, its merge) shows beside its loop;
- the `top` instructions that hold the most samples, with their main reasons.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import re
import sys
from pathlib import Path

SAMPLES = "Warp Stall Sampling (All Samples)"
SOURCE = "Source"


def read(path: str) -> list[tuple[str, list[dict]]]:
    """(kernel name, rows as dicts) per launch block of the CSV, in file order."""
    text = Path(path).read_text(encoding="utf-8")
    out = []
    for part in text.split('"Kernel Name"')[1:]:
        lines = part.splitlines()
        name = next(csv.reader([lines[0].lstrip(",")]))[0]
        table = list(csv.reader(io.StringIO("\n".join(lines[1:]))))
        if not table:
            continue
        hdr = table[0]
        rows = [dict(zip(hdr, r)) for r in table[1:] if len(r) == len(hdr)]
        out.append((name, rows))
    return out


def _num(x: str | None) -> float:
    try:
        return float(x or 0)
    except ValueError:
        return 0.0


def _opcode(src: str) -> str:
    s = re.sub(r"^@!?U?P\w+\s+", "", src.strip())
    return s.split()[0] if s else ""


def reasons(rows: list[dict]) -> dict[str, float]:
    """Samples per stall reason (stall_X without "(Not Issued)"), largest first."""
    agg: collections.Counter = collections.Counter()
    for r in rows:
        for k, v in r.items():
            if k.startswith("stall_") and "Not Issued" not in k:
                agg[k[len("stall_"):]] += _num(v)
    return {k: v for k, v in agg.most_common() if v > 0}


def opcodes(rows: list[dict]) -> dict[str, float]:
    agg: collections.Counter = collections.Counter()
    for r in rows:
        agg[_opcode(r.get(SOURCE, ""))] += _num(r.get(SAMPLES))
    return {k: v for k, v in agg.most_common() if v > 0}


def barrier_waits(rows: list[dict]) -> dict[str, float]:
    """Samples of each SYNCS...TRYWAIT and of the branch after it on its predicate, by the wait's address operand."""
    agg: collections.Counter = collections.Counter()
    for i, r in enumerate(rows):
        src = r.get(SOURCE, "")
        if "TRYWAIT" not in src:
            continue
        m = re.search(r"TRYWAIT\s+(U?P\d+),\s*(\[[^\]]*\])", src)
        if not m:
            continue
        pred, addr = m.groups()
        agg[addr] += _num(r.get(SAMPLES))
        if i + 1 < len(rows):
            nxt = rows[i + 1].get(SOURCE, "").strip()
            if re.match(rf"@!?{pred}\s+BRA\b", nxt):
                agg[addr] += _num(rows[i + 1].get(SAMPLES))
    return {k: v for k, v in agg.most_common() if v > 0}


EXECUTED = "Instructions Executed"


def regions(rows: list[dict]) -> tuple[dict[str, float], tuple[int, int, float]] | None:
    """Samples before, in and after the hot loop ({"before": .., "loop": .., "after": ..}) and the loop's span (its
    first and last instruction's index in ``rows`` and how many times the most-run instruction ran over the
    launch's first instruction); None where the CSV gives no execution counts."""
    ex = [_num(r.get(EXECUTED)) for r in rows]
    top = max(ex, default=0)
    if top <= 0:
        return None
    hot = [i for i, e in enumerate(ex) if e >= top / 2]
    a, b = hot[0], hot[-1]
    part = lambda rs: sum(_num(r.get(SAMPLES)) for r in rs)  # noqa: E731
    shares = {"before": part(rows[:a]), "loop": part(rows[a:b + 1]), "after": part(rows[b + 1:])}
    return shares, (a, b, top / ex[0] if ex[0] > 0 else float("nan"))


def summary(name: str, rows: list[dict], top: int = 12) -> str | None:
    """The text for one launch; None where it holds no samples."""
    total = sum(_num(r.get(SAMPLES)) for r in rows)
    if total <= 0:
        return None
    pct = lambda v: f"{100 * v / total:5.1f}%"  # noqa: E731
    out = [f"{name}: {int(total)} warp-stall samples", "  stall reasons:"]
    out += [f"    {k:24s} {pct(v)}" for k, v in reasons(rows).items()]
    out.append("  by opcode:")
    out += [f"    {k:36s} {pct(v)}" for k, v in list(opcodes(rows).items())[:top]]
    waits = barrier_waits(rows)
    if waits:
        out.append("  shared-memory barrier waits (TRYWAIT and its spin), by address:")
        out += [f"    {k:36s} {pct(v)}" for k, v in waits.items()]
    reg = regions(rows)
    if reg:
        shares, (a, b, times) = reg
        out.append(f"  by region (the hot loop: instructions {a} to {b} of {len(rows)}, the most-run {times:.1f}x the "
                   "first's count):")
        out += [f"    {k:36s} {pct(v)}" for k, v in shares.items()]
    out.append(f"  the {top} instructions with the most samples:")
    for r in sorted(rows, key=lambda r: -_num(r.get(SAMPLES)))[:top]:
        why = sorted(((k[len("stall_"):], _num(v)) for k, v in r.items()
                      if k.startswith("stall_") and "Not Issued" not in k and _num(v) > 0), key=lambda x: -x[1])[:2]
        out.append(f"    {pct(_num(r.get(SAMPLES)))}  {r.get(SOURCE, '').strip()[:80]}  ("
                   + ", ".join(f"{k} {100 * v / _num(r.get(SAMPLES)):.0f}%" for k, v in why) + ")")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", help="only the launches of this kernel")
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    texts = [summary(n, rows, a.top) for n, rows in read(a.csv) if not a.kernel or n == a.kernel]
    texts = [t for t in texts if t]
    if not texts:
        print(f"{a.csv}: no launch with warp-stall samples" + (f" named {a.kernel}" if a.kernel else ""),
              file=sys.stderr)
        return 1
    print("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
