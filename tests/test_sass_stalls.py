"""scripts/sass_stalls.py on a small CSV in the layout of `ncu --page source --print-source sass --csv` (no GPU)."""
import subprocess
import sys

from scriptmod import ROOT, script

STALLS = ["barrier", "long_sb", "short_sb", "wait"]
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples"] + [f"stall_{s}" for s in STALLS] + [f"stall_{s} (Not Issued)" for s in STALLS]


def _row(addr, src, **stalls):
    total = sum(stalls.values())
    # the "(Not Issued)" columns are a part of their reason's samples: here all of them, which must not count twice
    return [addr, src, str(total), str(total), str(total)] + [str(stalls.get(s, 0)) for s in STALLS] * 2


def _csv(tmp_path):
    def block(name, rows):
        lines = [f'"Kernel Name","{name}",', ",".join(f'"{h}"' for h in HEADER)]
        lines += [",".join(f'"{c}"' for c in r) for r in rows]
        return "\n".join(lines)

    quiet = block("prep", [_row("0x10", "LOP3.LUT R0, R4, 0xffff0000, RZ, 0xc0, !PT")])
    main = block("main", [
        _row("0x20", "HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT, gsb0", wait=10),
        _row("0x30", "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R11+UR13+0x38800], R22", barrier=5),
        _row("0x40", "@!P1  BRA 0x7fe6c77ba1e0", long_sb=15),
        _row("0x50", "FFMA R184, R184, UR28, -R19", short_sb=12),
        _row("0x60", "FFMA R185, R185, UR28, -R19", short_sb=8),
    ])
    p = tmp_path / "profile_1.sass.csv"
    p.write_text(quiet + "\n" + main + "\n")
    return p


def test_it_sums_where_each_launch_waits(tmp_path):
    mod = script("sass_stalls")
    launches = mod.read(str(_csv(tmp_path)))
    assert [n for n, _ in launches] == ["prep", "main"]
    rows = dict(launches)["main"]
    assert mod.reasons(rows) == {"short_sb": 20, "long_sb": 15, "wait": 10, "barrier": 5}
    assert mod.opcodes(rows) == {"FFMA": 20, "BRA": 15, "HGMMA.64x64x16.F32.BF16": 10,
                                 "SYNCS.PHASECHK.TRANS64.TRYWAIT": 5}
    # the wait and the branch that spins on its predicate, by the barrier's address
    assert mod.barrier_waits(rows) == {"[R11+UR13+0x38800]": 20}
    text = mod.summary("main", rows, top=2)
    assert text.startswith("main: 50 warp-stall samples") and " 40.0%" in text and "[R11+UR13+0x38800]" in text
    assert mod.summary("prep", dict(launches)["prep"]) is None  # no samples, no summary


def test_the_command_line_prints_the_launches_with_samples_and_fails_without(tmp_path):
    path = _csv(tmp_path)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_stalls.py"), str(path), "--top", "3"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "main: 50 warp-stall samples" in r.stdout and "prep" not in r.stdout, r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "sass_stalls.py"), str(path), "--kernel", "prep"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "no launch with warp-stall samples named prep" in r.stderr


def test_it_splits_the_samples_before_in_and_after_the_hot_loop():
    mod = script("sass_stalls")
    hdr = ["Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    # a prologue run once per warp (8), a loop of nine turns, a merge loop of two turns, a store
    table = [("S2R R0, SR_TID.X", 3, 8), ("LDG.E R2, [R4]", 5, 8), ("DEPBAR.LE SB0, 0x1", 20, 72),
             ("HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ", 7, 72), ("@P0 BRA 0x40", 4, 64),
             ("LDS R6, [R8]", 6, 16), ("FFMA R1, R2, R3, R1", 2, 16), ("STG.E [R4], R1", 3, 8)]
    rows = [dict(zip(hdr, map(str, r))) for r in table]
    shares, (a, b, times) = mod.regions(rows)
    # the loop: from the first to the last instruction run at least half as often as the most-run one; the merge
    # loop's two turns stay after it
    assert (a, b, times) == (2, 4, 9.0)
    assert shares == {"before": 8, "loop": 31, "after": 11}
    text = mod.summary("k", rows)
    assert "the hot loop: instructions 2 to 4 of 8" in text and " 62.0%" in text
    # without execution counts there are no regions, and the summary goes on without them
    bare = [{k: v for k, v in r.items() if k != "Instructions Executed"} for r in rows]
    assert mod.regions(bare) is None and "by region" not in mod.summary("k", bare)
